"""Stand-in SGLang servers and SGLang's real router as child processes on 127.0.0.1, for the
fault-injection tests and `benchmarks/chaos.py` (and code-pool tool nodes, `ToolNodeProcess`): kill -9 one, stop it (SIGSTOP: a hang),
start it again on the same port.

    a = StandInProcess(tmp_dir, "a", token_delay_s=0.01).start()
    url = a.wait_ready()
    router = RouterProcess([url]).start(); router.wait_ready(expect_workers=1)
    a.kill9(); a.start(port=a.port)  # back on the same port, weight version 0

The router is ``python -m sglang_router.launch_router`` (package ``sglang-router``) bound to
127.0.0.1 only (its Prometheus exporter too), with a short health-check interval so a killed
worker is noticed quickly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

_ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env() -> dict:
  return dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


class StandInProcess:
  """`mock_sglang` in its own process. ``flags``: its command-line options (token_delay_s,
  logprob_shift, weight_version, vocab_size)."""

  def __init__(self, work_dir: str, name: str, **flags):
    self.port_file = os.path.join(os.fspath(work_dir), f"{name}.url")
    self.flags = flags
    self.proc: subprocess.Popen | None = None
    self.url: str | None = None
    self.port: int | None = None

  def start(self, port: int = 0) -> StandInProcess:
    if os.path.exists(self.port_file):
      os.remove(self.port_file)
    args = [sys.executable, "-m", "rstar_jax.rollout.testing.mock_sglang"]
    args += ["--port-file", self.port_file, "--port", str(port)]
    for k, v in self.flags.items():
      flag = f"--{k.replace('_', '-')}"
      if v is True:
        args.append(flag)
      elif v is not False:
        args += [flag, str(v)]
    self.proc = subprocess.Popen(args, env=_env(), stderr=subprocess.DEVNULL)
    return self

  def wait_ready(self, timeout_s: float = 180.0) -> str:
    end = time.monotonic() + timeout_s
    while not os.path.exists(self.port_file):
      if self.proc.poll() is not None:
        raise RuntimeError(f"stand-in {self.port_file} exited with {self.proc.returncode}")
      if time.monotonic() > end:
        raise TimeoutError(f"stand-in {self.port_file} did not start in {timeout_s:g}s")
      time.sleep(0.05)
    with open(self.port_file) as f:
      self.url = f.read().strip()
    self.port = int(self.url.rsplit(":", 1)[1])
    return self.url

  def running_requests(self) -> int:
    """Requests generating now (``/get_load``); -1 when it does not answer."""
    try:
      with urllib.request.urlopen(self.url + "/get_load", timeout=2) as r:
        return int(json.load(r)["num_running_reqs"])
    except OSError:
      return -1

  def kill9(self) -> None:
    self.proc.send_signal(signal.SIGKILL)
    self.proc.wait(30)

  def alive(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  def stop(self) -> None:
    if self.alive():
      self.proc.kill()
      self.proc.wait(30)


class ToolNodeProcess:
  """A code-pool service (``launchers.code_pool_server``, the HTTP tool node) in its own process
  group on 127.0.0.1: `kill9` kills the service and its sandboxes at once; `start(port)` brings
  it back on the same port (a new service instance: its earlier sessions are gone)."""

  def __init__(self, num_workers: int = 2, num_templates: int = 1):
    self.num_workers, self.num_templates = int(num_workers), int(num_templates)
    self.proc: subprocess.Popen | None = None
    self.port: int | None = None
    self.url: str | None = None

  def start(self, port: int = 0) -> ToolNodeProcess:
    self.port = int(port) or free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    args = [sys.executable, "-m", "launchers.code_pool_server", "--host=127.0.0.1"]
    args += [f"--port={self.port}", f"--num_workers={self.num_workers}"]
    args += [f"--num_templates={self.num_templates}"]
    # No service token: a loopback-only node (the client sends none either).
    env = {k: v for k, v in _env().items() if not k.startswith("RSTAR_CODE_POOL_TOKEN")}
    self.proc = subprocess.Popen(
      args,
      cwd=_ROOT,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      start_new_session=True,
    )
    return self

  def health(self) -> dict:
    with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
      return json.load(r)

  def wait_ready(self, timeout_s: float = 180.0) -> str:
    end = time.monotonic() + timeout_s
    while True:
      if self.proc.poll() is not None:
        raise RuntimeError(f"tool node {self.url} exited with {self.proc.returncode}")
      try:
        self.health()
        return self.url
      except OSError:
        pass
      if time.monotonic() > end:
        raise TimeoutError(f"tool node {self.url} did not start in {timeout_s:g}s")
      time.sleep(0.05)

  def running_requests(self) -> int:
    """Not reported by the service (-1): a kill lands on whatever it is running."""
    return -1

  def kill9(self) -> None:
    os.killpg(self.proc.pid, signal.SIGKILL)  # the service and every sandbox it forked
    self.proc.wait(30)

  def alive(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  def stop(self) -> None:
    if self.alive():
      self.kill9()


class RouterProcess:
  """SGLang's router (``sglang-router``) in front of ``worker_urls`` on 127.0.0.1."""

  def __init__(
    self,
    worker_urls,
    *,
    health_interval_s: int = 1,
    policy: str = "round_robin",
    log_path: str | None = None,
  ):
    self.worker_urls = list(worker_urls)
    self.policy = policy
    self.health_interval_s = int(health_interval_s)
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.log_path = log_path
    self.proc: subprocess.Popen | None = None

  def start(self) -> RouterProcess:
    args = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
    args += ["--port", str(self.port), "--worker-urls", *self.worker_urls]
    args += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    args += ["--health-check-interval-secs", str(self.health_interval_s)]
    args += ["--health-failure-threshold", "1", "--log-level", "warn", "--policy", self.policy]
    out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
    self.proc = subprocess.Popen(args, env=_env(), stdout=out, stderr=subprocess.STDOUT)
    return self

  def workers(self) -> list[dict]:
    with urllib.request.urlopen(self.url + "/workers", timeout=5) as r:
      return json.load(r)["workers"]

  def wait_ready(self, expect_workers: int, timeout_s: float = 120.0) -> None:
    end = time.monotonic() + timeout_s
    while True:
      if self.proc.poll() is not None:
        raise RuntimeError(f"sglang-router exited with {self.proc.returncode}")
      try:
        if sum(bool(w.get("is_healthy")) for w in self.workers()) >= expect_workers:
          return
      except OSError:
        pass
      if time.monotonic() > end:
        raise TimeoutError(f"sglang-router at {self.url} not ready in {timeout_s:g}s")
      time.sleep(0.1)

  def stop(self) -> None:
    if self.proc is not None and self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(15)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait(15)
