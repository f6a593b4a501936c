"""A run's persisted context: declared keys stored through their types' serializers; anything
else refused, naming the key and never the value."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pydantic import BaseModel

import cairn
from cairn.errors import AgentDefinitionError, RunStateRefusedError, StateDeserializeError
from cairn.operator import ContextSchema, RunContext, revision_of


class Flags(BaseModel):
    dry_run: bool = False
    region: str


SCHEMA = ContextSchema({"user": str, "ticket": int | None, "flags": Flags, "tags": list[str]})


def test_declared_values_go_through_their_serializers_and_come_back_typed() -> None:
    values: dict[str, Any] = {"user": "ada", "ticket": None, "flags": Flags(region="eu"), "tags": ["a"]}
    dumped = SCHEMA.dump(values)
    assert dumped == {"user": "ada", "ticket": None, "flags": {"dry_run": False, "region": "eu"}, "tags": ["a"]}
    loaded = SCHEMA.load(dumped)
    assert loaded["flags"] == Flags(region="eu") and loaded["user"] == "ada"


def test_an_undeclared_key_or_a_value_its_type_refuses_is_refused_naming_the_key_only() -> None:
    with pytest.raises(RunStateRefusedError, match="holds 'db', which its agent does not declare") as undeclared:
        SCHEMA.dump({"user": "ada", "db": object()})
    assert undeclared.value.code == "run_state_refused"
    with pytest.raises(RunStateRefusedError, match="'ticket' does not fit its declared type") as wrong:
        SCHEMA.dump({"ticket": "s3cr3t-not-a-number"})
    assert "s3cr3t" not in wrong.value.message


def test_a_stored_context_that_no_longer_fits_does_not_load() -> None:
    with pytest.raises(StateDeserializeError, match="'other'"):
        SCHEMA.load({"other": 1})
    with pytest.raises(StateDeserializeError, match="'ticket'"):
        SCHEMA.load({"ticket": "x"})


def test_a_type_without_a_json_form_is_refused_when_the_agent_is_made() -> None:
    class Client:
        pass

    with pytest.raises(AgentDefinitionError, match="'client'.*no JSON form"):
        cairn.Agent(model="m", context={"client": Client})
    with pytest.raises(AgentDefinitionError, match="not a key name"):
        cairn.Agent(model="m", context={"bad key": str})


def test_the_declared_types_are_part_of_the_revision() -> None:
    plain = cairn.Agent(model="m", instructions="x")
    with_context = cairn.Agent(model="m", instructions="x", context={"user": str})
    retyped = cairn.Agent(model="m", instructions="x", context={"user": int})
    assert len({revision_of(plain), revision_of(with_context), revision_of(retyped)}) == 3
    assert revision_of(plain) == revision_of(cairn.Agent(model="m", instructions="x", context={}))


def test_a_run_context_is_a_mapping_that_is_never_pickled() -> None:
    context = RunContext({"user": "ada"})
    context["ticket"] = 4
    del context["user"]
    assert dict(context) == {"ticket": 4} and repr(context) == "RunContext(ticket)"
    with pytest.raises(TypeError, match="declared types"):
        pickle.dumps(context)
