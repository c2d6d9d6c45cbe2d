#!/usr/bin/env bash
# One SGLang server per GPU (TP=1) on this node, in the rocm/sgl-dev image.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: third_party/rocm/sglang_servers.sh --model=/checkpoints/Qwen3-14B-Base [--gpus=0,1,...,7]
         [--base_port=30001] [--mem_fraction=0.35] [--tp=1]
   or: third_party/rocm/sglang_servers.sh --help
Run on every rollout node (with srun: `srun --ntasks-per-node=1 sglang_servers.sh ...`).

Starts len(gpus)/tp servers on ports base_port, base_port+1, ...; each one loads the policy
from --model and later reloads pushed weights from the shared staging dir via
POST /update_weights_from_disk. Put router.sh in front of all of them.
  --mem_fraction  SGLang --mem-fraction-static. Colocated with the learner on the same GPUs
                  (default layout): 0.35 (learner .55). Dedicated rollout GPUs: 0.85.
Environment: IMAGE [rocm/sgl-dev:latest-rocm7], DRY_RUN=1 prints the commands.
USAGE
}

MODEL=""
GPUS="0,1,2,3,4,5,6,7"
BASE_PORT=30001
MEM_FRACTION=0.35
TP=1
for a in "$@"; do
  case "$a" in
    -h|--help) usage; exit 0 ;;
    --model=*) MODEL="${a#*=}" ;;
    --gpus=*) GPUS="${a#*=}" ;;
    --base_port=*) BASE_PORT="${a#*=}" ;;
    --mem_fraction=*) MEM_FRACTION="${a#*=}" ;;
    --tp=*) TP="${a#*=}" ;;
    *) echo "unknown argument: $a" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -n "${MODEL}" ]] || { echo "--model is required" >&2; usage >&2; exit 2; }
IMAGE="${IMAGE:-rocm/sgl-dev:latest-rocm7}"

IFS=',' read -r -a GPU_LIST <<< "${GPUS}"
n=$(( ${#GPU_LIST[@]} / TP ))
for ((i = 0; i < n; i++)); do
  devs="$(IFS=','; echo "${GPU_LIST[*]:$((i * TP)):${TP}}")"
  port=$((BASE_PORT + i))
  cmd=(docker run -d --rm --name "sglang_${port}" --network=host --device=/dev/kfd
       --device=/dev/dri --group-add video --ipc=host --security-opt seccomp=unconfined
       --shm-size=32G -e HIP_VISIBLE_DEVICES="${devs}" -e SGLANG_USE_AITER=1
       -v /shared:/shared -v /checkpoints:/checkpoints "${IMAGE}"
       python3 -m sglang.launch_server --model-path "${MODEL}" --tp "${TP}"
       --host 0.0.0.0 --port "${port}" --mem-fraction-static "${MEM_FRACTION}"
       --dtype bfloat16 --skip-tokenizer-init)
  if [[ "${DRY_RUN:-0}" == "1" ]]; then echo "${cmd[*]}"; else "${cmd[@]}"; fi
done
