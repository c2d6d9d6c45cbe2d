"""2 JAX processes x 4 CPU devices against 1 process x 8 (gloo collectives), embedded sampler,
real code pool: same per-step metrics, same final params, same HF export, each rollout
generated once; a process killed mid-step makes the other fail naming it, and a restart
resumes from the last checkpoint and continues exactly (the 2-process run IS that restarted
run, so the match with the 1-process run checks the resume too).

Each run is a subprocess of `tests/distributed/mp_driver.py` (1 process) or of it under
`scripts/local_cluster.sh` (2 processes).
"""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(REPO, "tests", "distributed", "mp_driver.py")
CLUSTER = os.path.join(REPO, "scripts", "local_cluster.sh")
sys.path.insert(0, os.path.join(REPO, "scripts"))
import compare_metrics  # noqa: E402

pytestmark = pytest.mark.slow
RL_STEPS, SFT_STEPS = 2, 3
PROMPTS, ROLLOUTS = 2, 4  # mp_driver.py pins batch_prompts 2, oversample 2 x G 2


def _env(**extra):
  env = dict(
    os.environ,
    PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    JAX_PLATFORMS="cpu",
    PYTHONUNBUFFERED="1",
  )
  for k in ("RSTAR_COORDINATOR", "RSTAR_NUM_PROCESSES", "RSTAR_PROCESS_ID"):
    env.pop(k, None)
  env.update(extra)
  return env


def _run(args, processes, timeout=900, **extra):
  if processes == 1:
    cmd = [sys.executable, DRIVER, *args]
    env = _env(XLA_FLAGS="--xla_force_host_platform_device_count=8", **extra)
  else:
    cmd = ["bash", CLUSTER, str(processes), "4", "--", sys.executable, DRIVER, *args]
    env = _env(LOCAL_CLUSTER_PYTHON=sys.executable, **extra)
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
  assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
  return out


def _free_port():
  import socket

  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
  s.close()
  return port


