"""`python scripts/bench.py network`: one call's download throughput through the egress allowlist
proxy (`network = "allowlist"`) against the host network (`network = "host"`), over loopback.

The tool is `bench_net_tools.py:download` (urllib, which uses the proxy variables when they are set).
Throughput is measured from the call's own wall time (`usage.wall_s`), on a warm worker.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import statistics
import threading
from pathlib import Path
from typing import Any

from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox

__all__ = ["run_network_bench"]

NET_BYTES = 256 << 20
NET_RUNS = 3
BLOCK = b"x" * (1 << 20)
SCRIPTS_DIR = Path(__file__).resolve().parent


class _Bulk(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(NET_BYTES))
        self.end_headers()
        for _ in range(NET_BYTES // len(BLOCK)):
            self.wfile.write(BLOCK)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _bulk_server() -> http.server.ThreadingHTTPServer:
    """A loopback HTTP server whose every GET returns `NET_BYTES` bytes (in a daemon thread)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Bulk)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def _download_mib_s(policy: ResourcePolicy, url: str) -> float:
    async with Sandbox(default=policy) as sandbox:
        await sandbox.warm()
        rates = []
        for run in range(NET_RUNS):
            request = CallRequest(
                call_id=f"net-{run}", name="download", ref="bench_net_tools:TOOLS", input={"url": url}
            )
            outcome = await sandbox.run(request)
            assert outcome.content()[0]["text"] == str(NET_BYTES), outcome
            rates.append(NET_BYTES / (1 << 20) / outcome.usage.wall_s)
        return statistics.median(rates)


def run_network_bench() -> None:
    """Print the median MiB/s of each mode and its ratio to direct."""
    server = _bulk_server()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/"
    os.environ["PYTHONPATH"] = str(SCRIPTS_DIR)
    common: dict[str, Any] = {"wall_timeout_s": 120.0, "env_passthrough": ("PYTHONPATH",)}
    proxied = ResourcePolicy(
        network="allowlist", allow_hosts=(f"127.0.0.1:{port}",), network_bytes=None, **common
    )
    rates = {
        "direct (network=host)": asyncio.run(_download_mib_s(ResourcePolicy(network="host", **common), url)),
        "proxied (network=allowlist)": asyncio.run(_download_mib_s(proxied, url)),
    }
    server.shutdown()
    direct = rates["direct (network=host)"]
    title = f"one call downloading {NET_BYTES >> 20} MiB over loopback"
    print(f"{title} (MiB/s, median of {NET_RUNS}; ratio to direct)")
    for mode, rate in rates.items():
        print(f"  {mode:<30} {rate:>10.1f} {rate / direct:>8.2f}x")
