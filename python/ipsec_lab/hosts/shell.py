"""One shell kept open on a host, over the host's multiplexed ssh connection: each
command the lab runs there is written to it instead of starting a new ssh session.

A new session costs a local `ssh` process, the server's session set-up and the login
shell (and `sudo`) on the host: 13 ms per command here, and seconds under the micro-VM's
emulation, where a campaign on four hosts runs ~240 commands. Through a kept shell the
host starts only `sh -c LINE`: 1.9 ms per command here.

Each command runs in its own `sh -c` (its `exit`, `cd` or syntax error ends only that
shell; a line of quoted words, which cannot be a syntax error, in a subshell), with
stdin from /dev/null or its input (sent as base64 in the line and decoded into a
temporary file first: binary-safe, and a failed decode is its status), and is followed
by a marker on stdout (`<token> <status>`) and on stderr (`<token>`), the token random
per command, so its output is read to the byte and its status kept. A
command that outlives its timeout ends the whole session (the next command opens a new
one), as a timed-out `ssh` would; a session that ends before its marker is a lost
connection. Output of a process a command leaves running (the lab's never do: a one-shot
`ssh` would hang on one) is caught when it comes between commands or after a marker
(the session is started again, or ended and said); bytes it writes while a later
command runs would be taken for that command's.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import selectors
import shlex
import signal
import subprocess
import threading
import time

# Input over this goes through an ssh session of its own (a line this long would only
# be read into the host's shell to be decoded again).
INLINE_INPUT_MAX = 64 * 1024
# How far back from a buffer's end a marker is looked for: one read and a marker.
MARKER_TAIL = 65536 + 64


class ShellEnded(Exception):
    """The kept shell ended before the command's marker: its ssh's status and stderr."""

    def __init__(self, status: int | None, stderr: str) -> None:
        super().__init__(stderr)
        self.status = status
        self.stderr = stderr


class ShellTimeout(Exception):
    """The command ran past its timeout (the session is gone)."""


class Shell:
    """`sh` reading commands on stdin at the far end of `argv` (an ssh command line)."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.lock = threading.Lock()  # one command at a time; held by the caller
        self._p: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self._p is not None and self._p.poll() is None

    def run(self, line: str, input: bytes | None, timeout: float,
            words: bool = False) -> tuple[int, bytes, bytes]:  # fmt: skip
        """Run `line` (a shell command line) to completion: (status, stdout, stderr).
        `words`: the line is the lab's own, made of shell-quoted words (`shlex.join`,
        with a `workdir.guard` in front; the first no reserved word: `hosts.ssh._words`),
        so it cannot be a syntax error: it runs in a
        subshell of the kept shell, not in a new `sh` (one program started fewer: about
        85 ms a command under the micro-VM's emulation). Raises ShellEnded or
        ShellTimeout. The caller holds `lock`."""
        if not self.alive() or self._stray():
            self._start()
        p = self._p
        assert p is not None and p.stdin is not None
        token = secrets.token_hex(12)
        # a subshell as `sh -c` does: its `exit`, `cd`, `umask` or `exec` end or change
        # only it
        command = f"(\n{line}\n)" if words else f"sh -c {shlex.quote(line)}"
        if input is None:
            command += " </dev/null; s=$?"
        else:
            # decoded into a file first: a failed decode (no base64 there) is the status,
            # never a command run on empty input
            data = base64.b64encode(input).decode()
            command = (f"t=$(mktemp) && printf %s {data} | base64 -d > \"$t\" && "
                       f"{command} < \"$t\"; s=$?; rm -f \"$t\"")  # fmt: skip
        script = f"{command}; printf '\\n%s %d\\n' {token} $s; printf '\\n%s\\n' {token} >&2\n"
        try:
            p.stdin.write(script.encode())
            p.stdin.flush()
        except OSError:
            raise self._ended() from None
        return self._read(token.encode(), time.monotonic() + timeout)

    def _start(self) -> None:
        self.close()
        self._p = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        for f in (self._p.stdout, self._p.stderr):
            assert f is not None
            os.set_blocking(f.fileno(), False)

    def _stray(self) -> bool:
        """Whether anything is waiting on the shell's stdout or stderr before a command
        is sent (output of a process an earlier command left behind): it must not be
        taken for the next command's, so the session is started again."""
        p = self._p
        assert p is not None and p.stdout is not None and p.stderr is not None
        for f in (p.stdout, p.stderr):
            try:
                if os.read(f.fileno(), 65536) is not None:
                    return True  # bytes, or end of file: either way not a clean session
            except BlockingIOError:
                continue
        return False

    def _read(self, token: bytes, deadline: float) -> tuple[int, bytes, bytes]:
        p = self._p
        assert p is not None and p.stdout is not None and p.stderr is not None
        out, err = bytearray(), bytearray()
        status: int | None = None
        err_done = False
        end_out = re.compile(b"\n" + token + rb" (-?[0-9]+)\n")
        end_err = b"\n" + token + b"\n"
        with selectors.DefaultSelector() as sel:
            sel.register(p.stdout, selectors.EVENT_READ, out)
            sel.register(p.stderr, selectors.EVENT_READ, err)
            while status is None or not err_done:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._kill()
                    raise ShellTimeout()
                for key, _ in sel.select(min(left, 1.0)):
                    try:
                        chunk = os.read(key.fd, 65536)
                    except (OSError, ValueError):  # closed under us by `close`
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fileobj)
                        if not sel.get_map():
                            raise self._ended(bytes(err))
                        continue
                    key.data.extend(chunk)
                if status is None and (m := end_out.search(out, max(0, len(out) - MARKER_TAIL))):
                    status = int(m.group(1))
                    after, out = out[m.end() :], out[: m.start()]
                    if after:  # bytes after the end: not this command's
                        raise self._desync()
                if not err_done and (i := err.find(end_err, max(0, len(err) - MARKER_TAIL))) >= 0:
                    err_done = True
                    after, err = err[i + len(end_err) :], err[:i]
                    if after:
                        raise self._desync()
        return status, bytes(out), bytes(err)

    def _desync(self) -> ShellEnded:
        """Output after a command's end marker (a process it left running writes on):
        the session cannot be trusted to say whose output is whose; it is ended."""
        self._kill()
        return ShellEnded(None, "output came after the command's end (a process it left "
                                "behind?): the shell was ended")  # fmt: skip

    def _ended(self, err: bytes = b"") -> ShellEnded:
        p = self._p
        status = None
        if p is not None:
            try:
                status = p.wait(5)
            except subprocess.TimeoutExpired:
                self._kill()
            if p.stderr is not None:
                try:
                    err += p.stderr.read() or b""
                except (OSError, ValueError):
                    pass
        self._p = None
        return ShellEnded(status, err.decode(errors="replace"))

    def _kill(self) -> None:
        p, self._p = self._p, None
        if p is None:
            return
        try:
            os.killpg(p.pid, signal.SIGKILL)  # its own session: the ssh client alone
        except ProcessLookupError:
            pass
        p.wait()
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass

    def close(self) -> None:
        """End the shell (its stdin closed: it exits); killed if it has not in 5 s."""
        p = self._p
        if p is None:
            return
        try:
            if p.stdin is not None:
                p.stdin.close()
            p.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._kill()
