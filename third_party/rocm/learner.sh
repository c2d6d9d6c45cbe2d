#!/usr/bin/env bash
# Multi-node JAX learner on MI300X under SLURM: one process per node, 8 GPUs each.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: sbatch --nodes=8 --ntasks-per-node=1 --gpus-per-node=8 third_party/rocm/learner.sh \
         [--config=configs/rstar2_qwen3_14b.py] [--workdir=/shared/rstar_jax/run1] [-- extra flags]
   or: third_party/rocm/learner.sh --help

Runs `python -m launchers.train` (or LAUNCHER=launchers.sft) in the rocm/jax-training image on
every node of the allocation. jax.distributed.initialize() picks up the SLURM variables
(coordinator = first node, process id = SLURM_PROCID); the launcher calls it when SLURM_NTASKS > 1.

Environment (defaults in brackets):
  IMAGE        learner image [rocm/jax-training:maxtext-v26.4-jax0.9.1-te2.12.0]
  REPO         this repository on the shared filesystem [$PWD]
  LAUNCHER     python module to run [launchers.train]
  RSTAR_LEARNER_MEM_FRACTION  HBM fraction for XLA [.55 colocated with SGLang; .93 alone]
  JAX_PIP_SPEC if set, pip-installs it in the container first (e.g. "jax[rocm7-local]")
  DRY_RUN=1    print the commands instead of running them
USAGE
}

CONFIG=configs/rstar2_qwen3_14b.py
WORKDIR=/shared/rstar_jax/run
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

IMAGE="${IMAGE:-rocm/jax-training:maxtext-v26.4-jax0.9.1-te2.12.0}"
REPO="${REPO:-$PWD}"
LAUNCHER="${LAUNCHER:-launchers.train}"
: "${SLURM_JOB_ID:?run under SLURM (sbatch/salloc), see --help}"

# Coordinator: first host of the allocation; port derived from the job id (same rule as JAX).
HEAD="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n1)"
export JAX_COORDINATOR_ADDRESS="${JAX_COORDINATOR_ADDRESS:-${HEAD}:$((SLURM_JOB_ID % 4096 + 61440))}"

# Everything the container needs to find its peers: the SLURM variables (JAX's cluster
# detection) plus the coordinator.
ENV_FILE="${WORKDIR}/slurm_env.${SLURM_JOB_ID}"
mkdir -p "${WORKDIR}"

PY_CMD="cd ${REPO} && source third_party/rocm/env.sh && \
${JAX_PIP_SPEC:+pip install -q \"${JAX_PIP_SPEC}\" && pip install -q -e . && }\
python -m ${LAUNCHER} --config=${CONFIG} --workdir=${WORKDIR} ${EXTRA[*]:-}"

# One docker run per node; srun passes each task its own SLURM_PROCID.
NODE_CMD="env | grep -E '^(SLURM_|JAX_)' > ${ENV_FILE}.\${SLURM_PROCID} && \
docker run --rm --network=host --device=/dev/kfd --device=/dev/dri --group-add video \
  --ipc=host --security-opt seccomp=unconfined --shm-size=256G \
  --env-file ${ENV_FILE}.\${SLURM_PROCID} -v /shared:/shared -v /data:/data \
  -v /checkpoints:/checkpoints -v ${REPO}:${REPO} ${IMAGE} bash -lc '${PY_CMD}'"

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  echo "srun --ntasks-per-node=1 bash -c \"${NODE_CMD}\""
  exit 0
fi
exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "${NODE_CMD}"
