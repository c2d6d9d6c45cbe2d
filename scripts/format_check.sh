#!/usr/bin/env bash
# Fast style gate for CI: ruff's formatter (check only) and linter over the tree, with the
# settings in pyproject.toml ([tool.ruff]: 100 columns, 2-space indentation).
#   scripts/format_check.sh           check (exit 1 on any difference or lint error)
#   scripts/format_check.sh --fix     apply the formatter and safe lint fixes
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF="${RUFF:-ruff}"
if ! command -v "$RUFF" >/dev/null 2>&1; then
  RUFF="python -m ruff"
fi
if [[ "${1:-}" == "--fix" ]]; then
  $RUFF format .
  $RUFF check --fix .
else
  $RUFF format --check .
  $RUFF check .
fi
