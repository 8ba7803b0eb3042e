"""The network benchmark's tool (`bench_net_tools:TOOLS`): download a URL with the standard library,
through the proxy variables when the worker has them (`network = "allowlist"`), directly otherwise."""

from __future__ import annotations

import urllib.request

from stockade.tools.base import tool

__all__ = ["TOOLS", "download"]


@tool
def download(url: str) -> str:
    """GET `url`, discard the body 1 MiB at a time; return the number of bytes read."""
    total = 0
    with urllib.request.urlopen(url, timeout=60) as response:
        while chunk := response.read(1 << 20):
            total += len(chunk)
    return str(total)


TOOLS = [download]
