"""Serves the sandboxed code pool over HTTP (rstar_jax.tools.server). No logic here.

python -m launchers.code_pool_server --port=8088 --num_workers=64
Off loopback a token is required: --token_file=/etc/rstar/pool.token (one token per line), or
$RSTAR_CODE_POOL_TOKEN_FILE / $RSTAR_CODE_POOL_TOKEN.
"""

import asyncio
import logging
import sys

from absl import app, flags

from rstar_jax.tools.code_pool import PoolConfig
from rstar_jax.tools.server import serve_forever

_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (off loopback: needs a token).")
_PORT = flags.DEFINE_integer("port", 8088, "Port to bind.")
_TOKEN_FILE = flags.DEFINE_string(
  "token_file", None, "File of shared-secret tokens, one per line (default: from environment)."
)
_WORKERS = flags.DEFINE_integer("num_workers", 16, "Calls executing at once.")
_TEMPLATES = flags.DEFINE_integer("num_templates", None, "Warm templates (default: cores).")
_TIMEOUT = flags.DEFINE_float("timeout_s", 4.0, "Default wall-clock limit per call.")
_MEMORY = flags.DEFINE_integer("memory_limit_mb", 1024, "Address space a call may add.")
_OUTPUT = flags.DEFINE_integer("max_output_bytes", 1 << 20, "Cap on stdout and on stderr.")
_PROCS = flags.DEFINE_integer("max_procs", 64, "RLIMIT_NPROC per call.")
_ISOLATION = flags.DEFINE_enum(
  "isolation", "auto", ["auto", "namespaces", "pidns", "uid", "rlimits"], "Minimum isolation level."
)
_QUEUE_TIMEOUT = flags.DEFINE_float("queue_timeout_s", None, "Max wait for a free worker.")
_MAX_REQUEST = flags.DEFINE_integer("max_request_bytes", 64 << 20, "Largest request body.")
_MAX_RESPONSE = flags.DEFINE_integer("max_response_bytes", 256 << 20, "Largest response body.")
_MAX_SESSIONS = flags.DEFINE_integer(
  "max_sessions", None, "Live sessions at most (default and ceiling: what descriptors/uids allow)."
)
_PER_TOKEN = flags.DEFINE_integer(
  "max_sessions_per_token", None, "Sessions per token (default: max_sessions / tokens)."
)
_MAX_CONN = flags.DEFINE_integer("max_connections", 1024, "Open connections at most.")
_MAX_UNAUTH = flags.DEFINE_integer(
  "max_unauthenticated_connections", 256, "Connections at most not yet past the token check."
)
_HEADER_TIMEOUT = flags.DEFINE_float(
  "header_timeout_s", 10.0, "Seconds a new connection has to present a valid token."
)


def main(argv):
  del argv
  logging.basicConfig(level=logging.INFO)
  try:
    config = PoolConfig(
      num_workers=_WORKERS.value,
      num_templates=_TEMPLATES.value,
      timeout_s=_TIMEOUT.value,
      memory_limit_mb=_MEMORY.value,
      max_output_bytes=_OUTPUT.value,
      max_procs=_PROCS.value,
      isolation=_ISOLATION.value,
      max_sessions=_MAX_SESSIONS.value,
    )
    serve = serve_forever(
      config,
      _HOST.value,
      _PORT.value,
      _QUEUE_TIMEOUT.value,
      token_file=_TOKEN_FILE.value,
      max_request_bytes=_MAX_REQUEST.value,
      max_response_bytes=_MAX_RESPONSE.value,
      max_sessions_per_token=_PER_TOKEN.value,
      max_connections=_MAX_CONN.value,
      max_unauthenticated_connections=_MAX_UNAUTH.value,
      header_timeout_s=_HEADER_TIMEOUT.value,
    )
    asyncio.run(serve)
  except ValueError as e:  # a bad flag or a missing token: one line, no traceback
    sys.exit(f"code_pool_server: {e}")


if __name__ == "__main__":
  app.run(main)
