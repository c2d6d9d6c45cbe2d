"""The ahead-of-time planner on a tiny Qwen3 over 8 fake CPU devices (tests/conftest.py)."""

import dataclasses
import glob
import math
import os
import subprocess
import sys

import jax
import pytest

from configs import common
from rstar_jax.config import from_config_dict
from rstar_jax.planning import plan as plan_lib
from rstar_jax.sharding.mesh import make_mesh

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_cfg(layers=2, remat=True, micro=2):
  import ml_collections

  c = ml_collections.ConfigDict()
  c.mode = "rl"
  c.model = common.model_config(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=layers,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
  )
  c.model.remat = remat
  c.mesh = common.mesh_config(data=1, fsdp=8, tensor=1)
  c.rl = common.rl_config()
  c.rl.group_size = 4
  c.rollout = common.rollout_config()
  c.rollout.max_prompt_tokens = 32
  c.rollout.response_budget = 32
  c.train = common.train_config()
  c.train.batch_prompts = 4
  c.train.micro_batches = micro
  c.optim = common.optim_config()
  c.stages = []
  return from_config_dict(c, check_inputs=False)  # planning needs no data or stages


def run_plan(cfg, sizes, hw=plan_lib.Hardware(), kind="rl"):
  mesh = make_mesh(sizes, jax.devices()[:8])
  shape = plan_lib.rl_shape(cfg, dict(mesh.shape))
  if kind == "sft":
    shape = dataclasses.replace(shape, kind="sft")
  return plan_lib.make_plan(cfg, mesh, hw, [shape])


@pytest.fixture(scope="module")
def fsdp8():
  return run_plan(tiny_cfg(), {"fsdp": 8})


@pytest.fixture(scope="module")
def fsdp4_data2():
  return run_plan(tiny_cfg(), {"data": 2, "fsdp": 4})


def direct_state_bytes(plan, shards):
  # params + Adam mu + nu, all float32, split evenly over `shards` devices.
  return 3 * 4 * plan["param_count"] / shards


# Replicated leaves (norm scales, step/count scalars, rng) add a little on top of the even
# split; for this model they are < 1 % of the state.
TOL = 0.03


def test_state_bytes_match_direct_count(fsdp8):
  r = fsdp8["steps"]["rl"]
  direct = direct_state_bytes(fsdp8, 8)
  assert r["state_bytes"] == pytest.approx(direct, rel=TOL)
  # XLA's own argument size (state + batch shard) agrees with the direct count too.
  assert r["argument_bytes"] - r["batch_bytes"] == pytest.approx(direct, rel=TOL)
  # Donation: the new state reuses the old state's buffers.
  assert r["alias_bytes"] >= 0.9 * r["state_bytes"]


def test_mesh_change_changes_bytes_as_sharding_predicts(fsdp8, fsdp4_data2):
  a, b = fsdp8["steps"]["rl"], fsdp4_data2["steps"]["rl"]
  # Weights are split over fsdp only: 4-way instead of 8-way doubles the state per device.
  assert b["argument_bytes"] - b["batch_bytes"] == pytest.approx(
    direct_state_bytes(fsdp4_data2, 4), rel=TOL
  )
  ratio = (b["argument_bytes"] - b["batch_bytes"]) / (a["argument_bytes"] - a["batch_bytes"])
  assert ratio == pytest.approx(2.0, rel=TOL)
  # Batch rows are split over data x fsdp = 8 in both meshes: same batch bytes per device.
  assert a["batch_bytes"] == b["batch_bytes"]


TINY_HBM = plan_lib.Hardware(hbm_gib=1e-6)


@pytest.fixture(scope="module")
def unscanned_tiny_hbm():
  # One layer, one micro-batch, no remat (every scan has trip count 1), on a 1 KiB "HBM".
  return run_plan(tiny_cfg(layers=1, remat=False, micro=1), {"fsdp": 8}, hw=TINY_HBM)


def test_impossible_hbm_does_not_fit(unscanned_tiny_hbm, fsdp8):
  plan = unscanned_tiny_hbm
  assert plan["fits"] is False
  assert plan["headroom_bytes"] < 0
  assert plan["per_device_bytes"] > TINY_HBM.hbm_gib * TINY_HBM.mem_fraction * plan_lib.GIB
  # The same kind of model on the default 192 GiB fits.
  assert fsdp8["fits"] is True and fsdp8["headroom_bytes"] > 0


def test_analytic_flops_match_xla_without_loops(unscanned_tiny_hbm):
  # Every scan has trip count 1, so XLA's cost analysis (which counts a loop body once) sees
  # all the work. It also counts elementwise ops and the optimizer, which the analytic
  # matmul/attention count leaves out: allow 15 %.
  r = unscanned_tiny_hbm["steps"]["rl"]
  xla_total = r["xla_flops_raw"] * 8
  print("analytic / xla flops", r["flops_per_step"] / xla_total)
  assert r["flops_per_step"] == pytest.approx(xla_total, rel=0.15)
  assert r["flops_per_step"] == r["model_flops_per_step"]  # no remat


