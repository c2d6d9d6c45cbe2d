#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export PYTHONDONTWRITEBYTECODE=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
