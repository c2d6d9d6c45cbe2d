"""``--json``: exactly one JSON document on stdout; progress lines, tables, child processes and
C libraries all write to stderr meanwhile.

    emit = json_stdout.reserve(args.json)   # first thing after parsing the flags
    ...                                     # print() as usual: it reaches stderr under --json
    emit(report)                            # the one JSON document, on the real stdout

`reserve` points file descriptor 1 at stderr (so output of subprocesses and native code is
redirected too, not only Python's ``print``) and keeps a duplicate of the original stdout for
`emit`. Without ``--json`` it changes nothing and ``emit`` prints the JSON as before.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any


def reserve(enabled: bool) -> Callable[..., None]:
  """Redirects stdout to stderr when ``enabled``; returns ``emit(obj, **json.dumps kwargs)``."""
  if not enabled:

    def emit_plain(obj: Any, **kw: Any) -> None:
      print(json.dumps(obj, **kw), flush=True)

    return emit_plain
  sys.stdout.flush()
  saved = os.dup(1)
  os.dup2(2, 1)
  done = []

  def emit(obj: Any, **kw: Any) -> None:
    if done:
      raise RuntimeError("json_stdout: the JSON document was already written")
    done.append(True)
    sys.stdout.flush()
    data = (json.dumps(obj, **kw) + "\n").encode()
    while data:
      data = data[os.write(saved, data) :]

  return emit
