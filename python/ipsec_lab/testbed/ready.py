"""Waiting for a daemon the lab started to be ready: its control socket taking a
connection, or its log saying so — bounded in time, and over as soon as it exits."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from ipsec_lab.testbed.interface import Process


def _wait_until(ready: Callable[[], bool], proc: Process, timeout: float) -> bool:
    """Poll `ready` every 50 ms until it holds; False if `proc` exits or `timeout` seconds
    pass first."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def accepts(path: Path) -> bool:
    """Whether the Unix stream socket at `path` takes a connection now. A socket file
    exists from a daemon's bind(), before its listen(): charon under a CPU quota was
    seen to refuse swanctl in between (CI, stop 63), so the file alone is not "up"."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def wait_for_socket(path: Path, proc: Process, timeout: float) -> bool:
    """Wait until the daemon's Unix socket at `path` accepts a connection (it is up);
    False if `proc` exits or `timeout` seconds pass first."""
    return _wait_until(lambda: accepts(path), proc, timeout)


def wait_for_text(log: Path, text: str, proc: Process, timeout: float) -> bool:
    """Wait until `proc`'s log says `text` (it is ready); False if it exits or `timeout`
    seconds pass first."""
    want = text.encode()
    return _wait_until(lambda: want in (log.read_bytes() if log.exists() else b""), proc, timeout)
