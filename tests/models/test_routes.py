"""`rstar_jax.models.routes`: the route layout, host-side writes and the agreement metric."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from rstar_jax.models import routes as R
from rstar_jax.rl import losses


def test_moe_layers_follow_the_hf_rule():
  assert R.moe_layers(4) == (0, 1, 2, 3)
  assert R.moe_layers(4, decoder_sparse_step=2) == (1, 3)
  assert R.moe_layers(4, 1, mlp_only_layers=[0, 2]) == (1, 3)


def test_layout_of_a_config():
  class Cfg:
    num_hidden_layers, num_experts, num_experts_per_tok = 3, 8, 2
    decoder_sparse_step, mlp_only_layers = 1, [1]

  lay = R.layout_of(Cfg)
  assert lay.layers == (0, 2) and lay.shape == (3, 2)
  cleared = lay.dense_rows_cleared(np.zeros((4, 3, 2), np.int64))
  assert (
    cleared.dtype == np.int32 and (cleared[:, 1] == -1).all() and (cleared[:, [0, 2]] == 0).all()
  )

  class Dense:
    num_hidden_layers = 3

  assert R.layout_of(Dense) is None
  with pytest.raises(ValueError, match="outside"):
    R.RouteLayout(2, 2, (0, 2))


def test_write_routes_first_report_wins_and_sentinel_never_erases():
  dst = R.empty_routes(5, (1, 2))
  R.write_routes(dst, 1, np.array([[[3, 4]], [[5, 6]]]))
  np.testing.assert_array_equal(dst[:, 0], [[-1, -1], [3, 4], [5, 6], [-1, -1], [-1, -1]])
  # A later report: position 1 again, recomputed differently (the first report, which its
  # next token was sampled with, stays), position 2 unreported (kept), 3 new, and positions
  # past the end (an output cut by the budget) dropped.
  later = np.array([[[7, 8]], [[-1, -1]], [[1, 0]], [[2, 2]], [[9, 9]], [[9, 9]]])
  R.write_routes(dst, 1, later)
  np.testing.assert_array_equal(dst[:, 0], [[-1, -1], [3, 4], [5, 6], [1, 0], [2, 2]])
  with pytest.raises(ValueError, match="routes of shape"):
    R.write_routes(dst, 0, np.zeros((2, 2, 2), np.int32))


class AgreementTest(parameterized.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_sets_compare_order_free_and_sentinels_are_excluded(self):
    # 1 row x 5 tokens, 3 layers (layer 1 dense: NO_ROUTE from both sides), top 2.
    d = [-1, -1]
    engine = jnp.array(
      [
        [
          [[1, 2], d, [3, 4]],  # learner agrees, in another order
          [[1, 2], d, [3, 4]],  # learner differs at layer 2
          [d, d, d],  # no recorded route: excluded
          [[5, 6], d, [0, 7]],  # masked out
          [[1, 3], d, d],  # recorded at layer 0 only: counted there
        ]
      ]
    )
    learner = jnp.array(
      [
        [
          [[2, 1], d, [4, 3]],
          [[1, 2], d, [3, 5]],
          [[0, 0], d, [0, 0]],
          [[5, 6], d, [0, 7]],
          [[3, 1], d, [0, 1]],
        ]
      ]
    )
    mask = jnp.array([[1, 1, 1, 0, 1]])
    fn = self.variant(lambda a, b, m: R.agreement_sums(a, b, m, layers=(0, 2)))
    got = {k: float(v) for k, v in losses.reduce_metrics(fn(learner, engine, mask)).items()}
    assert got == pytest.approx(
      {"routing/agree": 2 / 3, "routing/agree_layer0": 1.0, "routing/agree_layer2": 0.5}
    )

  def test_nothing_recorded_is_nan_not_agreement(self):
    e = jnp.full((1, 2, 1, 2), -1)
    got = losses.reduce_metrics(R.agreement_sums(jnp.zeros_like(e), e, jnp.ones((1, 2))))
    assert np.isnan(float(got["routing/agree"]))
