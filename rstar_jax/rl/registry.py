"""Name -> function registry so configs select algorithm pieces by string.

Kinds used by the library (the config field that names each):

    policy_loss   rl.policy_loss     (logp, old_logp, adv, loss_mask, **kw) -> (loss, metrics)
    advantage     rl.advantage       (selected_rewards [B, G], eps=, unbiased_std=, valid=) -> [B, G]
    downsample    rl.roc_mode        (key, rewards [B, N], penalties [B, N], *, group_size,
                                      min_pos, min_neg, eps) -> kept indices [B, G] int32
    sft_loss      sft.loss           (logits, targets, loss_mask, *, normalizer) -> (loss, metrics)
    off_policy_loss rl.off_policy_loss (logp, prox_logp, behav_logp, adv, loss_mask, *, cap,
                                      **policy_loss kw) -> (loss, metrics); used when rl.tis_cap > 0

A user registers their own and selects it from a recipe (``--config.rl.policy_loss=my_loss``):

    from rstar_jax.rl import losses, registry

    @registry.register("policy_loss", "my_loss")
    def my_loss(logp, old_logp, adv, loss_mask, **kw):
        return losses.policy_loss(logp, old_logp, adv, loss_mask, **kw)

Re-registration: registering the *same* function again (same module and qualified name, as
after ``importlib.reload`` or notebook autoreload) replaces the entry silently. Registering a
*different* function under a taken name raises ``ValueError`` unless ``override=True``.
"""

from __future__ import annotations

from collections.abc import Callable

_REGISTRY: dict[str, dict[str, Callable]] = {}


def _same_function(a: Callable, b: Callable) -> bool:
  key = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))
  return a is b or (key(a) == key(b) and key(a)[1] is not None)


def register(kind: str, name: str, *, override: bool = False) -> Callable[[Callable], Callable]:
  """Decorator registering ``fn`` under (kind, name) (module docstring: re-registration)."""

  def deco(fn: Callable) -> Callable:
    table = _REGISTRY.setdefault(kind, {})
    old = table.get(name)
    if old is not None and not override and not _same_function(old, fn):
      raise ValueError(
        f"registry: {kind}/{name!r} is already registered to {old!r}; "
        "pass override=True to replace it"
      )
    table[name] = fn
    return fn

  return deco


def get(kind: str, name: str) -> Callable:
  """The function registered under (kind, name); KeyError lists the known names."""
  table = _REGISTRY.get(kind, {})
  if name not in table:
    raise KeyError(f"registry: no {kind} named {name!r}; known: {names(kind)}")
  return table[name]


def names(kind: str) -> list[str]:
  """Registered names of ``kind`` in registration order (built-ins first: importing this module
  runs ``rstar_jax/rl/__init__.py`` first, which imports every module that registers)."""
  return list(_REGISTRY.get(kind, {}))
