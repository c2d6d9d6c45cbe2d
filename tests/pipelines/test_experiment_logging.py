"""Experiment logging (issue 32 part 4, issue 29 row 14): sample rollouts to every sink, the
optional W&B logger in offline mode (no network), and the metrics.jsonl schema of
docs/metrics.md covering every key the RL and SFT loops write."""

import asyncio
import glob
import importlib.util
import json
import os
import re
import struct
import sys
import time

import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import ConfigError, from_config_dict
from rstar_jax.data import synthetic_tasks
from rstar_jax.data.problems import Problem
from rstar_jax.errors import UserError
from rstar_jax.pipelines import data_sources, metrics_log, rl_loop, sft_loop, wiring
from rstar_jax.pipelines.metrics_log import MetricsWriter, read_jsonl_metrics
from rstar_jax.rollout.types import ToolCallRecord, Trajectory

HAVE_WANDB = importlib.util.find_spec("wandb") is not None
needs_wandb = pytest.mark.skipif(
  not HAVE_WANDB, reason="wandb is not installed (optional extra: pip install rstar_jax[wandb])"
)


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
  """W&B with no network and nothing written outside the test's folder."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  for var, sub in (
    ("WANDB_CONFIG_DIR", "cfg"),
    ("WANDB_CACHE_DIR", "cache"),
    ("WANDB_DATA_DIR", "data"),
  ):
    monkeypatch.setenv(var, str(tmp_path / "wandb_home" / sub))
  monkeypatch.delenv("WANDB_API_KEY", raising=False)


def tb_records(directory):
  """(tag, step, value) of every summary value in the TensorBoard event files under
  ``directory``: TFRecord framing (u64 length, u32 crc, data, u32 crc) of `Event` protos."""
  from tensorboardX.proto import event_pb2

  out = []
  for path in sorted(glob.glob(os.path.join(directory, "**", "events.out.*"), recursive=True)):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
      (n,) = struct.unpack("<Q", data[pos : pos + 8])
      ev = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
      pos += 12 + n + 4
      for v in ev.summary.value:
        text = v.tensor.string_val[0].decode() if v.tensor.string_val else None
        out.append((v.tag, ev.step, text if text is not None else v.simple_value))
  return out


def wandb_run_dirs(directory):
  return sorted(glob.glob(os.path.join(directory, "wandb", "offline-run-*")))


def wandb_run_ids(directory):
  """Run id of each offline run folder (``offline-run-<date>_<time>-<id>``, W&B adding ``-1``
  when a resumed run starts within the same second)."""
  return [
    re.match(r"offline-run-\d{8}_\d{6}-([0-9a-f]+)", os.path.basename(d)).group(1)
    for d in wandb_run_dirs(directory)
  ]


def wandb_log_has(run_dir, *needles: bytes, timeout_s: float = 60.0) -> bool:
  """Whether the offline run's record file holds every needle. W&B's service process writes
  the file after ``finish()`` returns (about a second here), so this waits for it."""
  deadline = time.monotonic() + timeout_s
  while True:
    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    blob = open(path, "rb").read()
    if all(n in blob for n in needles) or time.monotonic() > deadline:
      return all(n in blob for n in needles)
    time.sleep(0.2)


def traj(text, calls):
  return Trajectory(
    prompt_ids=[1],
    response_ids=[2],
    loss_mask=[1],
    logprobs=[0.0],
    weight_versions=[0],
    num_turns=len(calls) + 1,
    tool_calls=[
      ToolCallRecord(s, 0.1, code, out, turn=i) for i, (s, code, out) in enumerate(calls)
    ],
    finish_reason="stop",
    response_text=text,
  )


# ----------------------------------------------------------------------------- pure pieces


def test_rollout_samples_spread_over_prompts_and_cut_long_text():
  problems = [Problem("p0", "1"), Problem("p1", "2")]
  groups = [
    [traj("r00", [("ok", "print(1)", "1")]), traj("r01", [])],
    [traj("r10" + "x" * 500, [("error", "1/0", "ZeroDivisionError" * 40)]), traj("r11", [])],
  ]
  rewards = [[1.0, 0.0], [0.0, 1.0]]
  s = metrics_log.rollout_samples(problems, groups, rewards, n=3, max_chars=100)
  # sample k: rollout k // P of prompt k % P, so the first P samples cover every prompt
  assert [(x["problem_index"], x["sample_index"]) for x in s] == [(0, 0), (1, 0), (0, 1)]
  assert [x["reward"] for x in s] == [1.0, 0.0, 0.0]
  assert s[0]["prompt"] == "p0" and s[0]["answer"] == "1" and s[0]["response"] == "r00"
  assert s[0]["tool_turns"] == [{"turn": 0, "status": "ok", "code": "print(1)", "output": "1"}]
  cut = s[1]["response"]
  assert len(cut) < 150 and cut.startswith("r10xx") and "chars cut]" in cut
  assert "chars cut]" in s[1]["tool_turns"][0]["output"]
  assert len(metrics_log.rollout_samples(problems, groups, rewards, n=10, max_chars=100)) == 4


def test_rollout_samples_carry_the_rendered_prompt():
  """Issue 43 row 14: the sample's prompt is what the policy saw (system prompt, tool block,
  chat template), decoded from the trajectory's prompt ids; the question is kept beside it."""

  class Tok:
    def decode(self, ids, skip_special_tokens=True):
      assert not skip_special_tokens  # the template's special tokens are part of the prompt
      return "<|im_start|>system ...<|im_start|>user p0<|im_start|>assistant" + str(ids)

  s = metrics_log.rollout_samples(
    [Problem("p0", "1")], [[traj("r", [])]], [[1.0]], n=1, max_chars=1000, tokenizer=Tok()
  )
  assert s[0]["prompt"] == "<|im_start|>system ...<|im_start|>user p0<|im_start|>assistant[1]"
  assert s[0]["question"] == "p0"


