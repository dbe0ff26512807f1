"""A daemon is up when its control socket takes a connection, not when the socket's file
exists: bind() makes the file, listen() comes after. CI (stop 63) had charon, under a
tenth of a CPU on a busy machine, refuse swanctl in between."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from ipsec_lab.testbed.ready import accepts, wait_for_socket


def _sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_a_socket_bound_but_not_listening_is_not_up_until_it_listens(tmp_path: Path) -> None:
    path = tmp_path / "d.sock"
    proc = _sleeper(30)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            assert not accepts(path)  # no file yet
            s.bind(str(path))
            assert path.exists()  # what the old wait took for "up"
            assert not accepts(path)
            assert not wait_for_socket(path, proc, timeout=0.3)
            s.listen(1)
            assert accepts(path)
            assert wait_for_socket(path, proc, timeout=5)
    finally:
        proc.kill()
        proc.wait()


def test_a_daemon_that_exits_before_listening_ends_the_wait(tmp_path: Path) -> None:
    path = tmp_path / "d.sock"
    proc = _sleeper(0)
    proc.wait()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        assert not wait_for_socket(path, proc, timeout=30)
