"""Pickle-free wire format of the code pool, and a cleanup that user files cannot crash.

Stdlib only: `sandbox_template.py` imports it inside the sandbox.

Value encoding (little endian), one tag byte then the body:
  N None | T True | F False | i int64 | I big int (u32 length + ASCII decimal) | f float64
  s str (u32 length + UTF-8, lone surrogates allowed) | b bytes (u32 length + raw)
  l list / t tuple (u32 count + values) | d dict (u32 count + key, value pairs)
A frame is a u32 payload length followed by one encoded value. `decode` checks every length
against the bytes actually present, the nesting depth, the dict key types (str, bytes, bool,
None, ints below 2**60: nothing whose hash a sender can make collide) and that nothing
trails the value; anything else raises `WireError`. Nothing is ever executed or imported while
decoding, so bytes written by a sandboxed process can at worst be rejected.
"""

import os
import stat
import struct

MAX_DEPTH = 32
MAX_BIG_INT_DIGITS = 4300  # Python's own default int<->str limit
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
# Dict keys whose hashes a sender cannot make collide: str and bytes hash with the process's
# random seed; ints below 2**60 hash to themselves. Floats, tuples and big ints hash by
# arithmetic anyone can invert, so thousands of colliding keys would make one dict insertion
# loop quadratic on the host's event loop (a 512 KiB frame took 4-5 s): refused.
_KEY_TYPES = (str, bytes, bool, type(None), int)
MAX_INT_KEY = 1 << 60


class WireError(ValueError):
  """Malformed or oversized frame."""


def encode(obj) -> bytes:
  out = []
  _enc(obj, out, 0)
  return b"".join(out)


def _enc(obj, out, depth):
  if depth > MAX_DEPTH:
    raise WireError(f"value nested deeper than {MAX_DEPTH}")
  if obj is None:
    out.append(b"N")
  elif obj is True:
    out.append(b"T")
  elif obj is False:
    out.append(b"F")
  elif type(obj) is int:
    if -(1 << 63) <= obj < (1 << 63):
      out.append(b"i" + _I64.pack(obj))
    else:
      s = str(obj).encode("ascii")
      out.append(b"I" + _U32.pack(len(s)) + s)
  elif type(obj) is float:
    out.append(b"f" + _F64.pack(obj))
  elif type(obj) is str:
    s = obj.encode("utf-8", "surrogatepass")
    out.append(b"s" + _U32.pack(len(s)) + s)
  elif type(obj) in (bytes, bytearray, memoryview):
    s = bytes(obj)
    out.append(b"b" + _U32.pack(len(s)) + s)
  elif type(obj) in (list, tuple):
    out.append((b"l" if type(obj) is list else b"t") + _U32.pack(len(obj)))
    for v in obj:
      _enc(v, out, depth + 1)
  elif type(obj) is dict:
    out.append(b"d" + _U32.pack(len(obj)))
    for k, v in obj.items():
      if type(k) not in _KEY_TYPES or (type(k) is int and not -MAX_INT_KEY < k < MAX_INT_KEY):
        raise WireError(
          f"cannot encode a dict key of type {type(k).__name__} (str, bytes, bool, None or "
          "an int below 2**60)"
        )
      _enc(k, out, depth + 1)
      _enc(v, out, depth + 1)
  else:
    raise WireError(
      f"cannot encode a {type(obj).__name__} (plain values only: None, bool, int, "
      "float, str, bytes, list, tuple, dict)"
    )


def decode(data: bytes):
  view = memoryview(data)
  value, pos = _dec(view, 0, 0)
  if pos != len(view):
    raise WireError(f"{len(view) - pos} bytes trail the value")
  return value


def _take(view, pos, n):
  if n < 0 or pos + n > len(view):
    raise WireError(f"truncated frame: need {n} bytes at offset {pos}, have {len(view) - pos}")
  return view[pos : pos + n], pos + n


