"""RayCodePool on a local ray.init(): same interface, one pool actor per node."""

import asyncio
import os

import pytest

from rstar_jax.tools.code_pool import FunctionRunError, PoolConfig

ray = pytest.importorskip("ray", reason="ray is an optional extra (pip install rstar_jax[ray])")
from rstar_jax.tools.ray_pool import RayCodePool  # noqa: E402


def triple(x):
  return 3 * x


@pytest.mark.slow  # ~30 s: ray.init, two actor starts (the second replaces a killed one)
def test_ray_pool_interface(runner):
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  try:

    async def go():
      config = PoolConfig(
        num_workers=2, num_templates=1, extra_ro_binds=(os.path.dirname(os.path.abspath(__file__)),)
      )
      async with RayCodePool(config) as pool:
        assert len(pool.actors) == len([n for n in ray.nodes() if n["Alive"]]) == 1
        level = pool.isolation_level
        a = await pool.execute("print(sum(range(5)))")
        b = await pool.execute("x = input()", "")
        many = await pool.execute_many([{"code": f"{i} ** 2"} for i in range(6)])
        await pool.execute("k = 5", session_id="r")
        s = await pool.execute("k * 2", session_id="r")
        closed = await pool.close_session("r")
        t = await pool.execute("while True: pass", timeout_s=0.3)
        v = await pool.run_function(triple, 14)
        with pytest.raises(FunctionRunError) as e:
          await pool.run_function(triple, None)
        # Issue 41: the actor is killed (as a node's process would be) mid-call. Its stateless
        # call is re-sent to a replacement; its session comes back session_lost, once.
        await pool.execute("q = 5", session_id="held")
        dead = pool.actors[0]
        slow = asyncio.ensure_future(pool.execute("import time; time.sleep(1.5); print('done')"))
        await asyncio.sleep(0.3)
        ray.kill(dead, no_restart=True)
        done = await slow
        lost = await pool.execute("print(q)", session_id="held")
        fresh = await pool.execute("print(q)", session_id="held")
        replaced = len(pool.actors) == 1 and pool.actors[0] is not dead
        chaos = (done, lost, fresh, replaced, dict(pool.stats))
        return level, a, b, many, s, closed, t, v, e.value.status, chaos

    level, a, b, many, s, closed, t, v, fstatus, chaos = runner.run(go(), timeout=240)
  finally:
    ray.shutdown()
  assert level in ("namespaces", "pidns", "uid", "rlimits")
  assert (a.status, a.stdout) == ("ok", "10\n")
  assert b.status == "error" and "EOFError" in b.stderr
  assert [r.stdout for r in many] == [f"{i * i}\n" for i in range(6)]
  assert s.stdout == "10\n" and closed is True
  assert t.status == "timeout"
  assert v == 42 and fstatus == "error"
  done, lost, fresh, replaced, stats = chaos
  assert (done.status, done.stdout) == ("ok", "done\n")
  assert lost.status == "session_lost" and "not re-run" in lost.stderr
  assert fresh.status == "error" and "NameError" in fresh.stderr
  assert fresh.stdout.startswith("[session lost earlier")
  assert replaced and stats["actors_replaced"] == 1 and stats["resent"] >= 1
