"""The deployment's master keys, kept locally: in `CAIRN_MASTER_KEY`, or in the data dir's
`master.key` (mode 0600), created by the first process that starts on the data dir.

A keyring holds versions; the highest wraps new data keys and every version it holds unwraps
what it wrapped. `cairn secrets rotate-master` adds a version to the key file, re-wraps every
stored data key with it (`cairn.durable.rotation`), and only then drops the older versions:
until the rewrap has finished, they still open what they wrapped.

Other processes on the same data dir follow a rotation without a restart. Asked to unwrap a
version it does not hold, a keyring reads the file again; before wrapping, it looks whether
the file changed, at most once every `RELOAD_INTERVAL_S` (one `stat`, a few microseconds, so
it stays on the event loop). `rotate-master` waits longer than that after adding a version
before it looks for the last data keys under the old ones and drops them.

Keys given in the environment are read once, at start. To rotate them, give every process the
new key as a higher version beside the old one (`CAIRN_MASTER_KEY=2:HEX,1:HEX`), restart them,
run `cairn secrets rotate-master`, then remove version 1 (docs/security.md).

The file holds one key per line, `VERSION HEX` (64 hex digits); `#` starts a comment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cairn._secret_files import create_once, replace_whole
from cairn.config import Settings
from cairn.durable.crypto import KEY_BYTES, KeyProvider, WrappedKey
from cairn.errors import CairnMisuseError, InvalidRequestError, StateDeserializeError

__all__ = ["RELOAD_INTERVAL_S", "LocalKeyring", "format_keys", "parse_keys"]

RELOAD_INTERVAL_S = 1.0
_NONCE_BYTES = 12
_HEADER = "# Cairn master keys: one per line, VERSION HEX. The highest version seals; keep this file secret.\n"


def parse_keys(text: str, *, source: str) -> dict[int, bytes]:
    """Versions and keys from a key file's text, or from `CAIRN_MASTER_KEY` (`HEX` alone is
    version 1; several are `VERSION:HEX` separated by commas). The error names `source` and
    never shows a key."""
    entries: list[tuple[str, str]] = []
    if source == "CAIRN_MASTER_KEY":
        parts = [p.strip() for p in text.split(",") if p.strip()]
        for part in parts:
            version, sep, key = part.partition(":")
            entries.append((version, key) if sep else ("1", version))
    else:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                version, _, key = line.partition(" ")
                entries.append((version, key.strip()))
    keys: dict[int, bytes] = {}
    for number, (version, key) in enumerate(entries, start=1):
        where = f"{source}, key {number}"
        if not version.isascii() or not version.isdigit() or int(version) < 1:
            raise InvalidRequestError(f"{where}: the version must be a whole number, 1 or more", param=source)
        try:
            raw = bytes.fromhex(key)
        except ValueError:
            raise InvalidRequestError(f"{where}: the key must be {KEY_BYTES * 2} hex digits", param=source) from None
        if len(raw) != KEY_BYTES:
            raise InvalidRequestError(f"{where}: the key must be {KEY_BYTES} bytes ({KEY_BYTES * 2} hex digits)", param=source)
        if int(version) in keys:
            raise InvalidRequestError(f"{where}: version {int(version)} is given twice", param=source)
        keys[int(version)] = raw
    if not keys:
        raise InvalidRequestError(f"{source} holds no master key", param=source)
    return keys


def format_keys(keys: Mapping[int, bytes]) -> str:
    """A key file's text for `keys`, newest first."""
    return _HEADER + "".join(f"{version} {keys[version].hex()}\n" for version in sorted(keys, reverse=True))


def _bind(context: bytes, version: int) -> bytes:
    return context + version.to_bytes(8, "big")


def _file_stamp(path: Path) -> tuple[int, int, int]:
    found = path.stat()
    return found.st_ino, found.st_mtime_ns, found.st_size


