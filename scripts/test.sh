#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export PYTHONDONTWRITEBYTECODE=1
# Style gate first (seconds): ruff format --check + ruff check, settings in pyproject.toml.
RUFF=.venv/bin/ruff LINT_IMPORTS=.venv/bin/lint-imports bash scripts/format_check.sh
# Where the code tool's strongest sandbox is possible (root + bubblewrap), a threat test that
# skips at the namespaces level fails the run instead of passing silently.
if [ "$(id -u)" = "0" ] && command -v bwrap >/dev/null 2>&1; then
  export RSTAR_REQUIRE_NAMESPACES="${RSTAR_REQUIRE_NAMESPACES:-1}"
fi
# Two workers (pytest-xdist) where the machine has 2 cores or more: whole modules go to one
# worker each (--dist loadfile: a module's fixtures are built once), the modules holding slow
# tests first (tests/conftest.py). RSTAR_TEST_WORKERS=0 runs serially; extra arguments pass
# through (e.g. -m "not slow", or -n 0).
WORKERS=${RSTAR_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
[ "$WORKERS" -gt 2 ] && WORKERS=2
PARALLEL=()
if [ "$WORKERS" -ge 2 ] && .venv/bin/python -c "import xdist" 2>/dev/null; then
  PARALLEL=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)
fi
# --durations: the slowest tests are listed at the end of every run, so a slow newcomer shows.
# The long tier (whole end-to-end chains, pytest.ini) is left out of the default run so CI fits
# its 30 minutes; an -m given here replaces this one (e.g. -m long, or -m "long or not long").
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "${PARALLEL[@]}" -m "not long" tests "$@"
