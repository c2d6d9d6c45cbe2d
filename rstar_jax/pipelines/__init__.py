"""Training pipelines: SFT, the GRPO-RoC RL loop with stages, evaluation (see README.md).

    from rstar_jax.pipelines import sft_loop, rl_loop, evaluation
    sft = sft_loop.run_sft(sft_config, workdir)                 # -> {"hf_dir", "learner", ...}
    rl = rl_loop.run_rl(rl_config, workdir, params=..., tokenizer=...)
    report = evaluation.run_eval(eval_config, "report.json", params=..., tokenizer=...)

Library pieces: `rl_loop.RLLoop` (one step = `RLLoop.step`), `rl_loop.select_rollouts`,
`stages.build_hard_subset`, `rl_metrics.CollapseMonitor`, `evaluation.evaluate`,
`agent_runner.AgentRunner` / `open_runner`, `config_validation.validate_config`.
"""
