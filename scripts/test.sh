#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export PYTHONDONTWRITEBYTECODE=1
# Style gate first (seconds): ruff format --check + ruff check, settings in pyproject.toml.
RUFF=.venv/bin/ruff bash scripts/format_check.sh
# Where the code tool's strongest sandbox is possible (root + bubblewrap), a threat test that
# skips at the namespaces level fails the run instead of passing silently.
if [ "$(id -u)" = "0" ] && command -v bwrap >/dev/null 2>&1; then
  export RSTAR_REQUIRE_NAMESPACES="${RSTAR_REQUIRE_NAMESPACES:-1}"
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
