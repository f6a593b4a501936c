"""Envelope encryption: what is sealed for a record opens for that record only, and any change
to a blob or its wrapped key, or another master key, is a `state_deserialize_failure`."""

from __future__ import annotations

import os

import pytest

from cairn.durable.crypto import Envelope, SealScope, WrappedKey, blob_key_id
from cairn.durable.keyring import LocalKeyring
from cairn.errors import StateDeserializeError

pytestmark = pytest.mark.anyio

SCOPE = SealScope(tenant="t1", kind="approval", record_id="apr_1")
STATE = b'{"turn_id": "turn_1", "call_id": "call_1", "token": "s3cr3t-value"}'


def keyring(*versions: int) -> LocalKeyring:
    return LocalKeyring({v: os.urandom(32) for v in versions or (1,)})


def flipped(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.mark.parametrize("size", [0, 10 * 1024, 1024 * 1024])
async def test_a_sealed_blob_opens_for_its_record_and_shows_nothing_of_its_content(size: int) -> None:
    envelope = Envelope(keyring())
    plaintext = STATE + os.urandom(size)
    sealed = await envelope.seal(plaintext, SCOPE)
    assert STATE not in sealed.blob and b"s3cr3t" not in sealed.data_key.key.wrapped
    assert blob_key_id(sealed.blob) == sealed.data_key.id
    assert await envelope.open(sealed.blob, sealed.data_key.key, SCOPE) == plaintext


async def test_the_same_content_sealed_twice_gives_two_unrelated_blobs_and_keys() -> None:
    envelope = Envelope(keyring())
    first, second = await envelope.seal(STATE, SCOPE), await envelope.seal(STATE, SCOPE)
    assert first.blob != second.blob and first.data_key.id != second.data_key.id
    assert first.data_key.key.wrapped != second.data_key.key.wrapped


async def test_one_flipped_byte_anywhere_in_the_blob_is_refused() -> None:
    envelope = Envelope(keyring())
    sealed = await envelope.seal(STATE, SCOPE)
    for index in range(len(sealed.blob)):
        with pytest.raises(StateDeserializeError) as caught:
            await envelope.open(flipped(sealed.blob, index), sealed.data_key.key, SCOPE)
        assert caught.value.code == "state_deserialize_failure"
        assert "s3cr3t" not in caught.value.message


async def test_a_truncated_blob_is_refused() -> None:
    envelope = Envelope(keyring())
    sealed = await envelope.seal(STATE, SCOPE)
    for length in (0, 1, 17, 29, 45, len(sealed.blob) - 1):
        with pytest.raises(StateDeserializeError):
            await envelope.open(sealed.blob[:length], sealed.data_key.key, SCOPE)


@pytest.mark.parametrize(
    "other",
    [
        SealScope(tenant="t2", kind="approval", record_id="apr_1"),
        SealScope(tenant="t1", kind="approval", record_id="apr_2"),
        SealScope(tenant="t1", kind="credential", record_id="apr_1"),
    ],
    ids=["another tenant", "another record", "another kind"],
)
async def test_a_blob_read_as_another_record_or_tenant_is_refused(other: SealScope) -> None:
    envelope = Envelope(keyring())
    sealed = await envelope.seal(STATE, SCOPE)
    with pytest.raises(StateDeserializeError, match="cannot be opened|does not verify"):
        await envelope.open(sealed.blob, sealed.data_key.key, other)


async def test_data_keys_swapped_between_two_blobs_open_neither() -> None:
    envelope = Envelope(keyring())
    first, second = await envelope.seal(STATE, SCOPE), await envelope.seal(STATE, SCOPE)
    with pytest.raises(StateDeserializeError):
        await envelope.open(first.blob, second.data_key.key, SCOPE)
    with pytest.raises(StateDeserializeError):
        await envelope.open(second.blob, first.data_key.key, SCOPE)


async def test_an_altered_wrapped_key_is_refused() -> None:
    envelope = Envelope(keyring())
    sealed = await envelope.seal(STATE, SCOPE)
    key = sealed.data_key.key
    for index in (0, 12, len(key.wrapped) - 1):
        with pytest.raises(StateDeserializeError):
            await envelope.open(sealed.blob, WrappedKey(key.version, flipped(key.wrapped, index)), SCOPE)
    with pytest.raises(StateDeserializeError):
        await envelope.open(sealed.blob, WrappedKey(key.version, key.wrapped[:-1]), SCOPE)


async def test_another_master_key_under_the_same_version_is_refused_and_says_so() -> None:
    sealed = await Envelope(keyring()).seal(STATE, SCOPE)
    with pytest.raises(StateDeserializeError, match="another master key"):
        await Envelope(keyring()).open(sealed.blob, sealed.data_key.key, SCOPE)


async def test_a_master_key_version_the_keyring_lacks_is_refused_and_named() -> None:
    sealed = await Envelope(keyring(1)).seal(STATE, SCOPE)
    with pytest.raises(StateDeserializeError, match="version 1 is not in the keyring"):
        await Envelope(keyring(2)).open(sealed.blob, sealed.data_key.key, SCOPE)


async def test_rewrap_changes_the_wrapped_key_and_not_the_blob() -> None:
    old = os.urandom(32)
    before = Envelope(LocalKeyring({1: old}))
    sealed = await before.seal(STATE, SCOPE)
    both = Envelope(LocalKeyring({1: old, 2: os.urandom(32)}))
    rewrapped = await both.rewrap(sealed.data_key, SCOPE)
    assert rewrapped.version == 2 and rewrapped.wrapped != sealed.data_key.key.wrapped
    assert await both.rewrap(type(sealed.data_key)(sealed.data_key.id, rewrapped), SCOPE) == rewrapped  # already current
    assert await both.open(sealed.blob, rewrapped, SCOPE) == STATE
    with pytest.raises(StateDeserializeError):
        await both.rewrap(sealed.data_key, SealScope("t2", SCOPE.kind, SCOPE.record_id))
