"""A torch process group for weight broadcast, outside torch's default group.

SGLang's ``init_weights_update_group`` joins a group over a TCP rendezvous at
``master_address:master_port`` (the learner, rank 0, hosts the store) through torch's
process-group helper, whose backends see the store under the prefixes ``"{group_name}/"`` then
``"{device}/"``. This builds the same thing from torch's public classes, so a learner process
(and the test stand-in, possibly in the same process as the learner) can hold such a group
without ``init_process_group``. Backend names: "nccl" on CUDA and on ROCm (RCCL behind the same
name), "gloo" on CPU.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any


@dataclasses.dataclass
class WeightGroup:
  store: Any
  backends: dict  # device -> backend object
  rank: int
  world_size: int
  group_name: str
  device: str

  def broadcast(self, tensor, src: int = 0) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = src, 0
    self.backends[self.device].broadcast([tensor], opts).wait()

  def close(self) -> None:
    for b in self.backends.values():
      try:
        b.abort() if hasattr(b, "abort") else None
      except Exception:  # noqa: BLE001 - best effort; the group is being dropped
        pass
    self.backends.clear()
    self.store = None


def open_group(
  master_address: str,
  master_port: int,
  rank: int,
  world_size: int,
  group_name: str,
  backend: str = "gloo",
  timeout_s: float = 60.0,
) -> WeightGroup:
  """Joins (rank 0: hosts) the rendezvous; blocks until all ``world_size`` ranks joined or
  ``timeout_s`` passed (then raises)."""
  import torch.distributed as dist
  from torch.distributed.distributed_c10d import BackendConfig

  timeout = datetime.timedelta(seconds=timeout_s)
  store = dist.TCPStore(
    master_address,
    int(master_port),
    world_size,
    is_master=rank == 0,
    timeout=timeout,
    wait_for_workers=False,
  )
  prefix = dist.PrefixStore(f"{group_name}/", store)
  backends = {}
  for device, name in BackendConfig(backend).get_device_backend_map().items():
    ps = dist.PrefixStore(f"{device}/", prefix)
    if name == "gloo":
      backends[device] = dist.ProcessGroupGloo(ps, rank, world_size, timeout)
    elif name == "nccl":
      opts = dist.ProcessGroupNCCL.Options()
      opts._timeout = timeout
      backends[device] = dist.ProcessGroupNCCL(ps, rank, world_size, opts)
    else:
      raise ValueError(f"backend: expected 'gloo' or 'nccl', got {name!r}")
  device = "cuda" if backend == "nccl" else "cpu"
  return WeightGroup(store, backends, rank, world_size, group_name, device)


def free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
