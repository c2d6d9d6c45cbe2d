"""The CPU demo: config, prompt/SFT token agreement, and a smoke run of every phase through the
launcher (tiny `configs/demo.py:smoke`), stopped after one RL step and resumed."""

import asyncio
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import demo as demo_config
from rstar_jax.config import from_config_dict
from rstar_jax.data import coldstart
from rstar_jax.data.problems import Problem
from rstar_jax.data.sft_data import load_sft_jsonl
from rstar_jax.errors import UserError
from rstar_jax.pipelines import demo, wiring
from rstar_jax.tokenization import bpe, chat_format, domain

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_config_derives_valid_sft_and_rl_configs():
  for variant in ("", "smoke"):
    run = from_config_dict(demo_config.get_config(variant))
    sft, rl = demo._derived(run, "sft"), demo._derived(run, "rl")
    assert sft.mode == "sft" and not sft.stages and rl.mode == "rl" and rl.stages
    assert sft.optim == run.sft_optim and sft.optim.lr != run.optim.lr
    from_config_dict(sft)  # still satisfies the SFT inputs check
  full = demo_config.get_config()
  assert full.eval.max_problems >= 200 and full.data.synthetic.n_eval >= 200
  with pytest.raises(UserError, match="unknown variant 'huge'; expected one of '', 'smoke'"):
    demo_config.get_config("huge")


def test_runner_prompt_equals_the_sft_rendering(tmp_path):
  """The prompt the RL/eval runner sends is the prompt part of the SFT sequences, and the
  domain tokens are whole tokens that decode back to the same text."""
  cfg = from_config_dict(demo_config.get_config("smoke"))
  p = Problem("Compute 12 * 34.", "408", "mul", {"a": 12, "b": 34}, "print(12 * 34)")
  chat = coldstart.ChatExample(
    messages=(
      {"role": "system", "content": demo._system_prompt(cfg)},
      {"role": "user", "content": p.problem},
      {
        "role": "assistant",
        "content": "x</reason>",
        "tool_calls": [
          {
            "function": {
              "name": chat_format.TOOL_NAME,
              "arguments": {"code": p.solution_code, "input": ""},
            }
          }
        ],
      },
      {"role": "tool", "content": "Tool call success\nstdout: 408"},
      {"role": "assistant", "content": "<answer>\\boxed{408}</answer>"},
    )
  )
  tok = domain.train_domain_tokenizer(
    coldstart.chat_texts([chat]) * 5, 400, str(tmp_path / "tok"), domain.domain_tokens()
  )
  assert len(tok) <= 400 and all(tok.convert_tokens_to_ids(t) < 400 for t in domain.domain_tokens())
  # The same runner class the RL loop uses, built from the same config.
  runner = wiring.make_runner(cfg, None, None, tok)
  assert runner.system_prompt == cfg.rollout.system_prompt and not runner.with_tools
  assert not runner.show_tool_time
  ((ids, mask),) = coldstart.render_examples(tok, [chat], with_tools=cfg.rollout.with_tools)
  prompt = runner.prompt_ids(p)
  assert ids[: len(prompt)] == prompt and sum(mask[: len(prompt)]) == 0
  head_id = tok.convert_tokens_to_ids(domain.domain_tokens()[1])
  assert (
    ids.count(head_id) == 1
    and tok.decode(ids, skip_special_tokens=False).count(
      '"name": "execute_python_code_with_standard_io"'
    )
    == 1
  )
  parsed = chat_format.parse_tool_calls(tok.decode(ids, skip_special_tokens=False))
  assert [c.code for c in parsed] == [p.solution_code]


