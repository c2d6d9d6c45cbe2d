#!/usr/bin/env bash
# Prepared accelerator check (benchmarks/gpu_check.py): one JSON report, < 10 minutes on one GPU
# (the decode section alone, < 4 minutes: --sections decode).
#
#   bash scripts/gpu_check.sh --out $OUT/gpu_check.json     # GPU (run from anywhere)
#   bash scripts/gpu_check.sh --smoke --out /tmp/gc.json    # CPU, small sizes (CI smoke test)
#
# Installs nothing: needs jax (CUDA build on a GPU), torch and transformers. Runs the project's
# venv (<repo>/.venv, what scripts/setup.sh makes) when there is one, else python3; PYTHON
# overrides it. The repo need not be pip-installed (PYTHONPATH is set here). Exit status: 0
# when every section ran, 1 when any failed (the report still holds every section).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY=python3
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# JAX allocates on demand, so torch can share the GPU in the decode and DLPack sections.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
cd "$ROOT"
exec "$PY" benchmarks/gpu_check.py "$@"
