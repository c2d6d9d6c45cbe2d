#!/usr/bin/env bash
# Fast style gate for CI: ruff's formatter (check only) and linter over the tree, with the
# settings in pyproject.toml ([tool.ruff]: 100 columns, 2-space indentation), then the package's
# import layers ([tool.importlinter], docs/architecture.md): an upward import or an import
# circle fails here, with a message naming the importing and the imported module.
#   scripts/format_check.sh           check (exit 1 on any difference, lint error or broken layer)
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
  LINT_IMPORTS="${LINT_IMPORTS:-lint-imports}"
  if ! command -v "$LINT_IMPORTS" >/dev/null 2>&1; then
    LINT_IMPORTS="python -c 'import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())'"
  fi
  # This checkout's package, not the one an editable install elsewhere points at.
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" eval "$LINT_IMPORTS" --no-cache --no-logo
fi
