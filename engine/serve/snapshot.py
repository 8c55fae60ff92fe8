"""State snapshots: a :class:`~isan.engine.State` as a short, signed string a client can keep.

An ISAN's state is d floats (docs/ARCHITECTURE.md, 'The model and its conventions'), so a client
can take the state after some text (``"return_state": true`` over HTTP, ``{"snapshot": true}`` on a
stream), keep it, and continue from it later (``"state": token``, ``{"restore": token}``): the bits
are those of scoring the whole text in one go (within float32 rounding of the batched kernel).

Format (version 1), base64url without padding of ``payload || tag``::

    payload = b"ISANSTAT" | version u8 = 1 | params_sha256 (32 bytes) | n u32 | chars u64
              | bits f64 | len(last_symbol utf-8) u8 | last_symbol utf-8 | h (n float64)
    tag     = HMAC-SHA256(secret, payload)           (little-endian throughout)

What it protects against: the HMAC refuses any snapshot changed by a client, or made by a server
with another secret (403, checked first: nothing in an unsigned token is trusted); the model's
``params_sha256`` refuses a snapshot signed with the same secret by a server of another model
(409, naming both). A client cannot forge a state (for example one out of range, or with
made-up running totals) without the secret. It does not hide the state: ``h`` is readable by
whoever holds the token. The secret is random per process unless ``ISAN_STATE_SECRET`` or
``--state-secret-file`` sets it; with a set secret, snapshots survive restarts and are valid on
every replica that shares it and serves the same model.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import struct

import numpy as np

from isan.errors import IsanError

MAGIC = b"ISANSTAT"
VERSION = 1
HEADER = struct.Struct("<8sB32sIQd")
TAG_BYTES = 32
#: longest token accepted (a d = 4096 state is about 44,000 characters)
MAX_TOKEN_CHARS = 200_000
#: the largest running total of characters a snapshot carries (2^53: exact as a JSON number
#: everywhere; scoring a billion characters a second would take 285 years to reach it)
MAX_TOTAL_CHARS = 2**53
#: the most bits a character may add to the running total (far above any model's; keeps sums finite)
MAX_BITS_PER_CHAR = 1e6
#: a token starts with this: base64url of MAGIC and VERSION (9 bytes, 12 characters)
TOKEN_PREFIX = "SVNBTlNUQVQB"
#: every token of every model matches this (the prefix, then base64url for at least the rest of
#: the header, the length byte and the tag), so a string that is not one is refused by the
#: schema (400); one that matches but was changed is refused by its signature (403)
TOKEN_PATTERN = r"^SVNBTlNUQVQB[A-Za-z0-9_-]{114,}$"


class SnapshotError(IsanError, ValueError):
    """A state snapshot that cannot be used; ``status`` is the HTTP status that says why."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def token_chars(state_size: int) -> int:
    """The length of the longest token for a state of ``state_size`` values (last symbol of 4 UTF-8 bytes)."""
    n = HEADER.size + 1 + 4 + 8 * state_size + TAG_BYTES
    return (4 * n + 2) // 3


