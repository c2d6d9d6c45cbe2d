"""A deterministic, resumable epoch iterator over an in-memory dataset.

Epoch e visits the items in the order `epoch_permutation(seed, e, n)`; the whole position is
(seed, epoch, index), so a checkpoint stores `state_dict()` (plain ints, bools and a string:
JSON/orbax friendly) and `EpochIterator.from_state(items, state)` continues with exactly the same
items. A fingerprint of the dataset guards against resuming over a different set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")

_STATE_KEYS = ("seed", "epoch", "index", "num_items", "shuffle", "fingerprint")


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  """Order of epoch `epoch`: `[n] int64`, a permutation of range(n) fixed by (seed, epoch).

  SeedSequence on the (seed, epoch) pair rather than `seed + epoch`, so runs with nearby seeds do
  not share epochs shifted by one.
  """
  if n < 0 or seed < 0 or epoch < 0:
    raise ValueError(
      f"epoch_permutation: expected non-negative seed/epoch/n, got {seed}, {epoch}, {n}"
    )
  rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
  return rng.permutation(n)


def dataset_fingerprint(items: Sequence[Any]) -> str:
  """Short hash of the items' reprs, in order (detects resuming over a changed dataset)."""
  h = hashlib.sha256()
  for it in items:
    h.update(repr(it).encode("utf-8"))
    h.update(b"\x00")
  return h.hexdigest()[:16]


class EpochIterator(Generic[T]):
  """Endless iterator over `items`, reshuffled every epoch from `seed`.

  `next(it)` returns one item; `it.next_batch(n)` returns n items (crossing epoch boundaries as
  needed). `it.epoch` / `it.index` say where the next item comes from.
  """

  def __init__(
    self, items: Sequence[T], *, seed: int = 0, shuffle: bool = True, epoch: int = 0, index: int = 0
  ):
    if len(items) == 0:
      raise ValueError("EpochIterator: expected a non-empty dataset, got 0 items")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"EpochIterator.seed: expected a non-negative int, got {seed!r}")
    if epoch < 0 or not 0 <= index <= len(items):
      raise ValueError(
        f"EpochIterator: position (epoch={epoch}, index={index}) outside a {len(items)}-item set"
      )
    self._items = items
    self._seed = int(seed)
    self._shuffle = bool(shuffle)
    self._epoch = int(epoch)
    self._index = int(index)
    self._fingerprint = dataset_fingerprint(items)
    self._order = self._order_for(self._epoch)

  def _order_for(self, epoch: int) -> np.ndarray:
    n = len(self._items)
    return epoch_permutation(self._seed, epoch, n) if self._shuffle else np.arange(n)

  @property
  def epoch(self) -> int:
    return self._epoch

  @property
  def index(self) -> int:
    return self._index

  def __iter__(self):
    return self

  def __next__(self) -> T:
    if self._index >= len(self._items):
      self._epoch += 1
      self._index = 0
      self._order = self._order_for(self._epoch)
    item = self._items[int(self._order[self._index])]
    self._index += 1
    return item

  def next_batch(self, n: int) -> list[T]:
    if n <= 0:
      raise ValueError(f"next_batch: expected n > 0, got {n}")
    return [next(self) for _ in range(n)]

  def state_dict(self) -> dict[str, Any]:
    return {
      "seed": self._seed,
      "epoch": self._epoch,
      "index": self._index,
      "num_items": len(self._items),
      "shuffle": self._shuffle,
      "fingerprint": self._fingerprint,
    }

  @classmethod
  def from_state(
    cls, items: Sequence[T], state: Mapping[str, Any], *, check_fingerprint: bool = True
  ) -> EpochIterator[T]:
    """Rebuilds the iterator at the saved position.

    Raises:
        ValueError: on a missing key, or when `items` is not the dataset the state was saved
            from (size or, with `check_fingerprint`, content).
    """
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
      raise ValueError(
        f"EpochIterator.from_state: state is missing {missing}; got keys {sorted(state)}"
      )
    if int(state["num_items"]) != len(items):
      raise ValueError(
        f"EpochIterator.from_state: field 'num_items': state was saved over {int(state['num_items'])} items, "
        f"got a dataset of {len(items)}"
      )
    it = cls(
      items,
      seed=int(state["seed"]),
      shuffle=bool(state["shuffle"]),
      epoch=int(state["epoch"]),
      index=int(state["index"]),
    )
    if check_fingerprint and it._fingerprint != str(state["fingerprint"]):
      raise ValueError(
        f"EpochIterator.from_state: field 'fingerprint': dataset content differs from the saved one "
        f"(saved {state['fingerprint']}, got {it._fingerprint})"
      )
    return it
