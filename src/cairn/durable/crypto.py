"""Envelope encryption at rest: AES-256-GCM, a fresh data key for every blob, each data key
wrapped by a versioned master key (design invariant 6: blobs are encrypted at rest).

A sealed blob says how to open it and nothing of what it holds:

    0x01 (format) | data key id (16 random bytes) | nonce (12 bytes) | ciphertext | tag (16 bytes)

Its data key is kept apart from it (`cairn.store.data_keys`), wrapped by a master key that
only the `KeyProvider` holds (a key file, an environment variable, or a KMS):

    WrappedKey(version, wrapped)

Both ciphertexts authenticate associated data that binds them to their owner. The blob's
binds the format, the tenant, the kind of record, the record's id and the data key id; the
wrapped key's binds the same and the master key's version. So a blob copied into another
record or another tenant, two blobs' data keys swapped, one flipped byte, a truncated blob,
or a master key other than the one that wrapped its data key: each fails to verify, and
`open` raises `StateDeserializeError` (code `state_deserialize_failure`); it never returns
other bytes than the ones sealed for that record.

Rotating the master key re-wraps data keys (`rewrap`): the content is neither decrypted nor
rewritten, and a blob keeps its data key id, so it stays where it is.

Nonces are random (96 bits). Each data key seals one blob; a master key wraps one data key
per blob, far below the 2^32 random-nonce messages NIST SP 800-38D allows one key.
"""

from __future__ import annotations

import abc
import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cairn._concurrency import run_sync
from cairn.errors import StateDeserializeError

__all__ = [
    "KEY_BYTES",
    "DataKey",
    "Envelope",
    "KeyProvider",
    "SealScope",
    "Sealed",
    "WrappedKey",
    "blob_key_id",
    "key_context",
]

FORMAT = 1
KEY_BYTES = 32
_KEY_ID_BYTES = 16
_NONCE_BYTES = 12
_TAG_BYTES = 16
_HEADER_BYTES = 1 + _KEY_ID_BYTES + _NONCE_BYTES
# Above this size, sealing and opening run in a worker thread (about 50 µs per 100 KB).
_INLINE_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class SealScope:
    """Whose a blob is: a tenant's record of some kind, by its id (none of them secret)."""

    tenant: str
    kind: str  # what the record is: "credential", "approval", "tool_result"
    record_id: str

    def describe(self) -> str:
        return f"{self.kind} {self.record_id}"


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A data key as a master key version wrapped it."""

    version: int
    wrapped: bytes


@dataclass(frozen=True, slots=True)
class DataKey:
    """A blob's data key, as it is stored: its id (hex, named in the blob) and the wrapped key."""

    id: str
    key: WrappedKey


@dataclass(frozen=True, slots=True)
class Sealed:
    blob: bytes
    data_key: DataKey


class KeyProvider(abc.ABC):
    """The master keys: a local keyring (`cairn.durable.keyring`), or a KMS.

    A provider wraps and unwraps data keys and never hands a master key out, so a KMS whose
    keys never leave it can be one. `context` is associated data the wrapping must be bound
    to (a KMS's "encryption context"); unwrapping with any other context, or a wrapped key
    changed in any byte, fails. Versions are whole numbers; the highest is current.
    """

    @abc.abstractmethod
    def current_version(self) -> int:
        """The master key version that `wrap` uses now."""

    @abc.abstractmethod
    async def wrap(self, data_key: bytes, context: bytes) -> WrappedKey:
        """`data_key` wrapped by the current master key, bound to `context`."""

    @abc.abstractmethod
    async def unwrap(self, key: WrappedKey, context: bytes) -> bytes:
        """The data key; `StateDeserializeError` when its version is unknown here or it does
        not verify (another master key under that version, or an altered wrapped key)."""


def _fields(*values: str | bytes) -> bytes:
    """Length-prefixed fields: no two different tuples encode to the same bytes."""
    out = bytearray()
    for value in values:
        raw = value.encode() if isinstance(value, str) else value
        out += struct.pack(">I", len(raw)) + raw
    return bytes(out)


