"""Length-prefixed frames over pipes: a 4-byte big-endian length, then that many payload bytes.

The length is checked against a cap *before* any buffer for the payload exists, so a peer that
announces 4 GiB costs nothing. The worker side reads and writes blocking file descriptors; the
supervisor side reads an `asyncio.StreamReader` (which pauses the pipe when its buffer fills, so a
flooding peer cannot grow the supervisor's memory either).
"""

from __future__ import annotations

import asyncio
import os
import struct

from stockade.sandbox.errors import SandboxError

__all__ = [
    "HEADER_BYTES",
    "MAX_FRAME_BYTES",
    "FrameError",
    "FrameTooLarge",
    "PeerClosed",
    "frame",
    "read_frame",
    "read_frame_blocking",
    "write_frame_blocking",
]

_HEADER = struct.Struct(">I")
HEADER_BYTES = _HEADER.size
MAX_FRAME_BYTES = 64 << 20
"""Largest frame either side accepts unless the caller passes a smaller cap."""


class FrameError(SandboxError):
    """The byte stream does not hold a well-formed frame."""


class FrameTooLarge(FrameError):
    """A frame header announced more bytes than the reader accepts."""


class PeerClosed(FrameError):
    """The stream ended; `partial` is True if it ended inside a frame."""

    def __init__(self, partial: bool) -> None:
        super().__init__("peer closed the pipe" + (" inside a frame" if partial else ""))
        self.partial = partial


def frame(payload: bytes) -> bytes:
    """The payload with its length header in front."""
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {len(payload)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(payload)) + payload


def _check(length: int, max_bytes: int) -> int:
    if length > max_bytes:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the cap of {max_bytes}")
    return length


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Read one frame's payload; raises `PeerClosed` at EOF and `FrameTooLarge` before allocating."""
    try:
        header = await reader.readexactly(HEADER_BYTES)
    except asyncio.IncompleteReadError as exc:
        raise PeerClosed(partial=bool(exc.partial)) from None
    length = _check(_HEADER.unpack(header)[0], max_bytes)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise PeerClosed(partial=True) from None


def _read_exactly(fd: int, count: int) -> bytes:
    """Read `count` bytes from a blocking fd; fewer only at EOF."""
    chunks: list[bytes] = []
    remaining = count
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame_blocking(fd: int, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Blocking `read_frame` on a file descriptor (the worker side)."""
    header = _read_exactly(fd, HEADER_BYTES)
    if len(header) < HEADER_BYTES:
        raise PeerClosed(partial=bool(header))
    length = _check(_HEADER.unpack(header)[0], max_bytes)
    payload = _read_exactly(fd, length)
    if len(payload) < length:
        raise PeerClosed(partial=True)
    return payload


def write_frame_blocking(fd: int, payload: bytes) -> None:
    """Write one whole frame to a blocking file descriptor."""
    view = memoryview(frame(payload))
    while view:
        written = os.write(fd, view)
        view = view[written:]
