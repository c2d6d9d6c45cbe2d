#!/usr/bin/env bash
# The sandboxed code pool on CPU nodes, through Ray (rstar_jax.tools.ray_pool.RayCodePool).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: third_party/rocm/code_pool.sh head   [--port=6379] [--num_cpus=N]
       third_party/rocm/code_pool.sh worker --address=<head-host>:6379 [--num_cpus=N]
       third_party/rocm/code_pool.sh stop
   or: third_party/rocm/code_pool.sh --help
Starts a Ray cluster over the CPU nodes that execute model-written Python. The learner process
joins it with ray.init(address=...) and uses RayCodePool(PoolConfig(num_workers=...)): one
CodePool actor per Ray node, calls spread round-robin, a session pinned to its node.
Run on CPU-only nodes (never on the GPU nodes: untrusted code). Needs `pip install ray` and
this repo (pip install -e .) on every CPU node. Keep the Ray port on a private network.
Environment: DRY_RUN=1 prints the command.
USAGE
}

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
ROLE="$1"; shift
PORT=6379
ADDRESS=""
NUM_CPUS="$(nproc 2>/dev/null || echo 1)"
case "${ROLE}" in
  -h|--help) usage; exit 0 ;;
esac
for a in "$@"; do
  case "$a" in
    --port=*) PORT="${a#*=}" ;;
    --address=*) ADDRESS="${a#*=}" ;;
    --num_cpus=*) NUM_CPUS="${a#*=}" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument: $a" >&2; usage >&2; exit 2 ;;
  esac
done
case "${ROLE}" in
  head) cmd=(ray start --head --port "${PORT}" --num-cpus "${NUM_CPUS}" --include-dashboard=false) ;;
  worker)
    [[ -n "${ADDRESS}" ]] || { echo "worker needs --address=<head>:<port>" >&2; exit 2; }
    cmd=(ray start --address "${ADDRESS}" --num-cpus "${NUM_CPUS}") ;;
  stop) cmd=(ray stop) ;;
  *) echo "unknown role: ${ROLE}" >&2; usage >&2; exit 2 ;;
esac
if [[ "${DRY_RUN:-0}" == "1" ]]; then echo "${cmd[*]}"; else exec "${cmd[@]}"; fi
