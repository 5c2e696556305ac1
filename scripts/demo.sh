#!/usr/bin/env bash
# Set up, start a server on the embedded store, and run the 8-rank demo job against it.
# Extra arguments go to `instantml demo` (e.g. --no-serve to stop when the job ends).
set -euo pipefail
EXTRAS=server source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec .venv/bin/instantml demo "$@"
