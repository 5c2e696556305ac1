"""The CLI as a user meets it: errors are one line (never a traceback), help names the
environment, and `runs` / `ranks` answer over SSH what the dashboard answers."""

from __future__ import annotations

import argparse
import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from instantml.cli import build_parser
from instantml.server.process import ServerProcess, free_port
from tests.helpers import instantml
from tests.summary.reference import Point
from tests.summary.test_reference import ingest


def cli(*args: str, url: str, key: str | None, home: Path) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "INSTANTML_API_BASE_URL": url, "COLUMNS": "160"}
    return instantml(*args, env=env | ({"INSTANTML_API_KEY": key} if key else {}))


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode != 0, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.fixture
def not_instantml() -> Iterator[str]:
    """Some other web server on loopback (a Jupyter, a TensorBoard...)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "command",
    [("runs",), ("ranks", "some-run"), ("keys", "list"), ("usage",), ("keys", "create")],
)
def test_a_base_url_that_is_not_instantml(
    not_instantml: str, command: tuple[str, ...], tmp_path: Path
) -> None:
    line = one_line_error(cli(*command, url=not_instantml, key="iml_x_y", home=tmp_path))
    assert line.startswith(f"error: {not_instantml} did not answer as an InstantML server")
    assert "INSTANTML_API_BASE_URL" in line


def test_no_server_at_the_address(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = one_line_error(cli("runs", url=url, key="iml_x_y", home=tmp_path))
    assert line.startswith(f"error: cannot reach the server at {url} (ConnectError")


def test_a_limit_that_is_not_a_number(server: ServerProcess, tmp_path: Path) -> None:
    out = cli("usage", "set-limit", "--org", "x", "lots", url=server.url, key="k", home=tmp_path)
    line = one_line_error(out)
    assert out.returncode == 2
    assert "'lots' is not a number of points" in line and "--help" in line


def test_keys_create_says_when_it_created_the_org(server: ServerProcess, tmp_path: Path) -> None:
    org = f"team-{os.urandom(3).hex()}"
    first = cli("keys", "create", "--org", org, url=server.url, key=server.admin_key, home=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[0] == f"Created org {org}."
    again = cli("keys", "create", "--org", org, url=server.url, key=server.admin_key, home=tmp_path)
    assert again.returncode == 0 and "Created org" not in again.stdout
    assert again.stdout.splitlines()[-1].startswith("iml_")  # the key alone on the last line


def test_a_revoked_key_is_called_revoked(server: ServerProcess, tmp_path: Path) -> None:
    made = cli("keys", "create", url=server.url, key=server.admin_key, home=tmp_path)
    key = made.stdout.splitlines()[-1]
    key_id = key.split("_")[1]
    assert cli("runs", url=server.url, key=key, home=tmp_path).returncode == 0
    revoked = cli("keys", "revoke", key_id, url=server.url, key=server.admin_key, home=tmp_path)
    assert revoked.returncode == 0, revoked.stderr
    line = one_line_error(cli("runs", url=server.url, key=key, home=tmp_path))
    assert "401" in line and "API key revoked" in line and "INSTANTML_API_KEY" in line
    wrong = one_line_error(cli("runs", url=server.url, key=key + "x", home=tmp_path))
    assert "invalid API key" in wrong


@pytest.fixture
def lost_node_run(api: httpx.Client) -> str:
    """12 ranks; ranks 4-7 (one node) vanish after step 5, rank 10 after step 8; rank 2
    spikes at every step (12 outlier rows)."""
    writes = [
        Point(s, r, 50.0 if r == 2 else 1.0 + r / 10, 1.0, r % 4, 12)
        for s in range(12)
        for r in range(12)
        if not (4 <= r <= 7 and s > 5) and not (r == 10 and s > 8)
    ]
    run_id = ingest(api, writes, key="train/loss")
    events = [
        {
            "event_id": f"{run_id}-g{s}",
            "request": {
                "method": "POST",
                "path": f"/runs/{run_id}/rank-metrics",
                "body": {"metrics": {"a/grad": 1.0}, "step": s, "rank": 0, "world_size": 12},
            },
        }
        for s in range(3)
    ]
    api.post("/api/ingest", json={"events": events}).raise_for_status()
    return run_id


def test_runs_lists_runs(
    server: ServerProcess, api: httpx.Client, lost_node_run: str, tmp_path: Path
) -> None:
    out = cli("runs", "--project", "summary", url=server.url, key=server.admin_key, home=tmp_path)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == [
        "run",
        "id",
        "project",
        "status",
        "world",
        "size",
        "last",
        "step",
        "points",
        "updated",
    ]
    mine = next(row for row in rows if row.startswith(lost_node_run))
    points = api.get(f"/runs/{lost_node_run}").json()["run"]["points"]
    assert points > 0
    # ingest() ends its runs
    assert mine.split()[1:6] == ["summary", "finished", "12", "11", f"{points:,}"]
    empty = cli("runs", "--project", "nope", url=server.url, key=server.admin_key, home=tmp_path)
    assert empty.stdout.strip() == "No runs in project 'nope'."


def test_ranks_defaults_to_the_loss_and_collapses_missing_ranks(
    server: ServerProcess, lost_node_run: str, tmp_path: Path
) -> None:
    out = cli("ranks", lost_node_run, url=server.url, key=server.admin_key, home=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "key train/loss" in text  # not "a/grad", the first in sorted order
    assert "rank metrics: a/grad, train/loss" in text
    missing = text.split("Missing from the last step")[1].split("Worst ranks")[0]
    rows = [line.split("│")[1:4] for line in missing.splitlines() if "│" in line]
    cells = [[c.strip() for c in row] for row in rows if row and row[0].strip()[:1].isdigit()]
    assert cells == [["4-7", "5", "6"], ["10", "8", "9"]]
    assert "Top outliers (10 of 12)" in text  # the answer's outliers_total


def test_ranks_draws_block_aligned_buckets(
    server: ServerProcess, api: httpx.Client, tmp_path: Path
) -> None:
    # Steps 10-109 in at most 10 sparkline buckets: buckets of 16 steps (the smallest block
    # size of at least 10) from step 0, [0, 15] .. [96, 111]: 7 of them, the mean of each
    # its bucket's number.
    run_id = ingest(
        api, [Point(s, r, float(s // 16), 1.0, r, 2) for s in range(10, 110) for r in range(2)]
    )
    out = cli("ranks", run_id, "--width", "10", url=server.url, key=server.admin_key, home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "steps 10-109  (buckets of 16 steps from step 0)" in out.stdout
    mean = next(line for line in out.stdout.splitlines() if "mean " in line and "->" in line)
    bars = "".join(c for c in mean if c in "▁▂▃▄▅▆▇█")
    assert bars == "▁▂▃▅▆▇█" and "0 -> 6" in mean


def test_ranks_with_an_unknown_key_lists_the_valid_ones(
    server: ServerProcess, lost_node_run: str, tmp_path: Path
) -> None:
    out = cli(
        "ranks", lost_node_run, "--key", "loss", url=server.url, key=server.admin_key, home=tmp_path
    )
    line = one_line_error(out)
    assert f"run {lost_node_run!r} has no rank metric 'loss'" in line
    assert line.endswith("its rank metrics: a/grad, train/loss")
    unknown = one_line_error(
        cli("ranks", "no-such-run", url=server.url, key=server.admin_key, home=tmp_path)
    )
    assert "404" in unknown and "no-such-run" in unknown


def test_help_names_the_commands_and_the_environment(tmp_path: Path) -> None:
    top = cli("--help", url="http://x", key=None, home=tmp_path).stdout
    assert "as they land" not in top
    for command in ("server", "demo", "sync", "runs", "ranks", "keys", "usage"):
        assert f"instantml {command}" in top
    assert "INSTANTML_API_BASE_URL" in top and "INSTANTML_API_KEY" in top
    for command in ("sync", "runs", "ranks", "keys", "usage"):
        text = cli(command, "--help", url="http://x", key=None, home=tmp_path).stdout
        assert "INSTANTML_API_BASE_URL" in text and "INSTANTML_API_KEY" in text, command


def test_every_flag_has_help() -> None:
    def walk(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.Action]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    yield from walk(child, f"{name} {sub}")
            elif not isinstance(action, argparse._HelpAction):
                yield name, action

    undocumented = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, action in walk(build_parser(), "instantml")
        if not action.help
    ]
    assert undocumented == []


def test_runs_says_how_many_ranks_a_run_lost() -> None:
    from instantml.cli.runs import _status

    assert _status({"status": "finished", "ranks_lost": []}) == "finished"
    assert _status({"status": "finished", "ranks_lost": [{"rank": 3, "last_step": 59}]}) == (
        "finished, 1 rank lost"
    )
    two = [{"rank": 3, "last_step": 59}, {"rank": 4, "last_step": 60}]
    assert _status({"status": "failed", "ranks_lost": two}) == "failed, 2 ranks lost"


def test_help_lists_every_command() -> None:
    from instantml.cli import build_parser

    text = build_parser().format_help()
    for command in ("server", "demo", "sync", "runs", "ranks", "watch", "keys", "usage"):
        assert f"instantml {command} " in text, command
