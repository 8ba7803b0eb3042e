"""Bring `lo` up in the worker's fresh network namespace (for `network = "allowlist"`).

A new network namespace has only `lo`, and it is down: nothing, not even 127.0.0.1, works there
until it is up. The egress forwarder listens on it. Needs CAP_NET_ADMIN in the namespace (root, or
the owner of the user namespace that came with it).
"""

from __future__ import annotations

import fcntl
import socket
import struct

__all__ = ["bring_loopback_up"]

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sh22x"  # struct ifreq: the name, then ifr_flags in the 24-byte union


def bring_loopback_up() -> str:
    """Set IFF_UP on `lo`; raises OSError if the kernel refuses."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        current = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        flags = struct.unpack(_IFREQ, current)[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
    return "lo up"
