"""The client's one retry policy and its one HTTP client, as the sync calls, the async
sender and the spool uploader use them."""

from __future__ import annotations

import httpx
import orjson
import pytest

import instantml
from instantml.sdk.http import open_client
from instantml.sdk.ingest import IngestSender
from instantml.sdk.records import CreateRun, Request, from_line
from instantml.sdk.retry import Backoff, Verdict, of_event, of_request


@pytest.mark.parametrize(
    ("status", "body", "scope", "verdict"),
    [
        (200, None, None, Verdict.DONE),
        (400, {"error": "step: must be >= 0"}, None, Verdict.REFUSED),
        (404, None, None, Verdict.REFUSED),
        (413, None, None, Verdict.REFUSED),
        (401, None, None, Verdict.STOP),
        (403, None, None, Verdict.STOP),
        (429, {"scope": "second"}, "second", Verdict.RETRY),
        (429, None, "monthly", Verdict.STOP),
        (429, {"scope": "monthly"}, None, Verdict.STOP),
        (409, {"code": "in_flight"}, None, Verdict.RETRY),
        (409, {"code": "run_conflict"}, None, Verdict.REFUSED),
        (500, None, None, Verdict.RETRY),
        (503, None, None, Verdict.RETRY),
    ],
)
def test_an_answer_means_one_thing_to_every_sender(
    status: int, body: object, scope: str | None, verdict: Verdict
) -> None:
    assert of_request(status, body, scope) is verdict


def test_an_event_inside_a_batch_is_judged_by_its_own_answer() -> None:
    assert of_event(201) is Verdict.DONE
    assert of_event(429, {"scope": "monthly"}) is Verdict.STOP
    assert of_event(409, {"code": "in_flight"}) is Verdict.RETRY
    assert of_event(422, {"error": "x"}) is Verdict.REFUSED
    assert of_event(401) is Verdict.REFUSED  # an event's 401 (its run's project) is its own


def test_backoff_doubles_jittered_up_to_its_cap_and_honours_retry_after() -> None:
    backoff = Backoff(first=0.1, most=2.0)
    waits = [backoff.next() for _ in range(8)]
    centers = [min(0.1 * 2**i, 2.0) for i in range(8)]
    assert all(0.5 * c <= w <= min(1.5 * c, 2.0) for w, c in zip(waits, centers, strict=True))
    assert backoff.delay == 2.0
    backoff.reset()
    assert backoff.delay == 0.1
    assert backoff.next("1.5") >= 1.5  # the server's Retry-After is a floor...
    assert backoff.next("600") == 2.0  # ...held to the cap
    assert backoff.next("soon") <= 0.6  # a malformed one is ignored


def test_every_client_says_who_it_is_and_sends_its_key() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"results": [{"status": 201}]})

    with open_client("http://server", "iml_a_b", transport=httpx.MockTransport(handler)) as c:
        answer = IngestSender(c).post([CreateRun("e-1", {"project": "p", "id": "r"}).encode()])
    assert answer.verdict is Verdict.DONE and answer.results == [{"status": 201}]
    (request,) = seen
    assert request.headers["user-agent"] == f"instantml/{instantml.__version__}"
    assert request.headers["authorization"] == "Bearer iml_a_b"
    assert orjson.loads(request.content) == {
        "events": [
            {
                "event_id": "e-1",
                "request": {"method": "POST", "path": "/runs", "body": {"project": "p", "id": "r"}},
            }
        ]
    }


def test_an_unreachable_server_is_a_retry_named_by_its_address() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with open_client("http://server:1", None, transport=httpx.MockTransport(handler)) as c:
        answer = IngestSender(c).post([b"{}"])
    assert answer.verdict is Verdict.RETRY and answer.status is None
    assert answer.cause == "server unreachable at http://server:1: ConnectError: refused"


def test_a_spooled_line_is_read_back_as_its_record_type() -> None:
    creation = CreateRun("a-1", {"project": "p", "id": "r"})
    point = Request("a-2", "POST", "/runs/r/rank-metrics", {"step": 0})
    assert isinstance(from_line(creation.encode()), CreateRun)
    read = from_line(point.encode())
    assert read is not None and not read.creates_run and read.path == point.path
    assert from_line(b'{"event_id": "a-3", "req') is None  # torn
    assert from_line(b'{"event_id": 3, "request": {"method": "POST", "path": "/runs"}}') is None
