"""Where the SDK finds its key, its server and its run id."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping

from .. import validation
from ..credentials import credentials_file as credentials_file  # where the file is
from ..credentials import read_credentials

DEFAULT_BASE_URL = "http://127.0.0.1:8765"


def resolve_api_key(api_key: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    return api_key or environ.get("INSTANTML_API_KEY") or read_credentials().get("api_key")


def resolve_base_url(base_url: str | None, environ: Mapping[str, str] = os.environ) -> str:
    url = (
        base_url
        or environ.get("INSTANTML_API_BASE_URL")
        or read_credentials().get("api_host")
        or DEFAULT_BASE_URL
    )
    return url.rstrip("/")


def resolve_node(environ: Mapping[str, str] = os.environ) -> str:
    """The host this process runs on, as its rank events name it: ``INSTANTML_NODE``, else
    the host name (what the Distributed tab groups ranks by)."""
    given = environ.get("INSTANTML_NODE") or socket.gethostname() or "unknown"
    return given.replace("\x00", "")[: validation.MAX_NODE]


def _from_launcher(value: str) -> str:
    # Launcher ids are opaque text; keep them usable in a URL path.
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value).lstrip("._-")[:128]
    return cleaned or uuid.uuid4().hex


def resolve_run_id(run_id: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """``run_id=``, else INSTANTML_RUN_ID, else the launcher's job id, else a new id.

    torchrun sets TORCHELASTIC_RUN_ID to the literal ``none`` unless ``--rdzv-id`` is given;
    that value would merge unrelated jobs, so it is ignored.
    """
    if run_id is not None:
        return validation.run_id(run_id, "run_id")
    explicit = environ.get("INSTANTML_RUN_ID")
    if explicit:
        return validation.run_id(explicit, "INSTANTML_RUN_ID")
    elastic = environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic.lower() != "none":
        return _from_launcher(f"torchelastic-{elastic}")
    slurm = environ.get("SLURM_JOB_ID")
    if slurm:
        step = environ.get("SLURM_STEP_ID")
        return _from_launcher(f"slurm-{slurm}" + (f".{step}" if step else ""))
    return uuid.uuid4().hex


def unshared_run_warning(run_id: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the ranks of this job would each get a run of their own, when they would: more
    than one rank (WORLD_SIZE > 1) and nothing that all of them share to agree on an id."""
    if run_id is not None or environ.get("INSTANTML_RUN_ID") or environ.get("SLURM_JOB_ID"):
        return None
    elastic = environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic.lower() != "none":
        return None
    try:
        world = int(environ.get("WORLD_SIZE") or 1)
    except ValueError:
        return None
    if world <= 1:
        return None
    launcher = (
        "TORCHELASTIC_RUN_ID=none (torchrun's static rendezvous without --rdzv-id: with"
        " --master-port, on several nodes, or under accelerate launch)"
        if elastic
        else "no launcher job id (deepspeed, mpirun and hand-spawned processes set none)"
    )
    return (
        f"WORLD_SIZE={world} but {launcher}: each rank is logging into a run of its own."
        " Give all ranks one id: INSTANTML_RUN_ID=<id> in the job's environment (always"
        " works), init(run_id=...), or torchrun --rdzv-id=<job id> with --master-port."
    )


def launcher_ranks(environ: Mapping[str, str] = os.environ) -> tuple[int | None, ...]:
    """(rank, world_size, local_rank) from RANK, WORLD_SIZE, LOCAL_RANK; inside an ``srun``
    step, which sets none of them, from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.

    A batch script's own step also carries SLURM_PROCID (0) but no SLURM_STEP_ID: processes
    it forks are not SLURM tasks, so the SLURM names are read only inside a step.
    """
    if "RANK" in environ or "SLURM_STEP_ID" not in environ:
        return (
            env_int("RANK", environ),
            env_int("WORLD_SIZE", environ),
            env_int("LOCAL_RANK", environ),
        )
    return (
        env_int("SLURM_PROCID", environ),
        env_int("SLURM_NTASKS", environ),
        env_int("SLURM_LOCALID", environ),
    )


def env_int(name: str, environ: Mapping[str, str] = os.environ) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None
