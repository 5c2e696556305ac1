# Sourced by the other scripts: make .venv with instantml installed (editable) plus EXTRAS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if [ -n "${PRE_INSTALL:-}" ]; then  # installed before the extras, which keep it
  .venv/bin/python -m pip install --quiet $PRE_INSTALL
fi
.venv/bin/python -m pip install --quiet --editable ".[${EXTRAS:-server}]"
# A lighter plotly.js for the dashboard (half the load time of the wheel's full bundle), when
# npm is there; without it the server serves the plotly wheel's bundle.
PLOTLY_LITE=.instantml/js/node_modules/plotly.js-cartesian-dist-min/plotly-cartesian.min.js
if [ ! -f "$PLOTLY_LITE" ] && command -v npm >/dev/null 2>&1; then
  npm install --silent --no-save --no-audit --no-fund --prefix .instantml/js \
    "plotly.js-cartesian-dist-min@4" >/dev/null 2>&1 || true
fi
if [ -f "$PLOTLY_LITE" ]; then
  export INSTANTML_PLOTLY_JS="$PWD/$PLOTLY_LITE"
fi
