"""Wire messages and framing: round trips, strictness, the size cap before allocation, partial reads."""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time

import msgspec
import pytest
from stockade.sandbox.isolation.limits import truncate_blocks, worker_env
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.wire.framing import (
    FrameTooLarge,
    PeerClosed,
    frame,
    read_frame,
    read_frame_blocking,
    write_frame_blocking,
)
from stockade.sandbox.wire.protocol import (
    PROTOCOL_VERSION,
    CallUsage,
    Described,
    DescribeTools,
    Ready,
    Refused,
    RunTool,
    Shutdown,
    ToolFailed,
    ToolInfo,
    ToolOk,
    decode_from_worker,
    decode_to_worker,
    encode,
)

TO_WORKER = [
    RunTool("c1", "m:TOOLS", "echo", {"text": "hi", "n": [1, 2]}, "/tmp/w", thread="t", sweep=False),
    DescribeTools(["a:B", "c:D"]),
    Shutdown(),
]
FROM_WORKER = [
    Ready(version=PROTOCOL_VERSION, pid=42, isolation={"netns": "on"}),
    Refused(version=PROTOCOL_VERSION, message="netns missing"),
    ToolOk("c1", [{"type": "text", "text": "x"}], truncated=True, usage=CallUsage(0.5, 1024, 1.0)),
    ToolFailed("c1", "ValueError", "ValueError('x')", blocks=None, resource="memory"),
    Described([ToolInfo("echo", "Echo.", {"type": "object"}, "m:TOOLS")], error=None),
]


@pytest.mark.parametrize("message", TO_WORKER, ids=lambda m: type(m).__name__)
def test_to_worker_round_trip(message: object) -> None:
    assert decode_to_worker(encode(message)) == message  # type: ignore[arg-type]


@pytest.mark.parametrize("message", FROM_WORKER, ids=lambda m: type(m).__name__)
def test_from_worker_round_trip(message: object) -> None:
    assert decode_from_worker(encode(message)) == message  # type: ignore[arg-type]


def test_unknown_field_and_wrong_direction_are_rejected() -> None:
    sneaky = msgspec.msgpack.encode({"type": "shutdown", "extra": 1})
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        decode_to_worker(sneaky)
    with pytest.raises(msgspec.ValidationError):
        decode_from_worker(encode(Shutdown()))
    with pytest.raises(msgspec.DecodeError):
        decode_from_worker(b"\xc1garbage")


@pytest.mark.timeout(5)
def test_oversize_frame_rejected_before_reading_the_payload() -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, struct.pack(">I", 0xFFFFFFFF))  # The writer stays open: reading on would hang.
        with pytest.raises(FrameTooLarge):
            read_frame_blocking(read_fd, max_bytes=1024)
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_async_oversize_frame_and_partial_reads() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", 1 << 30))
        with pytest.raises(FrameTooLarge):
            await read_frame(reader, max_bytes=1 << 20)
        reader = asyncio.StreamReader()
        payload = encode(Shutdown())
        pending = asyncio.ensure_future(read_frame(reader))
        for byte in frame(payload):
            reader.feed_data(bytes([byte]))
            await asyncio.sleep(0)
        assert await pending == payload
        reader.feed_data(frame(payload)[:3])
        reader.feed_eof()
        with pytest.raises(PeerClosed) as closed:
            await read_frame(reader)
        assert closed.value.partial

    asyncio.run(scenario())


@pytest.mark.timeout(10)
def test_blocking_frames_across_partial_writes() -> None:
    read_fd, write_fd = os.pipe()
    payload = os.urandom(200_000)  # Larger than a pipe buffer: the writer blocks mid-frame.
    data = frame(payload)

    def writer() -> None:
        for start in range(0, len(data), 7000):
            os.write(write_fd, data[start : start + 7000])
            time.sleep(0.001)
        write_frame_blocking(write_fd, b"second")
        os.close(write_fd)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert read_frame_blocking(read_fd) == payload
        assert read_frame_blocking(read_fd) == b"second"
        with pytest.raises(PeerClosed) as closed:
            read_frame_blocking(read_fd)
        assert not closed.value.partial
    finally:
        thread.join()
        os.close(read_fd)


def test_truncate_blocks_marks_what_was_cut() -> None:
    blocks = [{"type": "text", "text": "é" * 10}, {"type": "text", "text": "tail"}]
    kept, truncated = truncate_blocks(blocks, 5)
    assert truncated and kept == [
        {"type": "text", "text": "éé\n[stockade: output truncated: 4 of 24 bytes shown]"}
    ]
    assert truncate_blocks(blocks, 100) == (blocks, False)
    with pytest.raises(TypeError):
        truncate_blocks([{"type": "image", "source": object()}], 10)


def test_worker_env_is_an_allowlist() -> None:
    source = {"PATH": "/bin", "ANTHROPIC_API_KEY": "secret", "LANG": "C", "EXTRA": "x", "OTHER": "y"}
    policy = ResourcePolicy(env_passthrough=("EXTRA",))
    env = worker_env(policy, "/w", {"STOCKADE_WORKER_ID": "id"}, source)
    assert env == {
        "PATH": "/bin",
        "LANG": "C",
        "EXTRA": "x",
        "HOME": "/w",
        "TMPDIR": "/w",
        "STOCKADE_WORKER_ID": "id",
    }
