"""Runs the snippet "GRPO-RoC transforms from another JAX codebase" of docs/library.md verbatim."""

import textwrap

SNIPPET = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from rstar_jax.rl import roc, advantages, losses

    B, G, T = 2, 4, 5  # prompts, kept rollouts, tokens
    key = jax.random.PRNGKey(0)
    rewards = jnp.array(
      [
        [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0],  # [B, 2G] binary outcomes
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
      ]
    )
    penalties = jnp.linspace(0.0, 1.5, 2 * G)[None].repeat(B, 0)  # p_err + p_format per rollout

    keep = roc.informative_groups(rewards)  # [B] bool: drop all-correct/all-wrong
    idx = roc.roc_downsample(key, rewards, penalties, group_size=G, mode="paper")  # [B, G]
    adv = advantages.grpo_advantages(roc.gather_groups(rewards, idx))  # [B, G]

    # Your model supplies per-token log-probs of the kept rollouts, flattened to N = B*G rows.
    logp = jax.random.normal(key, (B * G, T)) * 0.1 - 1.0
    old_logp = jax.lax.stop_gradient(logp)
    loss_mask = jnp.repeat(keep, G)[:, None] * jnp.ones((1, T))  # also 0 on tool tokens
    loss_fn = lambda lp: losses.policy_loss(lp, old_logp, adv.reshape(-1), loss_mask)
    (loss, metrics), grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(logp)
    print(float(loss), {k: float(v) for k, v in losses.reduce_metrics(metrics).items()})
""")


def test_readme_snippet_runs(capsys):
  namespace = {}
  exec(compile(SNIPPET, "README-snippet", "exec"), namespace)
  out = capsys.readouterr().out
  assert "clip_frac" in out
  # The all-correct second group is dropped, so its rows get no gradient.
  assert float(abs(namespace["grad"][4:]).sum()) == 0.0
  assert bool(namespace["keep"][0]) and not bool(namespace["keep"][1])


def test_readme_holds_this_snippet():
  import pathlib

  readme = pathlib.Path(__file__).resolve().parents[2] / "docs" / "library.md"
  assert SNIPPET.strip() in readme.read_text(), (
    "docs/library.md's GRPO-RoC snippet drifted from the test"
  )
