"""Optional Flax NNX face of the functional Qwen3, for NNX codebases.

The functional API in ``qwen3`` is the source of truth; this module only holds its params as
``nnx.Param`` variables so ``nnx.Optimizer``, ``nnx.jit`` and ``nnx.split`` work on it, and
``pure_params`` / ``nnx.split`` give the plain pytree back.
"""

from __future__ import annotations

import jax
from flax import nnx

from rstar_jax.models import qwen3


class Qwen3ForCausalLM(nnx.Module):
  """NNX module wrapping ``qwen3.forward`` over ``params`` held as ``nnx.Param`` leaves."""

  def __init__(
    self, config: qwen3.Qwen3Config, params: dict | None = None, *, rngs: nnx.Rngs | None = None
  ):
    if params is None:
      if rngs is None:
        raise ValueError("Qwen3ForCausalLM needs params or rngs")
      params = qwen3.init_params(config, rngs.params())
    self.config = config
    self.params = nnx.data(jax.tree.map(nnx.Param, params))

  def pure_params(self) -> dict:
    """The plain nested-dict param pytree (what the functional API takes)."""
    return jax.tree.map(
      lambda v: v[...], self.params, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )

  def __call__(self, input_ids, positions=None, attention_mask=None):
    return qwen3.forward(self.pure_params(), self.config, input_ids, positions, attention_mask)
