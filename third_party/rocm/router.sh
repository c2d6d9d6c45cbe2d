#!/usr/bin/env bash
# sglang-router (CPU only) in front of every SGLang server; the learner talks to it alone.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: third_party/rocm/router.sh --workers_file=/shared/rstar_jax/sglang_workers.txt
         [--port=30000] [--policy=cache_aware]
   or: third_party/rocm/router.sh --help
workers_file: one http://host:port per line (sglang_servers.sh ports on each node).
Install once: pip install sglang-router   (pure CPU wheel; runs on any node)
Point the config at it: rollout.sglang_urls = ["http://<router-host>:30000"]
Note: weight pushes (POST /update_weights_from_disk) must reach EVERY server, not just one
behind the router: list the workers themselves in rollout.sglang_urls if your router version
does not fan admin calls out (see README "Weight push").
Environment: DRY_RUN=1 prints the command.
USAGE
}

WORKERS_FILE=""
PORT=30000
POLICY=cache_aware
for a in "$@"; do
  case "$a" in
    -h|--help) usage; exit 0 ;;
    --workers_file=*) WORKERS_FILE="${a#*=}" ;;
    --port=*) PORT="${a#*=}" ;;
    --policy=*) POLICY="${a#*=}" ;;
    *) echo "unknown argument: $a" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -f "${WORKERS_FILE}" ]] || { echo "--workers_file not found: '${WORKERS_FILE}'" >&2; exit 2; }
mapfile -t WORKERS < <(grep -v '^\s*\(#\|$\)' "${WORKERS_FILE}")
cmd=(python3 -m sglang_router.launch_router --host 0.0.0.0 --port "${PORT}"
     --policy "${POLICY}" --worker-urls "${WORKERS[@]}")
if [[ "${DRY_RUN:-0}" == "1" ]]; then echo "${cmd[*]}"; else exec "${cmd[@]}"; fi
