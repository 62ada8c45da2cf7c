"""Held-connection floods, as an attacker holding a server's memory runs them: many TLS
connections, each sends one complete request and then the next request's headers a byte at a time,
from several loopback addresses (Linux routes all of 127.0.0.0/8 to lo, so each is a client address
of its own to the server).

    result = flood(port, context, connections=1800, addresses=16, hold_seconds=6)

runs in a thread of its own (its own event loop), so a test can call the server meanwhile.
"""
from __future__ import annotations

import asyncio
import re
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from .net import LOOPBACK

TRICKLE = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 4000


@dataclass
class FloodResult:
    """What the clients saw. Whether the server still holds a connection is the server's to say
    (its open files): a client's TLS stream notices a close only when it next reads."""

    attempted: int = 0
    answered: int = 0  # the first request was answered
    refused: int = 0  # the connection or its first request got no answer

    def __str__(self) -> str:
        return f"{self.attempted} connections, {self.answered} first requests answered, {self.refused} not"


def source_address(index: int) -> str:
    """The loopback address of flood client ``index`` (127.0.0.2 onwards; 127.0.0.1 is the tests')."""
    return f"127.0.0.{2 + index}"


async def _hold(port: int, context: ssl.SSLContext, source: str, path: str, until: float, every: float,
                result: FloodResult) -> None:
    loop = asyncio.get_running_loop()
    result.attempted += 1
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            LOOPBACK, port, ssl=context, server_hostname="localhost", local_addr=(source, 0)), 15)
    except (OSError, asyncio.TimeoutError):
        result.refused += 1
        return
    try:
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await asyncio.wait_for(reader.readexactly(int(length.group(1)) if length else 0), 15)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            result.refused += 1
            return
        result.answered += 1
        for byte in TRICKLE:
            if loop.time() >= until:
                return
            writer.write(bytes([byte]))
            try:
                if await asyncio.wait_for(reader.read(1), every) == b"":
                    return  # closed by the server
            except asyncio.TimeoutError:
                continue  # still open: the next byte
    except OSError:
        return  # cut by the server
    finally:
        writer.transport.abort()


async def _flood(port: int, context: ssl.SSLContext, connections: int, addresses: int, hold_seconds: float,
                 every: float, path: str) -> FloodResult:
    result = FloodResult()
    loop = asyncio.get_running_loop()
    until = loop.time() + hold_seconds
    batch = 100
    tasks = []
    for start in range(0, connections, batch):  # opened in batches, as fast as the handshakes go
        opened = [asyncio.create_task(_hold(port, context, source_address(i % addresses), path, until, every, result))
                  for i in range(start, min(start + batch, connections))]
        tasks += opened
        await asyncio.sleep(0.05)
    await asyncio.gather(*tasks)
    return result


def flood(port: int, context: ssl.SSLContext, *, connections: int, addresses: int, hold_seconds: float,
          every: float = 1.0, path: str = "/healthz") -> "FloodThread":
    """Start the flood in a thread; ``.result()`` waits for it (every connection closed by then)."""
    thread = FloodThread(lambda: asyncio.run(_flood(port, context, connections, addresses, hold_seconds, every,
                                                    path)))
    thread.start()
    return thread


class FloodThread(threading.Thread):
    def __init__(self, run) -> None:
        super().__init__(daemon=True)
        self._run, self._result, self._error = run, None, None

    def run(self) -> None:
        try:
            self._result = self._run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in result()
            self._error = exc

    def result(self, timeout: float = 300) -> FloodResult:
        self.join(timeout)
        if self._error is not None:
            raise self._error
        assert self._result is not None, "the flood did not finish"
        return self._result


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory now (VmRSS) or at its peak (VmHWM), from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) * 1024


def open_files(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))
