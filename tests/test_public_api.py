"""The names a user can import are chosen, not accidental."""

from __future__ import annotations

import instantml


def test_public_names() -> None:
    assert sorted(instantml.__all__) == ["Api", "InstantMLError", "Run", "__version__", "init"]
    assert callable(instantml.init)


def test_sdk_import_does_not_pull_the_server() -> None:
    import subprocess
    import sys

    code = "import sys, instantml; print(sorted(m for m in ('fastapi','duckdb','numpy','uvicorn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