def _dec(view, pos, depth):
  if depth > MAX_DEPTH:
    raise WireError(f"value nested deeper than {MAX_DEPTH}")
  tag, pos = _take(view, pos, 1)
  tag = bytes(tag)
  if tag == b"N":
    return None, pos
  if tag == b"T":
    return True, pos
  if tag == b"F":
    return False, pos
  if tag == b"i":
    raw, pos = _take(view, pos, 8)
    return _I64.unpack(raw)[0], pos
  if tag == b"f":
    raw, pos = _take(view, pos, 8)
    return _F64.unpack(raw)[0], pos
  if tag in (b"I", b"s", b"b"):
    raw, pos = _take(view, pos, 4)
    (n,) = _U32.unpack(raw)
    raw, pos = _take(view, pos, n)
    if tag == b"b":
      return bytes(raw), pos
    if tag == b"s":
      try:
        return str(raw, "utf-8", "surrogatepass"), pos
      except UnicodeDecodeError as e:
        raise WireError(f"invalid UTF-8 in a string: {e}") from None
    if not 0 < n <= MAX_BIG_INT_DIGITS:
      raise WireError(f"big int of {n} digits (1..{MAX_BIG_INT_DIGITS} allowed)")
    s = bytes(raw)
    body = s[1:] if s[:1] == b"-" else s
    if not body or not body.isdigit() or not body.isascii():
      raise WireError("malformed big int")
    return int(s), pos
  if tag in (b"l", b"t", b"d"):
    raw, pos = _take(view, pos, 4)
    (n,) = _U32.unpack(raw)
    if n > len(view) - pos:  # every item takes at least one byte: refuse absurd counts early
      raise WireError(f"container claims {n} items but only {len(view) - pos} bytes remain")
    if tag == b"d":
      out = {}
      for _ in range(n):
        k, pos = _dec(view, pos, depth + 1)
        if type(k) not in _KEY_TYPES or (type(k) is int and not -MAX_INT_KEY < k < MAX_INT_KEY):
          raise WireError(
            f"dict key of type {type(k).__name__} (str, bytes, bool, None or "
            f"an int below 2**60 allowed)"
          )
        out[k], pos = _dec(view, pos, depth + 1)
      return out, pos
    items = []
    for _ in range(n):
      v, pos = _dec(view, pos, depth + 1)
      items.append(v)
    return (items if tag == b"l" else tuple(items)), pos
  raise WireError(f"unknown tag {tag!r} at offset {pos - 1}")


def frame(obj) -> bytes:
  data = encode(obj)
  return _U32.pack(len(data)) + data


def frame_length(header: bytes, max_bytes: int) -> int:
  """Payload length of a frame header, checked against `max_bytes`."""
  if len(header) != 4:
    raise WireError("short frame header")
  (n,) = _U32.unpack(header)
  if n > max_bytes:
    raise WireError(f"frame of {n} bytes exceeds the {max_bytes}-byte limit")
  return n


def check_record(msg, required: dict, where: str) -> dict:
  """`msg` must be a dict whose keys in `required` have the given types."""
  if type(msg) is not dict:
    raise WireError(f"{where}: expected a record, got {type(msg).__name__}")
  for key, types in required.items():
    if not isinstance(msg.get(key), types) or (types is int and type(msg.get(key)) is bool):
      raise WireError(f"{where}: field {key!r} must be {types}, got {type(msg.get(key)).__name__}")
  return msg


# ---------------------------------------------------------------------------------------------
def rmtree(path, max_ops=10_000_000) -> bool:
  """Removes `path` and everything below it without recursion; returns whether it is gone.

  Walks with directory fds, going down by name and back up through "..", so a tree deeper
  than the recursion limit or PATH_MAX is removed like any other. Symlinks are unlinked,
  never followed. Errors are swallowed (the caller must survive whatever a call left behind).
  """
  flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
  try:
    fd = os.open(path, flags)
  except FileNotFoundError:
    return True
  except OSError:
    try:
      os.unlink(path)
      return True
    except OSError:
      return False
  names = []
  ops = 0
  try:
    while ops < max_ops:
      sub = None
      try:
        with os.scandir(fd) as it:
          entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
      except OSError:
        entries = []
      for name, is_dir in entries:
        ops += 1
        if is_dir:
          sub = name
          continue
        try:
          os.unlink(name, dir_fd=fd)
        except OSError:
          pass
      if sub is not None:
        try:
          st = os.stat(sub, dir_fd=fd, follow_symlinks=False)
          if not stat.S_ISDIR(st.st_mode):
            raise OSError
          os.chmod(sub, 0o700, dir_fd=fd)  # a call may have made its dirs unreadable
          child = os.open(sub, flags, dir_fd=fd)
        except OSError:
          try:
            os.rmdir(sub, dir_fd=fd)
          except OSError:
            pass
          ops += 1
          continue
        os.close(fd)
        fd = child
        names.append(sub)
        continue
      if not names:
        break
      parent = os.open("..", flags, dir_fd=fd)
      os.close(fd)
      fd = parent
      try:
        os.rmdir(names.pop(), dir_fd=fd)
      except OSError:
        pass
      ops += 1
  finally:
    os.close(fd)
  try:
    os.rmdir(path)
  except FileNotFoundError:
    pass
  except OSError:
    return False
  return True
