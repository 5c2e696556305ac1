#!/usr/bin/env bash
# Set up, then lint, type-check and run the whole test suite.
set -euo pipefail
# A CPU build of torch for the integrations' tests (the frameworks run on the CPU there):
# torch 2.13.0 is the CPU wheel these machines hold; elsewhere set TORCH_SPEC, e.g. to
# "torch --index-url https://download.pytorch.org/whl/cpu".
PRE_INSTALL="${TORCH_SPEC:-torch==2.13.0}" EXTRAS=test source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
# Debian's Chromium for the dashboard's browser tests (Playwright drives it; it downloads
# no browser of its own).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: no chromium on PATH; the browser tests will be skipped" >&2
  fi
fi
# Debian's PostgreSQL for the scale-out backend's tests (they start a throwaway cluster of
# their own on a free port, and skip without it).
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "note: no PostgreSQL (initdb) here; its tests will be skipped" >&2
  fi
fi
# The public instantml 0.1.1 SDK, in a venv of its own, for the wire-compatibility tests.
if [ ! -x .venv-public/bin/python ]; then
  "$PYTHON" -m venv .venv-public
fi
.venv-public/bin/python -m pip install --quiet "instantml==0.1.1"
export INSTANTML_PUBLIC_SDK_PYTHON="$PWD/.venv-public/bin/python"
.venv/bin/ruff check src tests bench examples
.venv/bin/ruff format --check src tests bench examples
.venv/bin/mypy
status=0
.venv/bin/python -m pytest "$@" || status=$?
# The suites that touch storage again, on the scale-out stores: PostgreSQL (a throwaway
# cluster) for metadata and ClickHouse's engine (chdb) for points. Skipped when PostgreSQL
# is not installed, or when the arguments name tests of their own.
paths=0
for arg in "$@"; do case "$arg" in -*) ;; *) paths=1 ;; esac; done
if [ "$status" = 0 ] && [ "$paths" = 0 ] && { command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }; then
  echo "== again on PostgreSQL + ClickHouse (chdb): tests/server tests/summary tests/spool tests/health tests/reliability"
  INSTANTML_TEST_STORES=postgres+chdb .venv/bin/python -m pytest "$@" tests/server tests/summary tests/spool tests/health tests/reliability || status=$?
fi
exit "$status"