def test_remat_adds_one_layer_forward():
  c = plan_lib.qwen3.Qwen3Config(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    remat=True,
  )
  shape = plan_lib.StepShape(kind="rl", rows=8, seq_len=64, num_micro_batches=2)
  f = plan_lib.step_flops(c, shape)
  fw = plan_lib.forward_flops_per_row(c, 64)
  assert f["hardware"] - f["model"] == pytest.approx(fw["layers"] * 8)
  assert plan_lib.param_count(c) == sum(
    math.prod(s)
    for s in jax.tree.leaves(plan_lib.qwen3.param_shapes(c), is_leaf=lambda x: isinstance(x, tuple))
  )


def test_presets_have_the_published_sizes():
  for name, billions in (("qwen3-14b", 14.77), ("qwen3-4b", 4.02)):
    c = plan_lib.qwen3.Qwen3Config(**plan_lib.PRESETS[name])
    assert plan_lib.param_count(c) / 1e9 == pytest.approx(billions, abs=0.01)


def test_collective_counter():
  hlo = (
    "%a = f32[8]{0} all-gather(f32[1]{0} %p), dimensions={0}\n"
    "%b = f32[8]{0} all-reduce-start(f32[8]{0} %a), to_apply=%add\n"
    "%c = f32[8]{0} all-reduce-done(f32[8]{0} %b)\n"
  )
  got = plan_lib.count_collectives(hlo)
  assert got["all-gather"] == 1 and got["all-reduce"] == 1 and got["reduce-scatter"] == 0


def test_launch_scripts_parse():
  scripts = glob.glob(os.path.join(REPO, "third_party", "rocm", "*.sh"))
  assert len(scripts) >= 4, scripts
  for s in scripts:
    out = subprocess.run(["bash", "-n", s], capture_output=True, text=True)
    assert out.returncode == 0, (s, out.stderr)


@pytest.mark.parametrize("script", ["learner.sh", "sglang_servers.sh", "router.sh", "code_pool.sh"])
def test_launch_scripts_help(script):
  out = subprocess.run(
    ["bash", os.path.join(REPO, "third_party", "rocm", script), "--help"],
    capture_output=True,
    text=True,
    timeout=30,
  )
  assert out.returncode == 0, out.stderr
  assert "Usage" in out.stdout


def test_plan_launcher_help():
  out = subprocess.run(
    [sys.executable, "-m", "launchers.plan", "--help"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode in (0, 1), out.stderr  # absl exits 1 after printing --help
  assert "--num_devices" in out.stdout and "--hbm_gib" in out.stdout


TINY_CONFIG_FILE = """
import ml_collections
from configs import common


def get_config(mode="rl"):
  c = ml_collections.ConfigDict()
  c.mode = mode
  c.model = common.model_config(vocab_size=256, hidden_size=64, intermediate_size=128,
                                num_hidden_layers=1, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16)
  c.mesh = common.mesh_config(data=1, fsdp=-1, tensor=1)
  c.train = common.train_config()
  c.train.micro_batches = 1
  c.optim = common.optim_config()
  c.sft = ml_collections.ConfigDict(dict(batch_size=8, max_seq_len=32))
  return c
"""


def test_plan_launcher_writes_json(tmp_path):
  # End to end through the launcher: --num_devices reaches XLA before jax starts, and an HBM
  # too small for anything gives fits: false in plan.json.
  cfg_file = tmp_path / "tiny_cfg.py"
  cfg_file.write_text(TINY_CONFIG_FILE)
  out = tmp_path / "plan.json"
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "launchers.plan",
      f"--config={cfg_file}:sft",
      "--num_devices=4",
      "--steps=sft",
      "--hbm_gib=1e-9",
      f"--out={out}",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
  )
  assert r.returncode == 0, r.stderr[-2000:]
  import json

  plan = json.loads(out.read_text())
  assert plan["num_devices"] == 4 and plan["mesh"]["fsdp"] == 4
  assert plan["fits"] is False
  assert plan["per_device_bytes"] > 0 and plan["flops_per_step"] > 0
  assert plan["param_count"] == 256 * 64 + 64 + 1 * (
    64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64 + 2 * 16
  )
  assert "fits" in r.stdout and "sft" in r.stdout


def test_blockwise_attention_flops_count_only_causal_blocks():
  c = plan_lib.qwen3.Qwen3Config(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
  )
  t = 1024
  dense = plan_lib.forward_flops_per_row(c, t)["layers"]
  blk = plan_lib.forward_flops_per_row(
    c.replace(attention="blockwise", attention_block_size=256), t
  )["layers"]
  attn = 2 * 2 * t * t * 4 * 32 * 2  # full T x T, 2 layers
  assert dense - blk == pytest.approx(attn * (1 - 5 / 8))  # 4 blocks: 10 of 16 visited


def test_packed_plan_compiles_packed_inputs_and_scales_flops():
  cfg = tiny_cfg()
  cfg = dataclasses.replace(
    cfg, model=dataclasses.replace(cfg.model, attention="blockwise", attention_block_size=16)
  )
  p = run_plan(cfg, {"fsdp": 8}, hw=plan_lib.Hardware(packed_fill=0.5))
  r = p["steps"]["rl"]
  # 16 rows in 2 micro-batches of 8; half as many rows packed = 1 micro-batch of 8.
  assert r["packed"]["rows"] == 8 and r["packed"]["micro_batches"] == 1
  assert r["packed"]["flops_per_step"] == pytest.approx(r["flops_per_step"] / 2)
  assert p["flops_per_step_packed"] == r["packed"]["flops_per_step"]
  assert r["batch_bytes"] > 0 and p["fits"]
  with pytest.raises(ValueError, match="packed_fill"):
    plan_lib.Hardware(packed_fill=1.5)


def test_lora_plan_reports_memory_saved_against_full_finetuning():
  cfg = tiny_cfg()
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_rank=4))
  plan = run_plan(cfg, {"fsdp": 8})
  lo, r = plan["lora"], plan["steps"]["rl"]
  n = plan["param_count"]
  # LoRA state: the frozen f32 base (no moments) + adapters with Adam's mu and nu.
  # r * (in + out) per adapted kernel: q, k, v, o, gate, up, down; 2 layers, r = 4.
  per_layer = (128 + 128) + 2 * (128 + 64) + (128 + 128) + 3 * (128 + 256)
  assert lo["adapter_params"] == 2 * 4 * per_layer
  # LoRA state: the frozen f32 base split 8 ways with no moments, plus the adapters with
  # Adam's mu and nu (split like their kernels' non-rank axis: some are replicated here).
  base_share, adapters = 4 * n / 8, 3 * 4 * lo["adapter_params"]
  assert base_share + adapters / 8 <= r["state_bytes"] * (1 + TOL)
  assert r["state_bytes"] <= (base_share + adapters) * (1 + TOL)
  assert lo["full_finetune_state_bytes"]["rl"] == pytest.approx(
    direct_state_bytes(plan, 8), rel=TOL
  )
  assert (
    lo["saved_bytes"]["rl"] == lo["full_finetune_per_device_bytes"]["rl"] - r["per_device_bytes"]
  )
  assert lo["saved_bytes"]["rl"] > 0.3 * lo["full_finetune_state_bytes"]["rl"]
  assert "LoRA r=4" in plan_lib.format_table(plan)


