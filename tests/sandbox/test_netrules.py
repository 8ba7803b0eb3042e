"""The allowlist decision (`sandbox/netrules.py`) on addresses a test must never connect to:
names resolving to the metadata address or the host's own, IPv4-mapped loopback, apex vs wildcard."""

from __future__ import annotations

import ipaddress

import pytest
from stockade.sandbox.netrules import RuleError, decide, parse_rule, parse_rules

HOST_OWN = frozenset({ipaddress.ip_address("192.0.2.10")})


def _decide(patterns: list[str], host: str, port: int, resolved: list[str]):
    return decide(parse_rules(patterns), host, port, resolved, HOST_OWN)


@pytest.mark.parametrize(
    ("resolved", "why"),
    [
        ("169.254.169.254", "link-local (cloud metadata)"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("127.0.0.2", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("192.0.2.10", "host's own"),
    ],
)
def test_wildcard_name_resolving_to_a_sensitive_address_is_denied(resolved: str, why: str) -> None:
    decision = _decide(["*.example.org"], "api.example.org", 443, ["203.0.113.7", resolved])
    assert not decision.allowed and why in decision.reason and "*.example.org" in decision.reason


def test_exact_name_without_port_is_not_explicit_enough() -> None:
    assert not _decide(["metadata.internal"], "metadata.internal", 80, ["169.254.169.254"]).allowed
    assert _decide(["metadata.internal:80"], "metadata.internal", 80, ["169.254.169.254"]).allowed


def test_ip_rule_is_explicit() -> None:
    assert _decide(["127.0.0.1:8080"], "127.0.0.1", 8080, ["127.0.0.1"]).allowed
    assert not _decide(["127.0.0.1:8080"], "127.0.0.1", 8081, ["127.0.0.1"]).allowed
    assert not _decide(["*.example.org"], "169.254.169.254", 80, ["169.254.169.254"]).allowed


def test_matching_rules() -> None:
    rules = ["*.example.org:443", "api.github.com", "[2001:db8::1]:443"]
    assert _decide(rules, "a.b.example.org", 443, ["203.0.113.7"]).allowed
    assert not _decide(rules, "example.org", 443, ["203.0.113.7"]).allowed  # a wildcard is not the apex
    assert not _decide(rules, "a.example.org", 80, ["203.0.113.7"]).allowed
    assert not _decide(rules, "evilexample.org", 443, ["203.0.113.7"]).allowed
    assert _decide(rules, "API.GitHub.com.", 22, ["203.0.113.8"]).allowed
    assert _decide(rules, "[2001:db8::1]", 443, ["2001:db8::1"]).allowed
    assert not _decide(rules, "api.github.com", 443, []).allowed  # did not resolve


@pytest.mark.parametrize("bad", ["", "a..b", "-a.org", "*.", "*", "x.*.org", "h:0", "h:x", "[::1", "1::2:80"])
def test_bad_patterns_are_rejected(bad: str) -> None:
    with pytest.raises(RuleError):
        parse_rule(bad)