class LocalKeyring(KeyProvider):
    """Master keys held in this process's memory, from a key file or the environment."""

    def __init__(self, keys: Mapping[int, bytes], *, path: Path | None = None) -> None:
        self._keys = dict(keys)
        self._path = path
        self._stamp = _file_stamp(path) if path is not None else None
        self._checked_at = time.monotonic()

    @classmethod
    def from_settings(cls, settings: Settings, *, create: bool = True) -> LocalKeyring:
        """The keyring `settings` name: `CAIRN_MASTER_KEY`, else the data dir's key file,
        created with one new key (version 1) if there is none and `create` is set."""
        if settings.master_key is not None:
            return cls(parse_keys(settings.master_key, source="CAIRN_MASTER_KEY"))
        path = settings.master_key_path
        if not create and not path.exists():
            raise InvalidRequestError(
                f"no master key: neither CAIRN_MASTER_KEY nor {path} (give the data dir or the key the server uses)",
                param="CAIRN_MASTER_KEY",
            )
        text = create_once(path, format_keys({1: AESGCM.generate_key(bit_length=KEY_BYTES * 8)}))
        return cls(parse_keys(text, source=str(path)), path=path)

    @property
    def source(self) -> str:
        """Where the keys come from: the key file's path, or `CAIRN_MASTER_KEY`."""
        return str(self._path) if self._path is not None else "CAIRN_MASTER_KEY"

    @property
    def is_file(self) -> bool:
        return self._path is not None

    def versions(self) -> list[int]:
        return sorted(self._keys)

    def current_version(self) -> int:
        return max(self._keys)

    async def wrap(self, data_key: bytes, context: bytes) -> WrappedKey:
        if self._path is not None and time.monotonic() - self._checked_at >= RELOAD_INTERVAL_S:
            self.reload()
        version = self.current_version()
        nonce = os.urandom(_NONCE_BYTES)
        return WrappedKey(version, nonce + AESGCM(self._keys[version]).encrypt(nonce, data_key, _bind(context, version)))

    async def unwrap(self, key: WrappedKey, context: bytes) -> bytes:
        if key.version not in self._keys and self._path is not None:
            self.reload()
        master = self._keys.get(key.version)
        if master is None:
            held = ", ".join(str(v) for v in self.versions())
            raise StateDeserializeError(
                f"master key version {key.version} is not in the keyring of {self.source} (it holds {held}): it was "
                "dropped after a rotation, or this process has another keyring than the one that sealed it"
            )
        try:
            return AESGCM(master).decrypt(key.wrapped[:_NONCE_BYTES], key.wrapped[_NONCE_BYTES:], _bind(context, key.version))
        except (InvalidTag, ValueError):
            raise StateDeserializeError(
                f"a data key does not unwrap with master key version {key.version} of {self.source}: this process has "
                "another master key under that version, or the wrapped key was altered or moved"
            ) from None

    def reload(self) -> None:
        """Read the key file again if it changed since it was last read."""
        if self._path is None:
            return
        self._checked_at = time.monotonic()
        stamp = _file_stamp(self._path)
        if stamp != self._stamp:
            self._keys = parse_keys(self._path.read_text(), source=str(self._path))
            self._stamp = stamp

    # -- rotation (the key file only) -----------------------------------------------------

    def _file(self) -> Path:
        if self._path is None:
            raise CairnMisuseError("keys given in CAIRN_MASTER_KEY are changed in the environment, not by Cairn")
        return self._path

    def add_version(self) -> int:
        """Add a new random master key as the next version (now the current one); returns it."""
        path = self._file()
        keys = parse_keys(path.read_text(), source=str(path))
        version = max(keys) + 1
        keys[version] = AESGCM.generate_key(bit_length=KEY_BYTES * 8)
        replace_whole(path, format_keys(keys))
        self._stamp = None
        self.reload()
        return version

    def drop_versions_below(self, version: int) -> list[int]:
        """Remove every master key older than `version` from the key file; returns their versions."""
        path = self._file()
        keys = parse_keys(path.read_text(), source=str(path))
        dropped = sorted(v for v in keys if v < version)
        if dropped:
            replace_whole(path, format_keys({v: k for v, k in keys.items() if v >= version}))
            self._stamp = None
            self.reload()
        return dropped
