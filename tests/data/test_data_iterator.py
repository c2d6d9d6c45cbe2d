"""EpochIterator: deterministic epochs from a seed, exact resume from a saved state."""

import json

import numpy as np
import pytest

from rstar_jax.data.iterator import EpochIterator, epoch_permutation

ITEMS = [f"item{i}" for i in range(7)]


def test_epochs_are_permutations_fixed_by_seed():
  it = EpochIterator(ITEMS, seed=3)
  e0, e1 = it.next_batch(7), it.next_batch(7)
  assert sorted(e0) == sorted(ITEMS) == sorted(e1)
  assert e0 != e1  # reshuffled per epoch
  assert EpochIterator(ITEMS, seed=3).next_batch(14) == e0 + e1
  assert EpochIterator(ITEMS, seed=4).next_batch(14) != e0 + e1
  assert e0 == [ITEMS[i] for i in epoch_permutation(3, 0, 7)]
  assert EpochIterator(ITEMS, seed=3, shuffle=False).next_batch(9) == ITEMS + ITEMS[:2]


@pytest.mark.parametrize("stop", [0, 1, 6, 7, 8, 13, 17])
def test_resume_equals_uninterrupted(stop):
  straight = EpochIterator(ITEMS, seed=11).next_batch(30)
  first = EpochIterator(ITEMS, seed=11)
  head = [next(first) for _ in range(stop)]
  state = json.loads(json.dumps(first.state_dict()))  # checkpoints store it as JSON
  resumed = EpochIterator.from_state(list(ITEMS), state)
  assert (resumed.epoch, resumed.index) == (first.epoch, first.index)
  assert head + resumed.next_batch(30 - stop) == straight


def test_state_is_plain_and_checked():
  it = EpochIterator(ITEMS, seed=1)
  it.next_batch(9)
  st = it.state_dict()
  assert st["epoch"] == 1 and st["index"] == 2 and st["num_items"] == 7
  with pytest.raises(ValueError, match="num_items"):
    EpochIterator.from_state(ITEMS[:-1], st)
  with pytest.raises(ValueError, match="fingerprint"):
    EpochIterator.from_state(ITEMS[::-1], st)
  assert EpochIterator.from_state(ITEMS[::-1], st, check_fingerprint=False).index == 2
  with pytest.raises(ValueError, match="missing"):
    EpochIterator.from_state(ITEMS, {k: v for k, v in st.items() if k != "seed"})
  with pytest.raises(ValueError, match="non-empty"):
    EpochIterator([], seed=0)


def test_epoch_permutation_distinct_seeds_do_not_shift():
  # seed s epoch 1 must not equal seed s+1 epoch 0 (a `seed + epoch` scheme would make them equal).
  assert not np.array_equal(epoch_permutation(5, 1, 50), epoch_permutation(6, 0, 50))