def _env():
  env = dict(os.environ)
  env["XLA_FLAGS"] = os.environ.get("RSTAR_TEST_XLA_FLAGS", "")
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _launch(*args, timeout=600):  # a hang guard: with 2 test workers a run gets ~1 core
  proc = subprocess.run(
    [sys.executable, "-m", "launchers.demo", *args],
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, f"demo failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
  return proc.stdout + proc.stderr


@pytest.mark.slow
def test_demo_smoke_run_artifacts_and_resume(tmp_path):
  w = str(tmp_path / "run")
  base = [f"--workdir={w}", "--config=configs/demo.py:smoke", "--rl.roc_mode=random"]
  out1 = _launch(*base, "--config.demo.rl_max_steps=1")
  assert "stopped at step 1 of 3" in out1
  assert not os.path.exists(os.path.join(w, "summary.json"))
  rows1 = [json.loads(l) for l in open(os.path.join(w, "rl", "metrics.jsonl"))]
  assert [r["step"] for r in rows1] == [1]

  out2 = _launch(*base)
  for phase in ("data: reusing", "sft: reusing", "eval_sft: reusing", "resumed at RL step 1"):
    assert phase in out2, phase
  assert "[demo " in out2 and "[eval]" in out2  # progress lines

  summary = json.load(open(os.path.join(w, "summary.json")))
  for key in demo.SUMMARY_KEYS:
    assert key in summary, key
  assert summary["eval_problems"] == 6 and summary["rl_steps"] == 3
  assert summary["roc_mode"] == "random"
  for key in ("tool_calls_per_trajectory", "positive_tool_error_ratio"):
    assert set(summary[key]) == {"first", "last"}
    assert all(v is None or 0 <= v for v in summary[key].values())
  assert 0 <= summary["sft_eval_accuracy"] <= 1 and 0 <= summary["rl_eval_accuracy"] <= 1
  assert summary["wall_time_s"] > 0

  rows = [json.loads(l) for l in open(os.path.join(w, "rl", "metrics.jsonl"))]
  assert [r["step"] for r in rows] == [1, 2, 3]
  # Real updates (issue 29 row 5: before, every group was all-correct or all-wrong, so the
  # learner never ran and the plot was four flat lines at 0).
  assert any(r["groups_kept"] > 0 and r.get("ppo_updates", 0) > 0 for r in rows), rows
  assert max(r["reward_mean"] for r in rows) > 0
  assert all(
    "reward_mean" in r and "tool_calls_per_traj" in r and "eval_accuracy" in r for r in rows
  )
  for name in ("sft", "rl"):
    rep = json.load(open(os.path.join(w, f"eval_{name}.json")))
    assert rep["metrics"]["num_problems"] == 6 and len(rep["per_problem"]) == 6
    assert rep["settings"]["temperature"] == 0.6
  assert (
    json.load(open(os.path.join(w, "eval_sft.json")))["settings"]
    == json.load(open(os.path.join(w, "eval_rl.json")))["settings"]
  )

  chats = load_sft_jsonl(os.path.join(w, "coldstart.jsonl"))
  assert chats and all(c.num_tool_calls >= 1 for c in chats)
  stats = json.load(open(os.path.join(w, "coldstart_stats.json")))
  assert stats["kept"] == len(chats) and stats["problems"] == 4
  assert 1000 < len(bpe.load_tokenizer(os.path.join(w, "tokenizer"))) <= 1536
  for d in ("sft/hf", "rl/hf"):
    assert {"config.json", "model.safetensors"} <= set(os.listdir(os.path.join(w, d)))

  import matplotlib.image

  png = os.path.join(w, "demo_plot.png")
  assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  img = matplotlib.image.imread(png)
  assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300 and np.ptp(img) > 0

  state = json.load(open(os.path.join(w, "demo_state.json")))
  assert state["last_phase"] == "report"


def test_demo_lora_variant_keeps_sft_full_and_trains_adapters_in_rl():
  from rstar_jax.pipelines import demo_record

  run = from_config_dict(demo_config.get_config("lora"))
  sft, rl = demo._derived(run, "sft"), demo._derived(run, "rl")
  assert sft.model.lora_rank == 0 and rl.model.lora_rank == 16
  assert rl.model.lora_config(base="b").targets == tuple(run.model.lora_targets)
  # LoRA settings are not part of the SFT phase's record: a LoRA run can reuse a full SFT.
  assert not [f for f in demo_record._SFT if f.startswith("model.lora")]
  assert "model.hidden_size" in demo_record._SFT


def test_demo_moe_variant_is_the_documented_tiny_moe_with_bf16_rollouts():
  """configs/demo.py:moe is what docs/moe.md says: every layer sparse, 8 experts top 2,
  renormalised gates, learner f32, JaxSampler bf16, routes recorded, replay off by default."""
  from rstar_jax.models.qwen3_config import Qwen3MoeConfig

  run = from_config_dict(demo_config.get_config("moe"))
  mc = run.model.qwen3_config()
  assert isinstance(mc, Qwen3MoeConfig)
  assert (mc.num_experts, mc.num_experts_per_tok, mc.moe_intermediate_size) == (8, 2, 192)
  assert 2 * mc.moe_intermediate_size == mc.intermediate_size  # the dense demo's active width
  assert mc.norm_topk_prob and mc.sparse_layers == (0, 1, 2) and mc.dtype == "float32"
  assert run.rollout.dtype == "bfloat16" and run.rl.routing_metrics
  assert run.rl.routing_replay == "off"
  (dense_stage,) = from_config_dict(demo_config.get_config()).stages
  assert run.stages == (dataclasses.replace(dense_stage, steps=20),)  # half the dense demo's RL
  smoke = from_config_dict(demo_config.get_config("moe_smoke"))
  assert isinstance(smoke.model.qwen3_config(), Qwen3MoeConfig)
  assert smoke.model.num_experts == 4 and smoke.rollout.dtype == "bfloat16"


def test_rollout_dtype_is_the_jax_sampler_compute_dtype_across_pushes():
  import jax

  from rstar_jax.models import qwen3

  run = from_config_dict(demo_config.get_config("moe_smoke"))
  mc = run.model.qwen3_config()
  params = qwen3.init_params(mc, jax.random.key(0))
  eng = wiring.build_engine(run, mc, params, tokenizer=None)
  assert eng.config.dtype == "bfloat16" and mc.dtype == "float32"
  assert eng.return_routes  # rl.routing_metrics: the engine records its routes
  # The RL loop's pushes carry the learner's (f32) config: the sampler stays bf16.
  asyncio.run(eng.update_weights(mc, params))
  assert eng.config.dtype == "bfloat16" and eng.weight_version == 1
  plain = from_config_dict(demo_config.get_config("smoke"))
  pc = plain.model.qwen3_config()
  eng = wiring.build_engine(plain, pc, qwen3.init_params(pc, jax.random.key(0)), tokenizer=None)
  assert eng.config.dtype == "float32" and not eng.return_routes


def test_routing_summary_of_the_step_rows():
  rows = [
    {"step": 1, "routing/agree": 0.5, "routing/no_replay/is_ratio_max": 3.0, "reward_mean": 0.1},
    {"step": 2, "reward_mean": 0.2},  # a step without a batch logs no routing metrics
    {"step": 3, "routing/agree": 0.7, "routing/no_replay/is_ratio_max": 2.0},
  ]
  got = demo.routing_summary(rows)
  assert got["agree"] == pytest.approx({"first": 0.5, "last": 0.7, "mean": 0.6})
  assert got["no_replay/is_ratio_max"]["max"] == 3.0
  assert set(got) == {"agree", "no_replay/is_ratio_max"}
  assert demo.routing_summary([{"step": 1, "reward_mean": 0.0}]) == {}  # a dense run: nothing


def test_moe_model_fields_bad_values_are_one_line():
  from rstar_jax.config import ConfigError

  cfg = demo_config.get_config("moe")
  cfg.model.num_experts_per_tok = 9
  with pytest.raises(ConfigError, match=r"^config.model.num_experts_per_tok: expected <= num_e"):
    from_config_dict(cfg)
  cfg = demo_config.get_config("moe")
  cfg.model.mlp_only_layers = [3]
  with pytest.raises(ConfigError, match=r"^config.model.mlp_only_layers: expected layer indices"):
    from_config_dict(cfg)


@pytest.mark.long
@pytest.mark.slow
def test_demo_lora_smoke_trains_adapters_and_exports_the_merged_model(tmp_path):
  import orbax.checkpoint as ocp

  from rstar_jax.models import qwen3

  w = str(tmp_path / "run")
  # Zero-variance groups kept and an entropy term added, so every one of the smoke stage's
  # RL steps updates the adapters, whatever the rollouts.
  _launch(
    f"--workdir={w}",
    "--config=configs/demo.py:lora_smoke",
    "--config.rl.drop_zero_variance=False",
    "--config.rl.entropy_coef=0.01",
  )
  summary = json.load(open(os.path.join(w, "summary.json")))
  assert summary["rl_steps"] == 3  # the smoke stage's steps
  ck = os.path.join(w, "rl", "ckpt")
  step = max(int(d) for d in os.listdir(ck) if d.isdigit())
  meta = json.load(open(os.path.join(ck, str(step), "meta", "metadata")))
  assert meta["lora"]["rank"] == 16 and meta["lora"]["base"].endswith(os.path.join("sft", "hf"))
  saved = ocp.StandardCheckpointer().metadata(os.path.join(ck, str(step), "state"))
  tree = getattr(getattr(saved, "item_metadata", saved), "tree", saved)
  assert set(tree["params"]) == {"lora"}  # adapters only on disk
  cfg = qwen3.Qwen3Config.from_hf(os.path.join(w, "sft", "hf"))
  sft_p = qwen3.load_hf_params(os.path.join(w, "sft", "hf"), cfg)
  rl_p = qwen3.load_hf_params(os.path.join(w, "rl", "hf"), cfg)
  q_sft = np.asarray(sft_p["layers"]["self_attn"]["q_proj"]["kernel"])
  q_rl = np.asarray(rl_p["layers"]["self_attn"]["q_proj"]["kernel"])
  assert np.abs(q_rl - q_sft).max() > 0  # RL moved the merged weights
  np.testing.assert_array_equal(  # non-adapted weights are the SFT model's
    np.asarray(rl_p["embed_tokens"]["embedding"]), np.asarray(sft_p["embed_tokens"]["embedding"])
  )


@pytest.mark.long
@pytest.mark.slow
def test_demo_moe_smoke_replays_routes_and_logs_agreement(tmp_path):
  """configs/demo.py:moe_smoke with replay on, through the launcher: every RL step with a batch
  logs router agreement and the importance ratios with and without replay, the summary
  carries them, and the exported models are Qwen3-MoE checkpoints."""
  from rstar_jax.models import qwen3

  w = str(tmp_path / "run")
  _launch(
    f"--workdir={w}",
    "--config=configs/demo.py:moe_smoke",
    "--config.rl.routing_replay=rollout",
    "--config.rl.drop_zero_variance=False",  # every step updates, whatever the rollouts
    timeout=900,
  )
  rows = [json.loads(l) for l in open(os.path.join(w, "rl", "metrics.jsonl"))]
  assert [r["step"] for r in rows] == [1, 2, 3]
  for r in rows:
    assert 0 <= r["routing/agree"] <= 1 and "routing/agree_layer1" in r
    for mode in ("replay", "no_replay"):
      lo, mean, hi = (r[f"routing/{mode}/is_ratio_{s}"] for s in ("min", "mean", "max"))
      assert 0 < lo <= mean <= hi and np.isfinite(hi), (mode, r)
  summary = json.load(open(os.path.join(w, "summary.json")))
  assert summary["routing_replay"] == "rollout"
  assert {"agree", "replay/abs_log_ratio_mean", "no_replay/abs_log_ratio_mean"} <= set(
    summary["routing"]
  )
  for d in ("sft/hf", "rl/hf"):
    assert qwen3.Qwen3Config.from_hf(os.path.join(w, d)).is_moe
  # scripts/eval_demo_model.py under the run's own settings is the demo's held-out evaluation:
  # the same problems, seeds and model give the accuracy eval_rl.json holds.
  out = str(tmp_path / "eval.json")
  proc = subprocess.run(
    [sys.executable, "scripts/eval_demo_model.py", "--config=configs/demo.py:moe_smoke",
     f"--workdir={w}", "--model=rl", f"--out={out}"],
    cwd=REPO, capture_output=True, text=True, timeout=600, env=_env(),
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-2000:]
  line = json.loads(proc.stdout.strip().splitlines()[-1])
  ref = json.load(open(os.path.join(w, "eval_rl.json")))["metrics"]
  assert line["accuracy"] == pytest.approx(ref["accuracy"]) and line["rollout_dtype"] == "bfloat16"
  assert json.load(open(out))["metrics"]["accuracy"] == line["accuracy"]


class _CharTokenizer:
  """One id per character: a prompt's length is its rendered text's."""

  def encode(self, text, add_special_tokens=False):
    return [ord(ch) for ch in text]


def test_an_overlong_heldout_prompt_is_one_line_before_sft():
  tok = _CharTokenizer()
  short, long = Problem("What is 2+2?", "4"), Problem("What is " + "1+" * 40 + "1?", "41")
  c = demo_config.get_config("smoke")
  fmt = chat_format.get_format(c.rollout.chat_format)
  n = len(chat_format.prompt_ids(tok, fmt, short.problem, c.rollout.system_prompt, False))
  c.rollout.max_prompt_tokens, c.rollout.with_tools = n, False
  cfg = from_config_dict(c)
  demo.check_heldout_prompts(cfg, tok, [short])  # fits exactly
  with pytest.raises(UserError) as e:
    demo.check_heldout_prompts(cfg, tok, [short, long, long])
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(f"config.rollout.max_prompt_tokens: {n}, but 2 of 3")
  assert f"at least {n + len(long.problem) - len(short.problem)}" in msg and "1+1+" in msg


def test_reuse_sft_from_copies_the_tokenizer_and_the_sft_model_once(tmp_path):
  """`demo.reuse_sft_from` (the transport and ablation runs reuse one SFT model): the cold-start
  data, SFT evaluation, tokenizer and ``sft/hf`` are copied into the new workdir, a copy already
  there is kept, and a source without the model's folders is one line naming the field."""
  src, dst = tmp_path / "first", tmp_path / "second"
  for name in ("tokenizer", os.path.join("sft", "hf")):
    (src / name).mkdir(parents=True)
    (src / name / "made_by.txt").write_text(name)
  for name in ("coldstart.jsonl", "coldstart_stats.json", "eval_sft.json"):
    (src / name).write_text(name)
  (dst / "tokenizer").mkdir(parents=True)
  (dst / "tokenizer" / "made_by.txt").write_text("second")  # an earlier copy: kept as it is
  (dst / "eval_sft.json").write_text("second")
  demo._reuse(str(src), str(dst))
  assert (dst / "coldstart.jsonl").read_text() == "coldstart.jsonl"
  assert (dst / "coldstart_stats.json").read_text() == "coldstart_stats.json"
  assert (dst / "eval_sft.json").read_text() == "second"
  assert (dst / "sft" / "hf" / "made_by.txt").read_text() == os.path.join("sft", "hf")
  assert (dst / "tokenizer" / "made_by.txt").read_text() == "second"
  with pytest.raises(FileNotFoundError, match=r"^demo.reuse_sft_from: '.*none/tokenizer' is miss"):
    demo._reuse(str(tmp_path / "none"), str(dst))
