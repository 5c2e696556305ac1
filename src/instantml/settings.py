"""One typed settings object, read once from ``INSTANTML_*`` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .thresholds import Thresholds
from .thresholds import from_env as health_from_env


def _int_or_none(raw: str | None, name: str) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class ServerSettings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8765
    # docs/architecture.md: the metadata stores (orgs, keys, runs, the ledger) and the point
    # store; both default to the data dir's DuckDB file (one engine, one transaction).
    metadata_url_setting: str | None = None
    points_url_setting: str | None = None
    monthly_metric_points: int | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    max_batch_events: int = 50_000
    plotly_js: Path | None = None  # a lighter plotly.js bundle to serve instead of the wheel's
    # On first start on loopback, write ~/.instantml/credentials for the local SDK (when no
    # such file exists). The demo turns it off: it must not touch the user's own file.
    write_credentials: bool = True
    # Server processes on the port (``--workers``): more than one needs stores every process
    # shares (PostgreSQL and a ClickHouse server), never an embedded file.
    workers: int = 1
    # Processes that decode large /api/ingest batches beside the writer (server/
    # decode_pool.py); None: one per spare core, up to two. 0: decode in this process.
    decode_processes: int | None = None
    decode_min_bytes: int = 512 * 1024  # smaller batches are decoded in this process
    # Run-health thresholds (INSTANTML_HEALTH, a JSON object; a run's own go over them).
    health: Thresholds = field(default_factory=Thresholds)
    # Requests a second per API key (bursts of twice that) before 429 "second"; 0: no limit.
    rate_limit: float = 2000.0
    # Where users reach the dashboard (INSTANTML_PUBLIC_URL), for the links in webhook
    # posts; None: the server's own address.
    public_url_setting: str | None = None
    # Runs not written for this many days are deleted (INSTANTML_RETENTION_DAYS; a
    # project's own setting wins); None: kept for ever.
    retention_days: int | None = None
    # How often the server looks for runs past their retention.
    retention_check_seconds: float = 3600.0

    @property
    def public_url(self) -> str:
        if self.public_url_setting:
            return self.public_url_setting.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def metadata_url(self) -> str:
        return self.metadata_url_setting or self.embedded_url

    @property
    def points_url(self) -> str:
        """The points URL set, else the embedded DuckDB file (the metadata's, when that is
        DuckDB too, so one engine holds both)."""
        if self.points_url_setting:
            return self.points_url_setting
        metadata = self.metadata_url
        return metadata if metadata.startswith("duckdb://") else self.embedded_url

    @property
    def embedded_url(self) -> str:
        return f"duckdb://{self.data_dir / 'instantml.duckdb'}"

    @property
    def shared_stores(self) -> bool:
        """Whether several server processes may use these stores at once: metadata on
        PostgreSQL and points on a ClickHouse server (not DuckDB, not chdb)."""
        return self.metadata_url.startswith(("postgresql://", "postgres://")) and (
            self.points_url.startswith("clickhouse://")
        )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: object
    ) -> ServerSettings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {
            "data_dir": Path(env.get("INSTANTML_DATA_DIR", "~/.instantml/data")).expanduser(),
            "host": env.get("INSTANTML_HOST", "127.0.0.1"),
            "port": int(env.get("INSTANTML_PORT", "8765")),
            "metadata_url_setting": env.get("INSTANTML_METADATA_URL") or None,
            "points_url_setting": env.get("INSTANTML_POINTS_URL") or None,
            "public_url_setting": env.get("INSTANTML_PUBLIC_URL") or None,
            "monthly_metric_points": _int_or_none(
                env.get("INSTANTML_MONTHLY_METRIC_POINTS"), "INSTANTML_MONTHLY_METRIC_POINTS"
            ),
        }
        if env.get("INSTANTML_WRITE_CREDENTIALS", "").strip().lower() in ("0", "false", "no"):
            values["write_credentials"] = False
        if env.get("INSTANTML_PLOTLY_JS"):
            values["plotly_js"] = Path(env["INSTANTML_PLOTLY_JS"]).expanduser()
        workers = _int_or_none(env.get("INSTANTML_WORKERS"), "INSTANTML_WORKERS")
        if workers:
            values["workers"] = workers
        decoders = _int_or_none(env.get("INSTANTML_DECODE_PROCESSES"), "INSTANTML_DECODE_PROCESSES")
        if decoders is not None:
            values["decode_processes"] = decoders
        min_bytes = _int_or_none(
            env.get("INSTANTML_DECODE_MIN_BYTES"), "INSTANTML_DECODE_MIN_BYTES"
        )
        if min_bytes is not None:
            values["decode_min_bytes"] = min_bytes
        values["health"] = health_from_env(env.get("INSTANTML_HEALTH"))
        rate = env.get("INSTANTML_RATE_LIMIT", "").strip()
        if rate:
            try:
                values["rate_limit"] = float(rate)
            except ValueError:
                raise ValueError(f"INSTANTML_RATE_LIMIT must be a number, got {rate!r}") from None
            if not values["rate_limit"] >= 0:  # type: ignore[operator]
                raise ValueError(f"INSTANTML_RATE_LIMIT must be >= 0, got {rate!r}")
        values["retention_days"] = _int_or_none(
            env.get("INSTANTML_RETENTION_DAYS"), "INSTANTML_RETENTION_DAYS"
        )
        check = _int_or_none(
            env.get("INSTANTML_RETENTION_CHECK_SECONDS"), "INSTANTML_RETENTION_CHECK_SECONDS"
        )
        if check:
            values["retention_check_seconds"] = float(check)
        max_body = _int_or_none(env.get("INSTANTML_MAX_BODY_BYTES"), "INSTANTML_MAX_BODY_BYTES")
        if max_body:
            values["max_body_bytes"] = max_body
        values.update({k: v for k, v in overrides.items() if v is not None})
        values["data_dir"] = Path(str(values["data_dir"])).expanduser()
        return cls(**values)  # type: ignore[arg-type]
