"""Shared-secret tokens of the code-pool HTTP service (server and client read them alike).

A token comes from, in order: an explicit value, an explicit file, the file named by
`RSTAR_CODE_POOL_TOKEN_FILE`, or `RSTAR_CODE_POOL_TOKEN`. A token file holds one token per line
(blank lines and `#` comments skipped); the server accepts every token listed and gives each its
own session namespace, a client needs exactly one. A token file that group or others may read
(mode & 0o077), or a token holding a control character, is refused with one line that never
quotes the token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import stat
from collections.abc import Mapping

TOKEN_ENV = "RSTAR_CODE_POOL_TOKEN"
TOKEN_FILE_ENV = "RSTAR_CODE_POOL_TOKEN_FILE"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE_BYTES = 1 << 20


def _check(token: str, where: str) -> str:
  bad = next((i for i, c in enumerate(token) if not 0x21 <= ord(c) <= 0x7E), None)
  if len(token) < MIN_TOKEN_CHARS or bad is not None:
    what = f"character {bad} is {ord(token[bad]):#04x}" if bad is not None else "too short"
    raise ValueError(
      f"token from {where} must be >= {MIN_TOKEN_CHARS} printable ASCII characters with no "
      f"spaces or control characters, got {len(token)} characters ({what})"
    )
  return token


def _read_file(path: str) -> list[str]:
  try:
    with open(path, "rb") as f:
      mode = os.fstat(f.fileno()).st_mode
      if mode & 0o077:
        raise ValueError(
          f"token file {path!r} is readable or writable by group/others (mode "
          f"{stat.S_IMODE(mode):04o}): expected 0600 or stricter (chmod 600 {path})"
        )
      raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
  except OSError as e:
    raise ValueError(f"token file {path!r} cannot be read: {e.strerror or e}") from None
  if len(raw) > MAX_TOKEN_FILE_BYTES:
    raise ValueError(f"token file {path!r} is over {MAX_TOKEN_FILE_BYTES} bytes")
  try:
    text = raw.decode("ascii")
  except UnicodeDecodeError:
    raise ValueError(f"token file {path!r} is not ASCII text") from None
  # Lines end at \n only (\r\n tolerated): splitlines() would also split at \x0b, \x1c, ...,
  # and hide a control character inside a token.
  lines = [ln.removesuffix("\r").strip(" \t") for ln in text.split("\n")]
  tokens = [
    _check(ln, f"file {path!r} line {n}")
    for n, ln in enumerate(lines, 1)
    if ln and not ln.startswith("#")
  ]
  if not tokens:
    raise ValueError(f"token file {path!r} holds no token")
  return tokens


def read_tokens(
  token: str | None = None,
  token_file: str | None = None,
  environ: Mapping[str, str] | None = None,
) -> list[str]:
  """Every configured token (first source found, see module doc); [] when none is configured."""
  env = os.environ if environ is None else environ
  if token is not None:
    return [_check(token, "the token argument")]
  if token_file is not None:
    return _read_file(token_file)
  if env.get(TOKEN_FILE_ENV):
    return _read_file(env[TOKEN_FILE_ENV])
  if env.get(TOKEN_ENV):
    return [_check(env[TOKEN_ENV], f"${TOKEN_ENV}")]
  return []


def client_token(
  token: str | None = None,
  token_file: str | None = None,
  environ: Mapping[str, str] | None = None,
) -> str | None:
  """The one token a client sends (None: none configured, requests go unauthenticated)."""
  tokens = read_tokens(token, token_file, environ)
  if len(tokens) > 1:
    raise ValueError(f"a client needs exactly one token, the configured file holds {len(tokens)}")
  return tokens[0] if tokens else None


def is_loopback(host: str) -> bool:
  """Whether binding `host` only accepts connections from this machine ("" / 0.0.0.0 do not)."""
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False  # a host name may resolve anywhere


def _digest(token: str | bytes) -> bytes:
  raw = token.encode("utf-8", "surrogatepass") if isinstance(token, str) else token
  return hashlib.sha256(raw).digest()


class TokenSet:
  """Matches a presented token against the configured ones in constant time."""

  def __init__(self, tokens: list[str]):
    self._digests = [_digest(t) for t in tokens]
    # The namespace names nothing secret: a hash of the token's hash, stable across restarts.
    self._namespaces = [hashlib.sha256(b"ns" + d).hexdigest()[:16] for d in self._digests]

  def __bool__(self) -> bool:
    return bool(self._digests)

  def __len__(self) -> int:
    return len(self._digests)

  def namespace(self, presented: str | bytes | None) -> str | None:
    """The session namespace of `presented`, or None when it matches no token. Every token is
    compared (digests of equal length, `hmac.compare_digest`), so the time taken says nothing
    about which token or how many characters matched."""
    if presented is None:
      return None
    d = _digest(presented)
    found = None
    for ns, want in zip(self._namespaces, self._digests):
      if hmac.compare_digest(d, want):
        found = ns
    return found
