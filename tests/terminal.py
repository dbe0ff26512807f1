"""Running `ipsec-lab` as a person does: in a real terminal (a pseudo-terminal of a set
size, as ssh or a desktop terminal gives) or in a pipe.

`in_terminal` gives the command a pty as stdin, stdout and stderr, with its window size
set by ioctl (TIOCSWINSZ) and no $COLUMNS, so the program finds its width the way it
does in a real terminal; `in_pipe` gives it pipes. Both return the exit status and what
it printed (stdout and stderr together), with `plain` to take the terminal's escape
sequences off.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

CLI = [str(Path(sys.executable).with_name("ipsec-lab"))]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")
COLOUR = re.compile(r"\x1b\[[0-9;]*(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])[;m]")


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    env.update(extra or {})
    return env


def in_terminal(
    args: list[str], columns: int, env: dict[str, str] | None = None, timeout: float = 300,
    cmd: list[str] | None = None,
) -> tuple[int, str]:  # fmt: skip
    """Run `ipsec-lab ARGS` (or `cmd`) on a pty `columns` wide; (exit status, output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    p = subprocess.Popen(
        (cmd or CLI) + args, stdin=slave, stdout=slave, stderr=slave, env=_env(env),
        start_new_session=True, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.killpg(p.pid, signal.SIGKILL)
                raise TimeoutError(f"{args} still running after {timeout} s:\n{out.decode()}")
            ready, _, _ = select.select([master], [], [], min(left, 1.0))
            if not ready:
                if p.poll() is not None and not select.select([master], [], [], 0.2)[0]:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not chunk:
                break
            out += chunk
        rc = p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        os.close(master)
    return rc, out.decode("utf-8", "replace").replace("\r\n", "\n")


def in_pipe(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[int, str]:
    """Run `ipsec-lab ARGS` with pipes for stdout and stderr; (exit status, output)."""
    p = subprocess.run(
        CLI + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=_env(env), timeout=timeout, text=True,
    )  # fmt: skip
    return p.returncode, p.stdout


def plain(text: str) -> str:
    """`text` without the terminal's escape sequences."""
    return ANSI.sub("", text)


def values(table_text: str) -> set[str]:
    """The words of a piped table (box-drawing and rules left out): what must appear
    whole wherever the same table prints."""
    words = set()
    for w in table_text.split():
        w = w.strip("│┃┏┓┗┛┡┩└┘┌┐├┤─━╇╈┼═║╭╮╰╯|")
        if w and not set(w) <= set("─━-=|:"):
            words.add(w)
    return words
