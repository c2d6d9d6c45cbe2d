#!/usr/bin/env bash
# Create .venv and install rstar_jax into it, with torch (CPU) and jinja2 so that an export
# loads in transformers. Usage: scripts/setup.sh [test]
# Also installs bubblewrap (kernel-namespace sandbox for the code tool) when run as root with apt;
# without it the code pool still runs, at a lower isolation level that it reports at start-up.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
    || echo "note: could not install bubblewrap; the code pool will run without namespaces" >&2
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The hf extra (torch CPU, jinja2) is what loading an export in transformers needs (README).
if [ "${1:-}" = test ]; then
  .venv/bin/python -m pip install -q -e '.[hf,test]'
else
  .venv/bin/python -m pip install -q -e '.[hf]'
fi
