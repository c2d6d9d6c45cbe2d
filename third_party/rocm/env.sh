# Sourced by the learner launch (inside the rocm/jax-training container). Values: this folder's README.md (ROCm-JAX on MI300X)
# (AMD's MaxText-on-MI300X train_env.sh, ROCm CVS JAX config, ROCm 7.x known issues).
# Override any of them by exporting it before `source`.

# --- JAX / XLA memory -------------------------------------------------------------------
# Learner alone on its GPUs: .93. Colocated with an SGLang server on the same GPU (our 64-GPU
# layout, README "Placement"): the learner gets RSTAR_LEARNER_MEM_FRACTION (default .55).
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-${RSTAR_LEARNER_MEM_FRACTION:-.55}}"
export XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB="${XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB:-512}"

# --- HIP / HSA --------------------------------------------------------------------------
export HIP_FORCE_DEV_KERNARG=1
export HSA_NO_SCRATCH_RECLAIM=1
export HSA_FORCE_FINE_GRAIN_PCIE=1
export HSA_ENABLE_IPC_MODE_LEGACY=1
export GPU_MAX_HW_QUEUES=2
export CUDA_DEVICE_MAX_CONNECTIONS=1
# ROCm 7.12/7.13 preview known issue.
export AMD_COMGR_NAMESPACE=1

# --- RCCL (reads NCCL_*) ----------------------------------------------------------------
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export NCCL_CHECKS_DISABLE=1
export NCCL_IB_QPS_PER_CONNECTION=4
export NCCL_NCHANNELS_PER_NET_PEER=4
# Site specific: the RoCE/IB GID index of your fabric (often 3 for RoCEv2).
export NCCL_IB_GID_INDEX="${NCCL_IB_GID_INDEX:-3}"
# Only when the host kernel exposes dma-buf metadata to the container (else SIGSEGV risk).
export NCCL_DMABUF_ENABLE="${NCCL_DMABUF_ENABLE:-0}"

# --- XLA flags (the image defaults AMD relies on, made explicit) -------------------------
RSTAR_XLA_FLAGS="--xla_gpu_enable_cublaslt=true --xla_gpu_graph_level=0
 --xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false
 --xla_gpu_enable_latency_hiding_scheduler=true
 --xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_all_reduce=true
 --xla_gpu_enable_pipelined_reduce_scatter=true
 --xla_gpu_enable_all_gather_combine_by_dim=false
 --xla_gpu_enable_command_buffer= --xla_gpu_executable_warn_stuck_timeout=90"
export XLA_FLAGS="$(echo ${RSTAR_XLA_FLAGS}) ${XLA_FLAGS:-}"

# --- Determinism mode (trainer/sampler parity checks only; slower) ----------------------
if [[ "${RSTAR_DETERMINISTIC:-0}" == "1" ]]; then
  export TF_DETERMINISTIC_OPS=1 HIPBLASLT_DETERMINISTIC=1 NVTE_ALLOW_NONDETERMINISTIC_ALGO=0
  export NCCL_ALGO=Ring RCCL_MSCCLPP_ENABLE=0 JAX_DEFAULT_PRNG_IMPL=threefry2x32
fi
