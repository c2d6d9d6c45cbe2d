"""Training pipelines: SFT, the GRPO-RoC RL loop with stages, evaluation (see README.md).

    from rstar_jax.config import from_config_dict
    from rstar_jax.pipelines import sft_loop, rl_loop, evaluation
    sft = sft_loop.run_sft(from_config_dict(sft_cfg, "sft"), workdir)   # -> {"hf_dir", ...}
    rl = rl_loop.run_rl(from_config_dict(rl_cfg, "rl"), workdir, params=..., tokenizer=...)
    report = evaluation.run_eval(from_config_dict(eval_cfg, "eval"), "report.json")

Library pieces: `rl_loop.RLLoop` (one step = `RLLoop.step`, a sequence of stage methods),
`wiring.group_source` (groups: `rstar_jax.rollout.groups` / `sources`), `stages.build_hard_subset`, `rl_metrics.CollapseMonitor`,
`evaluation.evaluate`, `wiring.open_runner` (a `rollout.agent_runner.AgentRunner` on the
config's engine and code pool).
"""