def new_secret() -> bytes:
    """A random 32-byte key (snapshots signed with it are valid until the process ends)."""
    return os.urandom(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _totals_error(chars, bits) -> str | None:
    """Why running totals are out of range (None when they are not)."""
    if not 0 <= chars <= MAX_TOTAL_CHARS:
        return f"{chars:,} characters, beyond the {MAX_TOTAL_CHARS:,} a snapshot carries"
    if not (np.isfinite(bits) and 0.0 <= bits <= MAX_BITS_PER_CHAR * chars):
        return f"{bits!r} bits over {chars:,} characters, which no scoring gives"
    return None


def encode_state(state, params_sha256: str, secret: bytes) -> str:
    """A signed token for ``state`` (an :class:`isan.engine.State`) of the model ``params_sha256``.

    Raises:
        SnapshotError: 422 when the running totals are beyond what a snapshot carries.
    """
    why = _totals_error(int(state.chars), float(state.bits))
    if why is not None:
        raise SnapshotError(f"the state's running totals are out of range ({why}); no snapshot can be made of it: "
                            'start again from the initial state ({"reset": true} on a stream)', status=422)
    h = np.ascontiguousarray(state.h, dtype="<f8")
    sym = (state.last_symbol or "").encode("utf-8")
    payload = (HEADER.pack(MAGIC, VERSION, bytes.fromhex(params_sha256), len(h), int(state.chars), float(state.bits))
               + struct.pack("<B", len(sym)) + sym + h.tobytes())
    return _b64(payload + hmac.new(secret, payload, hashlib.sha256).digest())


def decode_state(token, params_sha256: str, secret: bytes, state_size: int, max_abs: float = np.inf,
                 symbols: tuple[str, ...] | None = None):
    """The :class:`isan.engine.State` in ``token``, every field checked after its signature.

    Args:
        params_sha256: the serving model's; a snapshot of another model is refused (409).
        secret: the server's key; a token not signed with it is refused (403).
        state_size: the length of the model's state vector.
        max_abs: the largest ``|h_i|`` accepted (:data:`isan.engine.guard.MAX_STATE_ABS`).
        symbols: a character model's alphabet: the last symbol (the last character read) must be
            one of them, or empty (the initial state); None (pairs, words, bytes: their states
            end on any character of the text): any single character.
    Raises:
        SnapshotError: with ``status`` 400 (not a snapshot, another version), 403 (changed, or
            signed with another secret), 409 (another model: its hash, or the length of its
            state) or 422 (signed with the secret, but a field out of range: a state value, more
            than :data:`MAX_TOTAL_CHARS` characters, negative bits, more than
            :data:`MAX_BITS_PER_CHAR` bits a character, a last symbol that is not one of the
            model's, a length byte or state that does not fit the token; only a holder of the
            secret can make one).
    """
    from isan.engine.results import State

    how = 'take one with "return_state": true (HTTP) or {"snapshot": true} (stream)'
    if not isinstance(token, str) or not token:
        raise SnapshotError(f'"state" must be a snapshot string; {how}')
    if len(token) > MAX_TOKEN_CHARS:
        raise SnapshotError(f'"state" has {len(token):,} characters, longer than any snapshot ({MAX_TOKEN_CHARS:,}); {how}')
    if not token.startswith(TOKEN_PREFIX):
        raise SnapshotError(f'"state" is not an isan state snapshot (one starts {TOKEN_PREFIX!r}); {how}')
    changed = SnapshotError("the snapshot's signature does not match: it was changed (it is not base64url of a "
                            f"whole snapshot); {how}", status=403)
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):  # a character added or cut: the token was changed
        raise changed from None
    if len(raw) < HEADER.size + 1 + TAG_BYTES or not raw.startswith(MAGIC):
        raise changed
    payload, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
    magic, version, sha, n, chars, bits = HEADER.unpack_from(payload)
    if version != VERSION:
        raise SnapshotError(f"the snapshot has format version {version}; this server reads version {VERSION}; {how}")
    other = sha.hex() != params_sha256
    if not hmac.compare_digest(tag, hmac.new(secret, payload, hashlib.sha256).digest()):
        named = (f" (it names another model, params_sha256 {sha.hex()[:12]}...; this server serves "
                 f"{params_sha256[:12]}...)" if other else "")
        raise SnapshotError("the snapshot's signature does not match: it was changed, or it was made by a server "
                            f"with another state secret{named} (without ISAN_STATE_SECRET, snapshots are valid only "
                            f"until the server restarts); {how}", status=403)
    if other:
        raise SnapshotError(f"the snapshot was taken with another model (params_sha256 {sha.hex()[:12]}...); this "
                            f"server serves {params_sha256[:12]}...; continue it on a server of that model, or "
                            "start a new stream", status=409)
    # signed with the key: a holder of the key (or a bug) may still have written any field, so each is checked
    k = payload[HEADER.size]
    off = HEADER.size + 1
    if off + k > len(payload):
        raise SnapshotError(f"the snapshot's last symbol is longer ({k} bytes) than the token; {how}", status=422)
    try:
        sym = payload[off : off + k].decode("utf-8")
    except UnicodeDecodeError:
        raise SnapshotError(f"the snapshot's last symbol is not UTF-8; {how}", status=422) from None
    if sym and (len(sym) != 1 or (symbols is not None and sym not in symbols)):
        raise SnapshotError(f"the snapshot's last symbol {sym[:8]!r} is not a symbol of this model's alphabet; {how}",
                            status=422)
    body = payload[off + k :]
    if len(body) % 8:
        raise SnapshotError(f"the snapshot's state is truncated; {how}", status=422)
    h = np.frombuffer(body, dtype="<f8")
    if len(h) != n or n != state_size:
        raise SnapshotError(f"the snapshot's state has {len(h)} values; this model's has {state_size}", status=409)
    if not (np.all(np.isfinite(h)) and np.abs(h).max(initial=0.0) <= max_abs):
        raise SnapshotError(f"the snapshot's state is out of range; {how}", status=422)
    why = _totals_error(chars, bits)
    if why is not None:
        raise SnapshotError(f"the snapshot's running totals are out of range ({why}); {how}, or start from the "
                            "initial state", status=422)
    return State(h.astype(np.float64), int(chars), float(bits), sym)
