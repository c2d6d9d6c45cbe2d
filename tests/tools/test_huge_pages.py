"""The template's preloaded heap is moved into 2 MiB pages before it serves
(`sandbox_template.collapse_heap_to_huge_pages`), so each call's fork copies, and its exit
drops, one page table entry per 2 MiB of it instead of 512: over half of a trivial call's CPU
went there (issue 40's trivial-call throughput; rstar_jax/tools/README.md). Checked from the
kernel's side: what the template moved, that a call starts with huge mappings (at every level),
and that only densely used ranges are moved (the template's memory does not grow by holes)."""

import ctypes
import mmap
import os

import pytest
from pool_helpers import template_host_pid, use_level_runner

from rstar_jax.tools import sandbox_template as st

runner = use_level_runner()

MIB = 1 << 20
# What a call reports: the kernel's count of its memory mapped by 2 MiB entries.
CALL_HUGE = (
  "print([l.split()[1] for l in open('/proc/self/smaps_rollup') "
  "if l.startswith('AnonHugePages:')][0])"
)


def _region(size):
  """A private anonymous mapping of `size` bytes and its address (kept alive by the caller)."""
  m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
  view = ctypes.c_char.from_buffer(m)
  addr = ctypes.addressof(view)
  del view  # an exported buffer would keep the mapping from being closed
  return m, addr


def _huge_kib(lo, hi, smaps="/proc/self/smaps"):
  """AnonHugePages (KiB) of the mappings of this process that lie in [lo, hi)."""
  total, inside = 0, False
  with open(smaps) as f:
    for line in f:
      head = line.split()[0]
      if "-" in head and not head.endswith(":"):
        a, b = (int(x, 16) for x in head.split("-"))
        inside = lo <= a and b <= hi
      elif inside and head == "AnonHugePages:":
        total += int(line.split()[1])
  return total


def _collapse_unsupported():
  """ "" when this kernel collapses a dense 2 MiB range on request, else why not."""
  m, addr = _region(6 * MIB)
  try:
    a = -(-addr // st.HUGE_PAGE_BYTES) * st.HUGE_PAGE_BYTES
    m[a - addr : a - addr + st.HUGE_PAGE_BYTES] = b"x" * st.HUGE_PAGE_BYTES
    if st._libc.madvise(a, st.HUGE_PAGE_BYTES, st.MADV_COLLAPSE) != 0:
      return f"MADV_COLLAPSE refused here: {os.strerror(ctypes.get_errno())} (Linux >= 6.1 needed)"
    return ""
  finally:
    m.close()


@pytest.fixture(scope="module")
def collapse_works():
  why = _collapse_unsupported()
  if why:
    pytest.skip(why)


def test_only_densely_used_ranges_are_moved(collapse_works, tmp_path):
  """A 2 MiB range all of whose pages are in use is moved; one with 1 page in 16 in use is
  left alone (moving it would fill its 480 holes with zeroed pages: memory the template never
  used)."""
  m, addr = _region(12 * MIB)
  try:
    first = -(-addr // st.HUGE_PAGE_BYTES) * st.HUGE_PAGE_BYTES
    off = first - addr
    m[off : off + 4 * MIB] = b"d" * (4 * MIB)  # two dense ranges
    for p in range(0, 4 * MIB, 16 * 4096):  # two sparse ones
      m[off + 4 * MIB + p] = 0x73
    maps = tmp_path / "maps"
    maps.write_text(f"{addr:x}-{addr + 12 * MIB:x} rw-p 00000000 00:00 0\n")
    assert st.collapse_heap_to_huge_pages(str(maps)) == 4 * MIB
    assert _huge_kib(addr, addr + 12 * MIB) == 4096
    assert m[off : off + 4 * MIB] == b"d" * (4 * MIB)  # same contents, other pages
    resident = (ctypes.c_ubyte * 512)()
    assert st._libc.mincore(first + 4 * MIB, 2 * MIB, resident) == 0
    assert sum(b & 1 for b in resident) == 32  # the sparse range: still its own 32 pages
  finally:
    m.close()


def test_calls_are_forked_from_a_heap_in_huge_pages(collapse_works, runner, lpool):
  """The template moved its preloaded heap (numpy + sympy: tens of MiB) into 2 MiB pages, the
  kernel shows it mapped so, and a call starts with huge mappings of it (its fork copied them
  as such; what the call writes splits only its own mapping, in 4 KiB copies)."""
  moved = lpool._templates[0].info.get("huge_page_bytes", 0)
  assert moved >= 8 * MIB, lpool._templates[0].info
  tpid = template_host_pid(lpool)
  assert _huge_kib(0, 1 << 64, f"/proc/{tpid}/smaps") >= 2048
  r = runner.run(lpool.execute(CALL_HUGE))
  assert r.status == "ok", r
  assert int(r.stdout) >= 2048, r.stdout
