"""Domain patterns, policies and the addresses a sandbox never reaches."""

from __future__ import annotations

import ipaddress

import pytest

from cairn.config import EgressSettings
from cairn.errors import InvalidRequestError
from cairn.sandbox.egress import NetworkPolicy, SessionEgress, WireSecret, parse_domain_patterns
from cairn.sandbox.egress.addresses import AddressGuard, host_addresses


def test_patterns_are_normalized() -> None:
    assert parse_domain_patterns(["API.Example.com.", "*.Example.org", "api.example.com"], param="p") == (
        "api.example.com", "*.example.org",
    )


@pytest.mark.parametrize(
    "bad",
    ["", " ", "*", "*.com", "a.*.com", "example.*", "**.example.com", "ex*ample.com", "[::1]", "::1",
     "2001:db8::1", "10.0.0.1", "example.com:443", "https://example.com", "exa mple.com", "-a.example.com",
     "a-.example.com", "a" * 64 + ".com", ".".join(["a" * 60] * 5), "example.123"],
)
def test_malformed_patterns_are_refused(bad: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        parse_domain_patterns(["ok.example.com", bad], param="environment.network.allowed_domains")
    assert error.value.param == "environment.network.allowed_domains[1]"


def test_a_wildcard_matches_below_its_domain_only() -> None:
    policy = NetworkPolicy("restricted", allowed_domains=("*.example.com", "example.org"))
    assert policy.refusal("api.example.com") is None
    assert policy.refusal("a.b.example.com") is None
    assert policy.refusal("example.com") is not None  # the wildcard is below, not at
    assert policy.refusal("badexample.com") is not None
    assert policy.refusal("example.org") is None
    assert policy.refusal("www.example.org") is not None


def test_blocked_domains_win_over_allowed_and_apply_when_enabled() -> None:
    restricted = NetworkPolicy("restricted", allowed_domains=("*.example.com",), blocked_domains=("ads.example.com",))
    assert "blocked_domains" in (restricted.refusal("ads.example.com") or "")
    enabled = NetworkPolicy("enabled", blocked_domains=("*.tracker.test",))
    assert enabled.refusal("anything.test") is None
    assert enabled.refusal("x.tracker.test") is not None


@pytest.mark.parametrize(
    ("network", "expected"),
    [
        (None, None),
        ({"access": "disabled"}, None),
        ({"access": "enabled"}, NetworkPolicy("enabled")),
        ({"access": "restricted", "allowed_domains": ["A.test"]}, NetworkPolicy("restricted", ("a.test",))),
    ],
)
def test_policies_from_a_stored_environment(network: dict[str, object] | None, expected: NetworkPolicy | None) -> None:
    assert NetworkPolicy.from_environment(network) == expected


def test_credentials_apply_to_their_hosts_or_to_the_restricted_domains() -> None:
    limited = WireSecret("c1", "A", "ph_a", "secret-a", ("api.test", "*.svc.test"))
    unrestricted = WireSecret("c2", "B", "ph_b", "secret-b", None)
    restricted = SessionEgress("s", NetworkPolicy("restricted", ("open.test", "api.test")), (limited, unrestricted))
    assert restricted.secrets_for("API.test") == (limited, unrestricted)
    assert restricted.secrets_for("x.svc.test") == (limited,)
    assert restricted.secrets_for("open.test") == (unrestricted,)
    enabled = SessionEgress("s", NetworkPolicy("enabled"), (limited, unrestricted))
    assert enabled.secrets_for("open.test") == ()  # no domains to bind an unrestricted credential to
    assert "secret-a" not in repr(limited)


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"),
        ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
        ("10.0.0.1", "private"), ("172.31.0.1", "private"), ("192.168.1.1", "private"), ("fd12::1", "private"),
        ("100.64.0.1", "not a public"), ("0.0.0.0", "private"), ("224.0.0.1", "not a public"),
        ("::ffff:10.0.0.1", "private"), ("::ffff:127.0.0.1", "loopback"),
    ],
)
def test_non_public_addresses_are_refused(address: str, category: str) -> None:
    guard = AddressGuard()
    guard.refresh()
    assert category in (guard.refusal(ipaddress.ip_address(address)) or "")


def test_public_addresses_pass_unless_they_are_the_hosts() -> None:
    guard = AddressGuard()
    guard.refresh()
    assert guard.refusal(ipaddress.ip_address("1.1.1.1")) is None
    assert guard.refusal(ipaddress.ip_address("2606:4700::1111")) is None
    assert ipaddress.ip_address("127.0.0.1") in host_addresses()


def test_settings_from_the_environment() -> None:
    settings = EgressSettings.from_env({
        "CAIRN_EGRESS_ALLOW_PRIVATE": "Registry.Corp., pypi.corp",
        "CAIRN_EGRESS_MAX_CONNECTIONS": "8",
        "CAIRN_EGRESS_BANDWIDTH_BYTES_S": "1048576",
        "CAIRN_EGRESS_INTERCEPT_PORTS": "443,9443",
        "CAIRN_EGRESS_HOSTS": "a.test=127.0.0.1",
    })
    assert settings.allow_private == frozenset({"registry.corp", "pypi.corp"})
    assert (settings.max_connections, settings.bandwidth_bytes_s, settings.intercept_ports) == (8, 1048576, (443, 9443))
    assert settings.hosts == {"a.test": "127.0.0.1"}
    for bad in ({"CAIRN_EGRESS_MAX_CONNECTIONS": "0"}, {"CAIRN_EGRESS_HOSTS": "a.test"},
                {"CAIRN_EGRESS_HOSTS": "a.test=nowhere"}, {"CAIRN_EGRESS_BANDWIDTH_BYTES_S": "fast"}):
        with pytest.raises(InvalidRequestError):
            EgressSettings.from_env(bad)


def test_a_credential_with_malformed_hosts_is_refused_when_its_session_is_admitted() -> None:
    with pytest.raises(InvalidRequestError, match="wildcard") as error:
        SessionEgress("s", NetworkPolicy("enabled"), (WireSecret("c9", "A", "ph", "v", ("api.*.test",)),))
    assert error.value.param == "credential c9 allowed_hosts[0]"


def test_a_wire_secret_is_never_serialized() -> None:
    import pickle

    with pytest.raises(TypeError, match="never serialized"):
        pickle.dumps(WireSecret("c1", "A", "ph", "v", None))
