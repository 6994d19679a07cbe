#!/usr/bin/env bash
# The controller and CLI extras at the oldest versions pyproject.toml allows: installs them with
# uv's `--resolution lowest-direct` into .venv-lowest (the test tools at their newest) and runs the
# unit tests of what those extras serve (API package, webhook, reconciler, progress controller, CLI,
# contract).
# A lower bound that is too low fails here, not on a user's machine. `make test` runs it.
# (The runtime extras' bounds are the versions the main suite ran with; see pyproject.toml.)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv-lowest
stamp="$VENV/.installed-$(cksum <pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check uv
  "$VENV/bin/uv" pip install --python "$VENV/bin/python" -q --resolution lowest-direct \
    -e '.[controller,cli]'
  "$VENV/bin/uv" pip install --python "$VENV/bin/python" -q \
    'pytest>=8.0' 'pytest-asyncio>=0.23' 'pytest-timeout>=2.3' 'pytest-rerunfailures>=14.0' \
    'hypothesis>=6.100'
  touch "$stamp"
fi
versions=$("$VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null |
  grep -iE '^(aiohttp|kubernetes|prometheus.client|cryptography|jsonpatch|PyYAML|pydantic|rich) ' |
  awk '{printf "%s=%s ", $1, $2}')
echo "lowest versions: $versions"
# No torch, numpy or xxhash here: test_contract_manifest.py (xxh3 checksums) belongs to the
# runtime's extras and stays in the main suite.
PYTHONPATH="$PWD/hack" "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not cluster" \
  tests/unit/api tests/unit/webhook tests/unit/reconciler tests/unit/progress tests/unit/cli \
  tests/unit/test_crds.py tests/unit/test_dashboard.py tests/unit/test_jobkinds.py \
  tests/unit/test_contract_env.py tests/unit/test_contract_progress.py "$@"