def test_samples_due_follows_samples_every():
  run = from_config_dict(rstar2_tiny_cpu.get_config("rl"))
  # on by default (issue 29 row 14: training never logged sample rollouts)
  assert run.log.samples_every == 10 and metrics_log.samples_due(run.log, 20)
  assert not metrics_log.samples_due(run.log, 5)
  assert not metrics_log.samples_due(type(run.log)(samples_every=0), 10)
  log3 = type(run.log)(samples_every=3)
  assert [s for s in range(1, 10) if metrics_log.samples_due(log3, s)] == [3, 6, 9]


def test_samples_reach_jsonl_and_tensorboard_and_resume_drops_later_ones(tmp_path):
  sample = metrics_log.sample_record("Compute 2+3.", "<answer>5</answer>", [], 1.0, problem_index=0)
  with MetricsWriter(tmp_path, "metrics") as w:
    for step in (1, 2, 3):
      w.write(step, {"reward_mean": step / 10})
      w.write_samples(step, [dict(sample, response=f"step {step}")])
  recs = read_jsonl_metrics(tmp_path / "metrics_samples.jsonl")
  assert [(r["step"], r["index"], r["response"]) for r in recs] == [
    (1, 0, "step 1"),
    (2, 0, "step 2"),
    (3, 0, "step 3"),
  ]
  assert recs[0]["prompt"] == "Compute 2+3." and recs[0]["reward"] == 1.0
  tb = tb_records(tmp_path / "tb")
  texts = [(step, v) for tag, step, v in tb if tag.startswith("samples/")]
  assert [s for s, _ in texts] == [1, 2, 3] and "Compute 2+3." in texts[0][1]
  assert "step 2" in texts[1][1] and "**reward** 1.0" in texts[1][1]
  assert ("reward_mean", 2) in [(t, s) for t, s, _ in tb]
  # a run that died after logging step 3 but checkpointed at 2: both files drop step 3
  with MetricsWriter(tmp_path, "metrics", resume_step=2, tensorboard=False) as w:
    pass
  assert [r["step"] for r in read_jsonl_metrics(tmp_path / "metrics_samples.jsonl")] == [1, 2]
  assert [r["step"] for r in read_jsonl_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_wandb_without_the_package_is_a_one_line_error(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.log.wandb = True
  cfg.log.wandb_mode = "disabled"  # W&B's own off switch: no run, so no package needed
  run = from_config_dict(cfg)
  assert metrics_log.sink_options(run, tmp_path, "rl")["wandb"] is None
  cfg.log.wandb_mode = "offline"
  with pytest.raises(
    ConfigError, match=r"^config.log.wandb: expected the wandb package .*missing$"
  ):
    from_config_dict(cfg)
  # a writer asked for W&B past the config check says the same in one line
  with pytest.raises(UserError, match=r"^config.log.wandb: True needs the wandb package.*\)$"):
    MetricsWriter(tmp_path, wandb={"project": "p", "name": "n-rl", "mode": "offline"})


@needs_wandb
def test_wandb_offline_run_holds_metrics_samples_and_config_and_resumes(tmp_path, wandb_offline):
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.log.wandb = True
  cfg.log.wandb_run_name = "exp7"
  run = from_config_dict(cfg)
  opts = metrics_log.sink_options(run, tmp_path, "rl")
  assert opts["wandb"]["name"] == "exp7-rl" and opts["wandb"]["mode"] == "offline"
  assert opts["wandb"]["config"]["rl"]["group_size"] == run.rl.group_size
  sample = metrics_log.sample_record("PROMPT_TEXT_7", "RESPONSE_TEXT_7", [], 1.0)
  with MetricsWriter(tmp_path, "metrics", **opts) as w:
    w.write(1, {"reward_mean_probe": 0.25})
    w.write_samples(1, [sample])
  (run_dir,) = wandb_run_dirs(tmp_path)
  run_id = open(tmp_path / "wandb" / "metrics.run_id").read().strip()
  assert run_dir.endswith("-" + run_id)
  assert wandb_log_has(run_dir, b"reward_mean_probe", b"exp7-rl", b"group_size")
  (table,) = glob.glob(os.path.join(run_dir, "files", "media", "table", "samples_*.table.json"))
  t = json.load(open(table))
  assert t["columns"][:4] == ["index", "reward", "prompt", "response"]
  assert t["data"][0][2:4] == ["PROMPT_TEXT_7", "RESPONSE_TEXT_7"]
  # a resumed writer continues the same W&B run id; a fresh one starts a new run
  with MetricsWriter(tmp_path, "metrics", resume_step=1, **opts) as w:
    w.write(2, {"reward_mean_probe": 0.5})
  assert wandb_run_ids(tmp_path) == [run_id, run_id]
  with MetricsWriter(tmp_path, "metrics", **opts):
    pass
  assert len(set(wandb_run_ids(tmp_path))) == 2


# ----------------------------------------------------------------------------- the loops


async def _alternating(trajs, answers):
  return [float(i % 2) for i in range(len(answers))]  # every group mixed: real updates


@pytest.mark.slow  # ~35 s on 2 cores: a real tiny RL run with an evaluation
def test_rl_loop_logs_samples_to_every_sink_and_its_keys_are_documented(
  tmp_path, monkeypatch, metrics_doc_check
):
  """A tiny real RL run (JaxSampler, code pool) with samples every step, a held-out eval and,
  where wandb is installed, an offline W&B run: all its metric keys are in docs/metrics.md."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_cfg"))
  monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.train.batch_prompts = 2
  cfg.rl.group_size, cfg.rl.oversample = 2, 1
  cfg.rollout.response_budget = cfg.eval.response_budget = 12
  cfg.rollout.max_turns = 1
  cfg.train.eval_every = 2
  cfg.log.samples_every, cfg.log.samples_per_step = 1, 3
  cfg.log.wandb = HAVE_WANDB
  cfg.stages = [
    dict(
      name="s",
      steps=2,
      response_budget=12,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  run = from_config_dict(cfg, "rl")
  problems = synthetic_tasks.generate(3, 40, families=["mul"], difficulty="easy")[:4]
  tok = data_sources.ensure_tokenizer(
    run, str(tmp_path / "tok"), data_sources.tokenizer_corpus(problems)
  )
  learner = wiring.build_learner(run)
  workdir = str(tmp_path / "rl")

  async def main():
    async with wiring.open_runner(run, learner.model_config, learner.params_copy(), tok) as r:
      r.rewards = _alternating
      loop = rl_loop.RLLoop(run, learner, r, workdir, problems=problems, eval_problems=problems[:2])
      await loop.run()
      loop.ckpt.close()

  asyncio.run(main())
  recs = read_jsonl_metrics(os.path.join(workdir, "metrics.jsonl"))
  keys = metrics_doc_check(recs)
  assert {"reward_mean", "kept_reward_mean", "loss", "time_step_s", "eval_accuracy"} <= keys
  samples = read_jsonl_metrics(os.path.join(workdir, "metrics_samples.jsonl"))
  assert [(s["step"], s["index"]) for s in samples] == [
    (1, 0),
    (1, 1),
    (1, 2),
    (2, 0),
    (2, 1),
    (2, 2),
  ]
  by_text = {p.problem: p.answer for p in problems}
  for s in samples:
    assert by_text[s["question"]] == s["answer"] and isinstance(s["response"], str)
    # the rendered prompt (issue 43 row 14): chat template around the question
    assert s["question"] in s["prompt"] and s["prompt"].startswith("<|im_start|>")
    assert s["reward"] == float(s["sample_index"] % 2)  # the alternating rule's reward
    assert isinstance(s["tool_turns"], list)
  assert (
    len([t for t, _, _ in tb_records(os.path.join(workdir, "tb")) if t.startswith("samples/")]) == 6
  )
  if HAVE_WANDB:
    (run_dir,) = wandb_run_dirs(workdir)
    assert wandb_log_has(run_dir, b"reward_mean", b"kept_reward_mean")
    assert len(glob.glob(os.path.join(run_dir, "files", "media", "table", "*.json"))) == 2


def test_sft_loop_keys_are_documented(tmp_path, metrics_doc_check):
  cfg = rstar2_tiny_cpu.get_config("sft")
  cfg.data.synthetic.n_train = 4
  cfg.sft.epochs, cfg.sft.batch_size, cfg.sft.max_seq_len = 1, 2, 1024
  cfg.mesh.num_devices = 1
  run = from_config_dict(cfg)
  out = sft_loop.run_sft(run, str(tmp_path / "sft"), export=False)
  assert out["steps"] == 2
  metrics_doc_check(read_jsonl_metrics(tmp_path / "sft" / "sft_metrics.jsonl"))


def test_every_documented_key_is_written_somewhere_in_the_code(metrics_doc_names):
  """The reverse direction, statically: a documented name (placeholders, the ``kept_`` /
  ``eval_`` prefixes and ``step`` aside) appears as a string in rstar_jax, so the doc does not
  keep rows for metrics that were renamed or removed."""
  root = os.path.join(os.path.dirname(__file__), "..", "..", "rstar_jax")
  src = "".join(
    open(p, encoding="utf-8").read()
    for p in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
  )
  stale = []
  assert len(metrics_doc_names) > 100
  for name in metrics_doc_names:
    if "<" in name or name in ("step", "index"):
      continue
    base = re.sub(r"^(kept_|eval_)", "", name)
    if f'"{base}"' not in src and f"{base}=" not in src and f'}}{base}"' not in src:
      stale.append(name)
  assert not stale, f"docs/metrics.md names keys no code writes: {stale}"