def _run_faulted(args):
  """2 processes started directly (not under local_cluster.sh, which would end the survivor
  itself); process 1 SIGKILLs itself at RL step 2. Returns (survivor's rc, its output, the
  seconds it took to fail after the loss, the lost process's output)."""
  port = _free_port()
  procs = []
  for i in range(2):
    env = _env(
      RSTAR_COORDINATOR=f"127.0.0.1:{port}",
      RSTAR_NUM_PROCESSES="2",
      RSTAR_PROCESS_ID=str(i),
      RSTAR_HEARTBEAT_S="5",
      XLA_FLAGS="--xla_force_host_platform_device_count=4",
      RSTAR_TEST_DIE_AT_STEP="2",
      RSTAR_TEST_DIE_PROCESS="1",
    )
    procs.append(
      subprocess.Popen(
        [sys.executable, DRIVER, *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  try:
    out1, _ = procs[1].communicate(timeout=900)
    t_dead = time.monotonic()
    out0, _ = procs[0].communicate(timeout=300)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  assert procs[1].returncode == -9 and "kills itself at step 2" in out1, out1[-3000:]
  return procs[0].returncode, out0, time.monotonic() - t_dead


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Three driver start-ups in all (each is SFT, RL and eval where it can, to keep CI short):
  1 process x 8 devices straight through; 2 x 4 with process 1 lost at RL step 2 (after SFT
  and RL step 1); the 2-process restart under local_cluster.sh, which resumes RL at step 2 and
  evaluates. The 2-process figures compared with the 1-process run are thus also a check that
  the resumed run continues exactly."""
  base = tmp_path_factory.mktemp("mp")
  d1, d2 = str(base / "p1"), str(base / "p2")
  _run(["all", d1, str(RL_STEPS), str(SFT_STEPS)], 1)
  rc, out0, waited = _run_faulted(["all", d2, str(RL_STEPS), str(SFT_STEPS)])
  restart = _run(["rl_eval", d2, "1"], 2)
  dirs = {"fault": (rc, out0, waited), "restart": restart.stdout + restart.stderr}
  for n, d in ((1, d1), (2, d2)):
    for mode in ("rl", "sft"):
      dirs[mode, n] = os.path.join(d, mode)
    dirs["eval", n] = os.path.join(d, "eval.json")
  return dirs


def _metrics(d, name):
  return compare_metrics.load(os.path.join(d, f"{name}.jsonl"))


def _assert_same_params(a, b, atol=1e-5):
  pa, pb = np.load(os.path.join(a, "params.npz")), np.load(os.path.join(b, "params.npz"))
  assert sorted(pa) == sorted(pb)
  for k in pa:
    np.testing.assert_allclose(pa[k], pb[k], atol=atol, rtol=1e-4, err_msg=k)


def test_rl_two_processes_match_one(runs):
  one, two = _metrics(runs["rl", 1], "metrics"), _metrics(runs["rl", 2], "metrics")
  assert sorted(one) == list(range(1, RL_STEPS + 1))
  assert compare_metrics.compare(one, two, 1e-4, 1e-6) == []
  # The comparison has teeth: the steps updated, with non-zero gradients, on mixed groups.
  assert all(r["grad_norm"] > 0 and r["optimizer_step"] == s for s, r in one.items())
  assert all(0 < r["reward_mean"] < 1 or r["groups_kept"] > 0 for r in one.values())
  _assert_same_params(runs["rl", 1], runs["rl", 2])


def test_each_rollout_is_generated_once(runs):
  for n in (1, 2):
    for r in _metrics(runs["rl", n], "metrics").values():
      assert r["rollouts_generated"] == PROMPTS * ROLLOUTS, (n, r["rollouts_generated"])
      assert r["num_trajectories"] == PROMPTS * ROLLOUTS


def test_sft_and_export_two_processes_match_one(runs):
  one, two = _metrics(runs["sft", 1], "sft_metrics"), _metrics(runs["sft", 2], "sft_metrics")
  assert sorted(one) == list(range(1, SFT_STEPS + 1))
  assert compare_metrics.compare(one, two, 1e-4, 1e-6) == []
  _assert_same_params(runs["sft", 1], runs["sft", 2])
  from safetensors.numpy import load_file

  ha = load_file(os.path.join(runs["sft", 1], "hf", "model.safetensors"))
  hb = load_file(os.path.join(runs["sft", 2], "hf", "model.safetensors"))
  assert sorted(ha) == sorted(hb) and len(ha) > 5
  for k in ha:
    np.testing.assert_allclose(ha[k], hb[k], atol=1e-5, rtol=1e-4, err_msg=k)
  with open(os.path.join(runs["sft", 2], "hf", "config.json")) as f:
    assert json.load(f)["num_hidden_layers"] == 2


def test_eval_two_processes_match_one(runs):
  reps = []
  for n in (1, 2):
    with open(runs["eval", n]) as f:
      reps.append(json.load(f))
  a, b = reps
  assert a["metrics"]["num_problems"] == b["metrics"]["num_problems"] == 4
  for k in ("accuracy", "response_length_mean", "generated_tokens_mean", "tool_calls_per_traj"):
    assert a["metrics"][k] == pytest.approx(b["metrics"][k]), k
  assert a["per_problem"] == b["per_problem"]
  assert [x["response"] for x in a["samples"]] == [x["response"] for x in b["samples"]]


def test_only_process_zero_writes(runs):
  for d in (runs["rl", 2], runs["sft", 2]):
    name = "metrics.jsonl" if os.path.basename(d) == "rl" else "sft_metrics.jsonl"
    with open(os.path.join(d, name)) as f:
      steps = [json.loads(line)["step"] for line in f if line.strip()]
    assert steps == sorted(set(steps))  # one record per step: no second writer


def test_lost_process_fails_the_other_and_restart_resumes(runs):
  rc, out0, waited = runs["fault"]
  assert rc != 0
  assert waited < 120, f"the survivor took {waited:.0f} s to fail"
  # The survivor names process 1: "task 1" / "task:1", or, when the heartbeat check reports
  # first (a loaded machine), the list under "tasks are unhealthy (stopped sending heartbeats):".
  assert re.search(r"[Tt]ask:? ?1\b|task:1|stopped sending heartbeats\):\s*1\b", out0), out0[-3000:]
  # The restart resumed after step 1 and ran only step 2; that it continued exactly is the
  # comparison in test_rl_two_processes_match_one.
  assert "resumed at RL step 1" in runs["restart"]
  got = _metrics(runs["rl", 2], "metrics")
  assert sorted(got) == [1, 2]