def key_context(scope: SealScope, key_id: str) -> bytes:
    """What a data key's wrapping is bound to: the blob's owner and the data key's id."""
    return _fields(b"cairn.data-key", scope.tenant, scope.kind, scope.record_id, key_id)


def _blob_aad(scope: SealScope, key_id: bytes) -> bytes:
    return _fields(b"cairn.sealed", bytes([FORMAT]), scope.tenant, scope.kind, scope.record_id, key_id)


def blob_key_id(blob: bytes) -> str:
    """The id (hex) of the data key that opens `blob`; `StateDeserializeError` when `blob` is
    not a sealed blob of a known format."""
    if len(blob) < _HEADER_BYTES + _TAG_BYTES:
        raise StateDeserializeError(f"a sealed blob of {len(blob)} bytes is truncated (at least {_HEADER_BYTES + _TAG_BYTES})")
    if blob[0] != FORMAT:
        raise StateDeserializeError(f"a sealed blob has an unknown format ({blob[0]}); this Cairn writes format {FORMAT}")
    return blob[1 : 1 + _KEY_ID_BYTES].hex()


def _encrypt(data_key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    return AESGCM(data_key).encrypt(nonce, plaintext, aad)


def _decrypt(data_key: bytes, nonce: bytes, ciphertext: bytes, aad: bytes) -> bytes:
    return AESGCM(data_key).decrypt(nonce, ciphertext, aad)


class Envelope:
    """Seals and opens blobs with the master keys of a `KeyProvider`."""

    def __init__(self, keys: KeyProvider) -> None:
        self.keys = keys

    async def seal(self, plaintext: bytes, scope: SealScope) -> Sealed:
        """`plaintext` encrypted under a new data key, and that key wrapped for storing apart."""
        key_id = os.urandom(_KEY_ID_BYTES)
        data_key = AESGCM.generate_key(bit_length=KEY_BYTES * 8)
        nonce = os.urandom(_NONCE_BYTES)
        aad = _blob_aad(scope, key_id)
        if len(plaintext) > _INLINE_LIMIT:
            ciphertext = await run_sync(_encrypt, data_key, nonce, plaintext, aad)
        else:
            ciphertext = _encrypt(data_key, nonce, plaintext, aad)
        wrapped = await self.keys.wrap(data_key, key_context(scope, key_id.hex()))
        return Sealed(blob=bytes([FORMAT]) + key_id + nonce + ciphertext, data_key=DataKey(key_id.hex(), wrapped))

    async def open(self, blob: bytes, key: WrappedKey, scope: SealScope) -> bytes:
        """The plaintext sealed in `blob` for `scope`; `StateDeserializeError` for anything else."""
        key_id = blob_key_id(blob)
        where = {"kind": scope.kind, "record_id": scope.record_id}
        try:
            data_key = await self.keys.unwrap(key, key_context(scope, key_id))
        except StateDeserializeError as exc:
            raise StateDeserializeError(f"the sealed {scope.describe()} cannot be opened: {exc.message}", context=where) from exc
        nonce = blob[1 + _KEY_ID_BYTES : _HEADER_BYTES]
        ciphertext = blob[_HEADER_BYTES:]
        aad = _blob_aad(scope, bytes.fromhex(key_id))
        try:
            if len(ciphertext) > _INLINE_LIMIT:
                return await run_sync(_decrypt, data_key, nonce, ciphertext, aad)
            return _decrypt(data_key, nonce, ciphertext, aad)
        except InvalidTag:
            raise StateDeserializeError(
                f"the sealed {scope.describe()} does not verify: it was altered, truncated, or moved from another "
                "record or tenant",
                context=where,
            ) from None

    async def rewrap(self, data_key: DataKey, scope: SealScope) -> WrappedKey:
        """`data_key` wrapped by the current master key (unchanged when it already is); the
        blob it opens is not touched."""
        if data_key.key.version == self.keys.current_version():
            return data_key.key
        context = key_context(scope, data_key.id)
        return await self.keys.wrap(await self.keys.unwrap(data_key.key, context), context)
