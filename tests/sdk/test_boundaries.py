"""What a training process imports stays the SDK's: ``sdk/`` (and spool mode's writer)
import nothing of the server's packages, which import nothing of ``sdk/``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import instantml

PACKAGE = Path(instantml.__file__).parent
SERVER_SIDE = ("server", "storage", "health", "summary", "rankmath", "dashboard")


def _imported(path: Path) -> set[str]:
    """The instantml modules a source file imports, as dotted names below the package."""
    tree = ast.parse(path.read_text())
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(parts[: len(parts) - node.level])
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("instantml."):
                target = node.module.removeprefix("instantml.")
            else:
                continue
            names.update(
                f"{target}.{alias.name}" if not node.module else target for alias in node.names
            )
        elif isinstance(node, ast.Import):
            names.update(
                a.name.removeprefix("instantml.")
                for a in node.names
                if a.name.startswith("instantml.")
            )
    return names


def test_the_sdk_imports_nothing_of_the_server() -> None:
    for path in [*(PACKAGE / "sdk").glob("*.py"), PACKAGE / "spool" / "writer.py"]:
        wrong = {n for n in _imported(path) if n.split(".")[0] in SERVER_SIDE}
        assert not wrong, (path.name, wrong)


def test_the_server_imports_nothing_of_the_sdk() -> None:
    for package in SERVER_SIDE:
        for path in (PACKAGE / package).rglob("*.py"):
            wrong = {n for n in _imported(path) if n.split(".")[0] in ("sdk", "spool", "cli")}
            assert not wrong, (path.relative_to(PACKAGE), wrong)


def test_import_instantml_loads_only_the_sdk() -> None:
    code = (
        "import sys, instantml; print(' '.join(sorted(m for m in sys.modules"
        " if m.startswith('instantml.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert loaded and all(m.split(".")[1] not in SERVER_SIDE for m in loaded), loaded
    assert "msgspec" not in out.stdout
