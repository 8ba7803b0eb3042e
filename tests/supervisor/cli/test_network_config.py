"""`network = "allowlist"` in the policy file: `stockade check` validates `allow_hosts`, and
`stockade doctor` says whether the mode is available. Through the real CLI."""

from __future__ import annotations

import json

import pytest


def _policy(tmp_path, body: str):
    path = tmp_path / "stockade.toml"
    path.write_text(body)
    return path


def test_check_accepts_and_shows_allow_hosts(run_cli, tmp_path):
    hosts = '["api.github.com", "*.example.org:443", "10.0.0.5:8080", "[::1]:80"]'
    path = _policy(
        tmp_path, f'[tools.bash]\nnetwork = "allowlist"\nallow_hosts = {hosts}\nnetwork_bytes = "8 MiB"\n'
    )
    proc = run_cli("check", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.dumps(json.loads(hosts), separators=(",", ":")) in proc.stdout
    table = run_cli("check", str(path))
    assert "allow_hosts" in table.stdout and "8 MiB" in table.stdout


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("*.example.org:99999", "port '99999' is not a number from 1 to 65535"),
        ("api.*.example.org", "'*' is only allowed as a whole first label"),
        ("exa mple.org", "is not a valid host name"),
        ("::1", "write an IPv6 address in brackets"),
        ("", "expected a host pattern"),
    ],
)
def test_check_rejects_a_bad_pattern_naming_field_and_value(run_cli, tmp_path, value, why):
    path = _policy(
        tmp_path, f'[tools.bash]\nnetwork = "allowlist"\nallow_hosts = ["ok.example.org", "{value}"]\n'
    )
    proc = run_cli("check", str(path))
    assert proc.returncode == 2
    assert "table [tools.bash], field 'allow_hosts'" in proc.stderr
    assert json.dumps(value) in proc.stderr and why in proc.stderr


def test_check_rejects_allow_hosts_without_allowlist_mode(run_cli, tmp_path):
    path = _policy(tmp_path, '[defaults]\nnetwork = "host"\nallow_hosts = ["api.github.com"]\n')
    proc = run_cli("check", str(path))
    assert proc.returncode == 2 and 'needs network = "allowlist"' in proc.stderr


def test_doctor_says_whether_allowlist_mode_is_available(run_cli):
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    layers = {layer["name"]: layer for layer in doc["layers"]}
    mode = next(m for m in doc["modes"] if m["name"] == "network_allowlist")
    assert mode["available"] == layers["netns"]["available"]
    off = run_cli("doctor", env={"STOCKADE_DISABLE_LAYERS": "netns"})
    line = next(line for line in off.stdout.splitlines() if line.startswith("network_allowlist"))
    assert "unavailable: needs netns" in line
