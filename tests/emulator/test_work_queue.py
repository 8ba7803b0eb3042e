"""The emulator's work endpoints, driven by the real `anthropic` client (the wire rules of spec §3.6)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import anthropic
import pytest
from stockade.emulator import Emulator
from stockade.supervisor.environments.item import sessions_token

ENV_ID = "env_wire"


@pytest.fixture
def work() -> Iterator[tuple[Emulator, anthropic.Anthropic]]:
    with Emulator(api_key=None) as emu:
        client = anthropic.Anthropic(api_key="env-key", base_url=emu.base_url, max_retries=0)
        yield emu, client


def test_poll_ack_heartbeat_stop(work: tuple[Emulator, anthropic.Anthropic]) -> None:
    emu, client = work
    (queued,) = emu.add_environment(ENV_ID, [{"id": "sesn_w", "steps": []}], ttl_s=7)
    api = client.beta.environments.work
    item = api.poll(ENV_ID, block_ms=50, anthropic_worker_id="w1")
    assert item is not None and item.data.id == "sesn_w" and item.secret
    assert sessions_token(item.secret) == queued.sessions_token
    assert json.loads(base64.urlsafe_b64decode(item.secret + "==")) == {
        "sessions_token": queued.sessions_token
    }
    assert api.poll(ENV_ID, block_ms=50) is None  # handed out, not yet reclaimable
    assert api.ack(item.id, environment_id=ENV_ID).state == "starting"
    beat = api.heartbeat(item.id, environment_id=ENV_ID, expected_last_heartbeat="NO_HEARTBEAT")
    assert beat.lease_extended and beat.ttl_seconds == 7 and beat.state == "active"
    with pytest.raises(anthropic.APIStatusError) as refused:
        api.heartbeat(item.id, environment_id=ENV_ID, expected_last_heartbeat="NO_HEARTBEAT")
    assert refused.value.status_code == 412
    assert refused.value.response.json()["error"]["details"]["error_code"] == "heartbeat_precondition_failed"
    emu.work.shut_down(item.id)
    ended = api.heartbeat(item.id, environment_id=ENV_ID, expected_last_heartbeat=beat.last_heartbeat)
    assert not ended.lease_extended
    assert api.stop(item.id, environment_id=ENV_ID, force=True).state == "stopped"
    with pytest.raises(anthropic.ConflictError):
        api.stop(item.id, environment_id=ENV_ID, force=True)
    emu.work.revoke(item.id)
    with pytest.raises(anthropic.NotFoundError):
        api.ack(item.id, environment_id=ENV_ID)


def test_poll_rejects_block_ms_zero_and_waits_for_work(work: tuple[Emulator, anthropic.Anthropic]) -> None:
    _, client = work
    with pytest.raises(anthropic.BadRequestError):
        client.beta.environments.work.poll(ENV_ID, block_ms=0)
    assert client.beta.environments.work.poll(ENV_ID) is None  # omitted = non-blocking


def test_sessions_token_tolerates_bad_secrets() -> None:
    assert sessions_token(None) is None
    assert sessions_token("!!not base64!!") is None
    assert sessions_token(base64.urlsafe_b64encode(b'{"other": 1}').decode()) is None