def test_moe_preset_sizes_and_active_flops():
  c = plan_lib.Qwen3MoeConfig(**plan_lib.PRESETS["qwen3-30b-a3b"])
  # Qwen3-30B-A3B: 30.5 B parameters, 3.3 B active per token (embedding included).
  assert plan_lib.param_count(c) / 1e9 == pytest.approx(30.53, abs=0.01)
  fw = plan_lib.forward_flops_per_row(c, 1)
  d, f, k, L = 2048, 768, 8, 48
  assert fw["experts"] == L * 2 * 3 * d * f * k  # the k active experts, not all E
  active = (fw["layers"] + fw["logits"]) / 2 + c.vocab_size * d  # + the embedding lookup
  assert active / 1e9 == pytest.approx(3.3, abs=0.1)
  # Expert parallel P: the worst-case exchange buffer runs P x the routed rows.
  shape = plan_lib.StepShape(kind="rl", rows=8, seq_len=64, num_micro_batches=1)
  one, ep8 = plan_lib.step_flops(c, shape), plan_lib.step_flops(c, shape, 8)
  assert ep8["model"] == one["model"]
  c = c.replace(remat=True)
  one, ep8 = plan_lib.step_flops(c, shape), plan_lib.step_flops(c, shape, 8)
  extra = plan_lib.forward_flops_per_row(c, 64)["experts"] * 7 * 8 * (3 + 1)  # fwd+bwd+remat
  assert ep8["hardware"] - one["hardware"] == pytest.approx(extra)


def test_moe_plan_compiles_the_expert_parallel_exchange(monkeypatch):
  monkeypatch.setitem(
    plan_lib.PRESETS,
    "tiny-moe",
    dict(
      vocab_size=512,
      hidden_size=64,
      intermediate_size=128,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=16,
      rope_theta=1e4,
      tie_word_embeddings=False,
      max_position_embeddings=4096,
      num_experts=8,
      num_experts_per_tok=2,
      moe_intermediate_size=32,
    ),
  )
  cfg = tiny_cfg()
  cfg = dataclasses.replace(cfg, plan=dataclasses.replace(cfg.plan, model_preset="tiny-moe"))
  plan = run_plan(cfg, {"expert": 8})
  r = plan["steps"]["rl"]
  assert plan["model"]["num_experts"] == 8 and plan["mesh"]["expert"] == 8
  # The token exchange is in the program (the CPU all-to-all is a tuple whose shape holds
  # /*index=5*/ comments), and the experts' state is split 8 ways.
  assert r["collectives"]["all-to-all"] > 0
  assert r["flops_per_step"] > r["model_flops_per_step"]
