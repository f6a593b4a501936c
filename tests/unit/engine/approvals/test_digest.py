"""The approval digest: RFC 8785 canonical JSON, keyed by the deployment's secret."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairn.config import Settings
from cairn.engine.approvals.digest import ApprovalKey, canonical_json, schema_hash
from cairn.errors import InvalidRequestError


def test_canonical_json_follows_rfc_8785() -> None:
    # RFC 8785 §3.2.2 and appendix B: key order by UTF-16 code units, ECMAScript numbers, escapes.
    value = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh", "1": "One",
             "\U0001f600": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}
    keys = [json.loads(f"[{k}]".replace("'", '"'))[0] for k in ['"\\r"', '"1"', '"\\u0080"', '"\\u00f6"', '"\\u20ac"',
                                                                  '"\\ud83d\\ude00"', '"\\ufb33"']]
    assert list(json.loads(canonical_json(value))) == keys
    numbers = [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001, 1e21, 1e20, -0.0, 5e-324]
    assert canonical_json(numbers) == b"[333333333.3333333,1e+30,4.5,0.002,1e-27,1e+21,100000000000000000000,0,5e-324]"
    assert canonical_json({"b": [True, None, "\u2028\n\"\\"], "a": 1}) == '{"a":1,"b":[true,null,"\u2028\\n\\"\\\\"]}'.encode()


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_canonical_numbers_read_back_as_the_same_double(value: float) -> None:
    assert float(json.loads(canonical_json(value))) == value


@pytest.mark.parametrize("bad", [math.nan, math.inf, {1, 2}, b"bytes"])
def test_what_is_not_json_is_refused(bad: object) -> None:
    with pytest.raises(InvalidRequestError):
        canonical_json(bad)


def test_the_digest_is_keyed_and_binds_every_part_of_the_identity(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    key = ApprovalKey.of(settings)
    assert (tmp_path / "approval.key").stat().st_mode & 0o777 == 0o600
    identity = {"tool": "deploy", "tool_schema": schema_hash("deploy", {"type": "object"}), "arguments": {"release": "r-1"}}
    digest = key.digest(identity)
    assert ApprovalKey.of(settings).digest(identity) == digest  # the same key, read back
    assert key.digest({**identity, "arguments": {"release": "r-2"}}) != digest
    assert key.digest({**identity, "tool_schema": schema_hash("deploy", {"type": "object", "properties": {}})}) != digest
    assert ApprovalKey.of(Settings(data_dir=tmp_path, approval_key="00" * 32)).digest(identity) != digest
    with pytest.raises(InvalidRequestError):
        ApprovalKey.of(Settings(data_dir=tmp_path, approval_key="not hex"))
