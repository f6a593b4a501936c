"""The digest that binds an approval to exactly one call: HMAC-SHA-256, keyed per deployment,
of the canonical JSON of the call's identity and arguments.

Canonical JSON follows RFC 8785 (JCS): object keys sorted by their UTF-16 code units, no
insignificant whitespace, strings escaped as ECMAScript's `JSON.stringify` does, numbers
in ECMAScript's shortest form (`1.0` is `1`, `1e21` is `1e+21`). Integers beyond 2^53 are
written exactly rather than rounded to a double: they are JSON the model sent, and rounding
would let two different calls share a digest. `NaN` and infinities are not JSON and refused.

The key makes the digest unforgeable by whoever can write the database but not read the
key (design invariant 4: the worker recomputes the digest from the recorded call before it
runs it). It comes from `CAIRN_APPROVAL_KEY`, or from `approval.key` in the data dir, which
the first process that needs it creates (mode 0600).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
from collections.abc import Mapping
from typing import Any

from cairn._secret_files import create_once
from cairn.config import Settings
from cairn.errors import InvalidRequestError

__all__ = ["ApprovalKey", "canonical_json", "schema_hash"]


def canonical_json(value: Any) -> bytes:
    """`value` as RFC 8785 canonical JSON, UTF-8."""
    return _encode(value).encode()


def _encode(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        keys = sorted((str(k) for k in value), key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_encode(value[k])}" for k in keys) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    raise InvalidRequestError(f"a {type(value).__name__} is not JSON")


def _number(value: float) -> str:
    """ECMAScript's Number::toString: the shortest digits that round-trip, in plain notation
    from 1e-6 up to 1e21 and in exponent notation outside it."""
    if not math.isfinite(value):
        raise InvalidRequestError("NaN and infinities are not JSON numbers")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exp = repr(abs(value)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    # value = 0.<digits> × 10^point, with no leading or trailing zero in digits.
    point = int(exp or 0) + len(whole)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        return sign + digits + "0" * (point - k)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    exponent = point - 1
    head = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{head}e{'+' if exponent > 0 else '-'}{abs(exponent)}"


def schema_hash(name: str, parameters: Mapping[str, Any]) -> str:
    """SHA-256 of a tool's name and parameter schema: a tool changed under the same name
    changes the digest of every call of it."""
    return hashlib.sha256(canonical_json({"name": name, "parameters": parameters})).hexdigest()


class ApprovalKey:
    """The deployment's digest key, read once per process."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise InvalidRequestError("the approval key must be at least 16 bytes", param="CAIRN_APPROVAL_KEY")
        self._secret = secret

    @classmethod
    def of(cls, settings: Settings) -> ApprovalKey:
        """The key `settings` name: CAIRN_APPROVAL_KEY (hex), else the data dir's key file."""
        if settings.approval_key is not None:
            try:
                return cls(bytes.fromhex(settings.approval_key))
            except ValueError as exc:
                raise InvalidRequestError("CAIRN_APPROVAL_KEY must be hex", param="CAIRN_APPROVAL_KEY") from exc
        return cls(bytes.fromhex(create_once(settings.approval_key_path, secrets.token_hex(32) + "\n").strip()))

    def digest(self, identity: Mapping[str, Any]) -> str:
        """HMAC-SHA-256 (hex) of the canonical JSON of `identity`."""
        return hmac.new(self._secret, canonical_json(identity), hashlib.sha256).hexdigest()
