"""The NNX wrapper runs the same function as the functional API and trains with nnx.Optimizer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rstar_jax.models import qwen3
from rstar_jax.models.qwen3_nnx import Qwen3ForCausalLM


def test_nnx_wrapper_matches_functional_and_trains():
  config = qwen3.Qwen3Config(
    vocab_size=40,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
  )
  params = qwen3.init_params(config, jax.random.key(0))
  model = Qwen3ForCausalLM(config, params)
  ids = jnp.array([[1, 2, 3, 4]], jnp.int32)
  np.testing.assert_array_equal(model(ids), qwen3.forward(params, config, ids))
  _, state = nnx.split(model, nnx.Param)
  assert jax.tree.structure(state.to_pure_dict()["params"]) == jax.tree.structure(params)

  opt = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt):
    loss, grads = nnx.value_and_grad(lambda m: -jax.nn.log_softmax(m(ids))[0, :-1, 5].mean())(model)
    opt.update(model, grads)
    return loss

  losses = [float(step(model, opt)) for _ in range(3)]
  assert losses[-1] < losses[0]
  assert not np.allclose(model.pure_params()["norm"]["scale"], params["norm"]["scale"])
