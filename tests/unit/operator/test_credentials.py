"""The credentials operator tools receive: typed, read-only, never shown or serialized."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

import cairn

TOKEN = "tok_9f2Kx7QpLm3Zr8Vw"


def test_credentials_show_no_value_and_refuse_every_way_out_of_the_process() -> None:
    bearer = cairn.StaticBearer("deploy-token", "cred_1", "https://deploy.example.com/mcp", TOKEN)
    variable = cairn.EnvironmentVariable("api-key", "cred_2", "API_KEY", TOKEN, "cairn-placeholder-1")
    oauth = cairn.McpOAuth("mcp", "cred_3", "https://mcp.example.com", TOKEN, None)
    credentials = cairn.Credentials({c.name: c for c in (bearer, variable, oauth)})
    assert credentials["deploy-token"] is bearer and len(credentials) == 3
    for shown in (bearer, variable, oauth, credentials):
        assert TOKEN not in repr(shown) and TOKEN not in str(shown)
        with pytest.raises(TypeError, match="never serialized"):
            pickle.dumps(shown)
        with pytest.raises(TypeError):
            copy.deepcopy(shown)
        with pytest.raises(TypeError):
            json.dumps(shown)
    with pytest.raises(AttributeError):
        credentials.x = 1  # type: ignore[misc]
    with pytest.raises(KeyError, match="there are: api-key, deploy-token, mcp"):
        credentials["nope"]
