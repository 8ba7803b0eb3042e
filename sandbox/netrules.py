"""Egress allowlist rules (`allow_hosts`) and the decision the proxy takes for one connection.

A rule is `HOST[:PORT]`: an exact name (`api.github.com`), a wildcard over subdomains
(`*.example.org`: matches `a.example.org` and `a.b.example.org`, not `example.org`), an IPv4
address (`10.0.0.5`) or a bracketed IPv6 one (`[::1]`). Without a port, any port matches.

`decide` is pure: given the rules, the target and the addresses the proxy resolved, it allows a
connection only to addresses it checked. Sensitive addresses (loopback, link-local with the cloud
metadata address, unspecified, multicast, the host's own) are denied unless an *explicit* rule
names them: an IP rule, or an exact-name rule with its port. Stdlib only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Decision", "Rule", "RuleError", "decide", "is_loopback_name", "parse_rule", "parse_rules"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_MAX_NAME = 253


class RuleError(ValueError):
    """An `allow_hosts` pattern (or a target name) that is not valid; the message says why."""


@dataclass(frozen=True)
class Rule:
    """One parsed `allow_hosts` pattern."""

    text: str
    host: str
    """The name (lowercase, no trailing dot), the suffix after `*.`, or the address."""
    port: int | None
    wildcard: bool = False
    address: IPAddress | None = None

    @property
    def explicit(self) -> bool:
        """Whether this rule may open sensitive addresses (it names the target exactly)."""
        return self.address is not None or (not self.wildcard and self.port is not None)

    def matches(self, host: str, address: IPAddress | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.address is not None or address is not None:
            return self.address is not None and self.address == address
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host


@dataclass(frozen=True)
class Decision:
    """The proxy's verdict: `addresses` to connect to (checked), or the `reason` for a denial."""

    allowed: bool
    reason: str = ""
    addresses: tuple[str, ...] = ()


def _port(text: str, pattern: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise RuleError(f"{pattern!r}: port {text!r} is not a number from 1 to 65535")
    return int(text)


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def check_name(name: str, pattern: str) -> str:
    """`name` lowercased without its trailing dot, if it is a valid DNS name; else RuleError."""
    host = name.lower().removesuffix(".")
    labels = host.split(".")
    if not host or len(host) > _MAX_NAME or not all(_LABEL.match(label) for label in labels):
        raise RuleError(f"{pattern!r}: {name!r} is not a valid host name")
    return host


def _split_host_port(text: str) -> tuple[str, str | None]:
    """`[v6]:port`, `[v6]`, `host:port` or `host` → (host, port text)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise RuleError(f"{text!r}: an IPv6 address must be written [ADDRESS] or [ADDRESS]:PORT")
        return host, rest[1:] if rest else None
    if text.count(":") > 1:
        raise RuleError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:443")
    host, sep, port = text.partition(":")
    return host, port if sep else None


def parse_rule(pattern: str) -> Rule:
    """One `allow_hosts` pattern as a Rule; RuleError says what is wrong with it."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise RuleError(
            f"{pattern!r}: expected a host pattern such as 'api.github.com' or '*.example.org:443'"
        )
    text = pattern.strip()
    host, port_text = _split_host_port(text)
    port = _port(port_text, pattern) if port_text is not None else None
    if (address := _address(host)) is not None:
        return Rule(text, str(address), port, address=address)
    if text.startswith("["):
        raise RuleError(f"{pattern!r}: {host!r} is not an IPv6 address")
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    if "*" in name:
        raise RuleError(f"{pattern!r}: '*' is only allowed as a whole first label ('*.example.org')")
    return Rule(text, check_name(name, pattern), port, wildcard=wildcard)


def parse_rules(patterns: Iterable[str]) -> tuple[Rule, ...]:
    """Every pattern parsed (the first bad one raises RuleError)."""
    return tuple(parse_rule(pattern) for pattern in patterns)


def is_loopback_name(host: str) -> bool:
    """`localhost` and `*.localhost` always mean loopback (RFC 6761 6.3), whatever DNS says."""
    return host == "localhost" or host.endswith(".localhost")


def sensitive(address: IPAddress, host_addresses: frozenset[IPAddress]) -> str | None:
    """Why `address` must not be reached through a non-explicit rule, or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (cloud metadata)" if str(address) == "169.254.169.254" else "link-local"
    if address.is_unspecified or address.is_multicast:
        return "unspecified or multicast"
    if address in host_addresses:
        return "one of the host's own addresses"
    return None


def target_address(host: str) -> IPAddress | None:
    """The target as an address if it is one (brackets allowed around IPv6)."""
    return _address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)


def match(rules: Sequence[Rule], host: str, port: int) -> Rule | None:
    """The best rule for the target: an explicit one if any matches, else any matching one."""
    address = target_address(host)
    name = str(address) if address is not None else host.lower().removesuffix(".")
    found = [rule for rule in rules if rule.matches(name, address, port)]
    return next((rule for rule in found if rule.explicit), found[0] if found else None)


def decide(
    rules: Sequence[Rule],
    host: str,
    port: int,
    resolved: Sequence[str],
    host_addresses: frozenset[IPAddress],
) -> Decision:
    """Allow `host:port` (resolved to `resolved`) only if a rule matches and every resolved address
    is safe for that rule. Every address is checked: one bad answer denies the whole name."""
    rule = match(rules, host, port)
    if rule is None:
        return Decision(False, f"{host}:{port} is not on the allowlist")
    if not resolved:
        return Decision(False, f"{host} did not resolve")
    for text in resolved:
        address = ipaddress.ip_address(text)
        why = sensitive(address, host_addresses)
        if why is not None and not rule.explicit:
            return Decision(
                False, f"{host} resolves to {address}, a {why} address that rule {rule.text!r} does not name"
            )
    return Decision(True, addresses=tuple(resolved))
