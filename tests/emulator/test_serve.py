"""The foreground entry point and the JSON dump of the record."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from stockade.emulator import Emulator, serve

from .conftest import client_for


def test_serve_runs_until_stopped_and_keeps_its_record(tmp_path: Path) -> None:
    stop = threading.Event()
    ready: list[Emulator] = []
    result: list[Emulator] = []

    def on_ready(emu: Emulator) -> None:
        ready.append(emu)
        client_for(emu).beta.sessions.retrieve("s")
        stop.set()

    thread = threading.Thread(target=lambda: result.append(serve({"id": "s"}, on_ready=on_ready, stop=stop)))
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and result == ready
    dump = json.loads(result[0].dump_record_json(tmp_path / "record.json"))
    assert dump == json.loads((tmp_path / "record.json").read_text())
    (request,) = dump["requests"]
    assert (request["method"], request["path"], request["status"]) == ("GET", "/v1/sessions/s", 200)
    assert dump["sessions"]["s"]["status"] == "idle"


def test_close_ends_open_streams_and_threads(emu_factory: Any) -> None:
    before = threading.active_count()
    emu = Emulator({"id": "s", "steps": [{"sleep": 30}]}).start()
    stream = client_for(emu).beta.sessions.events.stream("s")
    emu.close()
    stream.close()
    assert threading.active_count() <= before  # no request, stream or script thread is left
