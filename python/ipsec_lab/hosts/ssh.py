"""The transport to a real host: OpenSSH itself, one multiplexed connection per host.

Every command goes through the user's `ssh` with ControlMaster/ControlPersist, so
~/.ssh/config, keys, the agent, jump hosts and known_hosts all apply as they do for the
user; the lab adds only `BatchMode=yes` (it never asks for a password) and its own
control socket. Not a home-made agent: nothing is installed on the host but the files
the lab pushes into its work directory.

A non-root login runs each command through `sudo -n` (passwordless sudo, or a clear
error). A command that uses the run's directory on the host carries that directory's
check in front of it, in the same round trip (`guard`: `hosts.workdir`), and does not
run when the check refuses it (`UnsafeError`). A long-running program is started by
`spawn`: the ssh session that started it stays open while it runs (so `poll()` sees it
exit, with its status), and it is stopped by its PID on the host, never by name.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipsec_lab.hosts.shell import INLINE_INPUT_MAX, Shell, ShellEnded, ShellTimeout
from ipsec_lab.hosts.workdir import GUARD_EXIT, Guard, UnsafeError, refusals
from ipsec_lab.testbed.build import LabError

# ssh's own exit status when the connection (not the command) failed.
SSH_FAILED = 255
CONNECT_TIMEOUT_S = 10


# Addresses kept for documentation (RFC 5737, RFC 3849): the shipped examples' placeholders.
DOCUMENTATION_NETS = ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")


def placeholder(target: str) -> str | None:
    """Why an ssh target is a placeholder, not a machine (None: it may be one)."""
    import ipaddress

    host = target.rpartition("@")[2]
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name or an ssh_config alias
    for net in DOCUMENTATION_NETS:
        if addr in ipaddress.ip_network(net):
            return (f"{host} is a documentation address ({net}, RFC 5737/3849): a "
                    "placeholder, as in the shipped examples — put the machine's name or "
                    "address in a copy of the file")  # fmt: skip
    return None


class SshError(LabError):
    """A host could not be reached or a command on it failed; the message names the host."""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    raw: bytes = b""  # stdout's bytes


class Ssh:
    """One host through one multiplexed OpenSSH connection."""

    def __init__(self, dest: str, node: str, ssh_config: str | None = None) -> None:
        self.dest = dest
        self.node = node
        self.ssh_config = ssh_config
        # A control socket path must fit in 108 bytes: a short private directory.
        self._dir = Path(tempfile.mkdtemp(prefix="ipl-ssh-"))
        self.control = self._dir / "c"
        self.sudo: list[str] | None = None  # decided by `connect`
        self.uid = 0  # the login user's, learnt by `connect`
        self.connected = False  # `connect` succeeded: a later failure is a lost connection
        # kept shells (hosts/shell.py), as root (through sudo) and as the login user
        self._shells: dict[bool, Shell] = {}
        self._shells_lock = threading.Lock()
        # How messages name it: its node, and where it is when that says more.
        self.who = node if dest == node else f"{node} ({dest})"

    def base(self) -> list[str]:
        """The ssh command line up to the destination."""
        argv = ["ssh"]
        if self.ssh_config:
            argv += ["-F", self.ssh_config]
        return [*argv,
                "-o", "BatchMode=yes",
                "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control}",
                "-o", "ControlPersist=60",
                self.dest]  # fmt: skip

    def line(self, argv: list[str] | str, root: bool = True, guard: Guard | None = None,
             in_sh: bool = False) -> str:  # fmt: skip
        """The shell line the host runs for `argv` (a list, or a shell command line): as
        root when `root` (through sudo for another user); with `guard` (a
        `workdir.guard`) first, the command running only if it passes (`in_sh`: the line
        is read by `sh`, not by the login's own shell)."""
        line = argv if isinstance(argv, str) else shlex.join(argv)
        if guard:
            check = guard.in_sh if in_sh else guard.line
            line = f"{check} || exit {GUARD_EXIT}\n{line}"
        if root and self.sudo:
            line = shlex.join([*self.sudo, "sh", "-c", line])
        return line

    def remote(self, argv: list[str] | str, root: bool = True,
               guard: Guard | None = None) -> list[str]:  # fmt: skip
        """The local argv that runs `argv` on the host (see `line`)."""
        return [*self.base(), "--", self.line(argv, root, guard)]

    def refused(self, returncode: int | None, stderr: str, guard: Guard) -> None:
        """Raise UnsafeError if `guard`'s check refused its directory."""
        if returncode == GUARD_EXIT:
            found = refusals(stderr)
            if found:
                raise UnsafeError(self.who, guard.workdir, found)

    def connect(self) -> str:
        """Open the master connection and learn who we are; the user name. Raises
        SshError naming the host if it cannot be reached or gives no root."""
        if why := placeholder(self.dest):  # fails at once, not after a connect timeout
            raise SshError(f"{self.who}: {why}")
        r = self.run("id -un && id -u", root=False, timeout=CONNECT_TIMEOUT_S + 20, check=False)
        if r.returncode != 0:
            raise SshError(f"{self.who}: cannot connect: {_last(r.stderr)}")
        said = r.stdout.split()
        if len(said) != 2 or not said[1].isdigit():
            raise SshError(f"{self.who}: `id` said {r.stdout.strip()[:80]!r}, not a user and uid")
        user, self.uid = said[0], int(said[1])
        self.connected = True
        if user != "root":
            r = self.run(["sudo", "-n", "true"], root=False, check=False)
            if r.returncode != 0:
                raise SshError(f"{self.who}: user {user} has no passwordless "
                               f"sudo (sudo -n: {_last(r.stderr)})")  # fmt: skip
            self.sudo = ["sudo", "-n", "--"]
        return user

    def run(
        self,
        argv: list[str] | str,
        timeout: float = 60,
        check: bool = True,
        input: bytes | None = None,
        root: bool = True,
        guard: Guard | None = None,
    ) -> Result:
        """Run a command on the host to completion; its status and output. `guard` (a
        `workdir.guard`): the command runs only if the check passes, else UnsafeError
        (whatever `check` says)."""
        r = self._exec(argv, root, guard, input, timeout)
        if r.returncode == SSH_FAILED:
            lost = _lost(r.stderr)
            if lost:
                what = "connection lost" if self.connected else "cannot connect"
                raise SshError(f"{self.who}: {what}: {lost}")
        if guard:
            self.refused(r.returncode, r.stderr, guard)
        if check and r.returncode != 0:
            raise SshError(f"{self.node}: failed ({r.returncode}): {_show(argv)}\n"
                           f"{r.stderr.strip()[-800:]}")  # fmt: skip
        return r

    def _exec(self, argv: list[str] | str, root: bool, guard: Guard | None,
              input: bytes | None, timeout: float) -> Result:  # fmt: skip
        """Run a command through a kept shell when one is free (else a session of its
        own, as before the connection was made or while another thread's command runs)."""
        shell = None
        if self.connected and (input is None or len(input) <= INLINE_INPUT_MAX):
            shell = self._shell(root)
        if shell is None:
            try:
                p = subprocess.run(self.remote(argv, root, guard), input=input,
                                   capture_output=True, timeout=timeout, check=False)  # fmt: skip
            except subprocess.TimeoutExpired:
                raise self._timed_out(argv, timeout) from None
            status, out, err = p.returncode, p.stdout, p.stderr
        else:
            try:
                # the shell is root's already: the line without sudo
                status, out, err = shell.run(self.line(argv, False, guard, True), input, timeout,
                                             words=_words(argv))  # fmt: skip
            except ShellTimeout:
                raise self._timed_out(argv, timeout) from None
            except ShellEnded as e:
                if e.status == SSH_FAILED and _lost(e.stderr):
                    status, out, err = SSH_FAILED, b"", e.stderr.encode()
                else:
                    raise SshError(f"{self.who}: connection lost: the shell ended "
                                   f"({e.status}): {_last(e.stderr)}") from None  # fmt: skip
            finally:
                shell.lock.release()
        return Result(status, out.decode(errors="replace"), err.decode(errors="replace"),
                      out)  # fmt: skip

    def _timed_out(self, argv: list[str] | str, timeout: float) -> SshError:
        return SshError(f"{self.node}: timed out after {timeout:g} s: {_show(argv)}")

    def _shell(self, root: bool) -> Shell | None:
        """This host's kept shell for `root`, locked for the caller; None while another
        thread's command holds it."""
        sudo = bool(root and self.sudo)
        with self._shells_lock:
            shell = self._shells.get(sudo)
            if shell is None:
                remote = shlex.join([*(self.sudo or []), "sh"]) if sudo else "exec sh"
                shell = self._shells[sudo] = Shell([*self.base(), "--", remote])
        return shell if shell.lock.acquire(blocking=False) else None

    def push(self, data: bytes, path: str, mode: int = 0o600,
             guard: Guard | None = None) -> None:  # fmt: skip
        """Write `data` to `path` on the host, created with `mode` (never wider first:
        the umask is set before the file exists); `guard` as for `run`."""
        umask = 0o777 & ~mode
        d = os.path.dirname(path)
        # directories 0700 (searchable by their owner: a mode without x bits would lock
        # out any process of root's that lacks CAP_DAC_OVERRIDE, as a gateway that gave
        # it up); the file with its own mode from the start
        line = (f"(umask 077 && mkdir -p {shlex.quote(d)}) && umask {umask:03o} && "
                f"rm -f {shlex.quote(path)} && cat > {shlex.quote(path)} && "
                f"chmod {mode:o} {shlex.quote(path)}")  # fmt: skip
        self.run(line, input=data, timeout=120, guard=guard)

    def append(self, text: str, path: str, guard: Guard | None = None) -> None:
        """Append ASCII `text` (a ledger entry) to `path` on the host, created 0600."""
        if len(text) <= APPEND_INLINE and text.isascii():
            # the shell's own printf: no input to decode, no program started for it (the
            # text is then in the host's `ps` for a moment: the lab's ledger entries are
            # undo lines, shown there anyway when they run)
            line = f"umask 077 && printf %s {shlex.quote(text)} >> {shlex.quote(path)}"
            self.run(line, guard=guard)
        else:  # on stdin: a command line's length is bounded
            self.run(f"umask 077 && cat >> {shlex.quote(path)}", input=text.encode(),
                     guard=guard)  # fmt: skip

    def fetch(self, path: str, guard: Guard | None = None) -> bytes:
        """The bytes of file `path` on the host; `guard` as for `run`."""
        r = self._exec(["cat", "--", path], True, guard, None, 120)
        if guard:
            self.refused(r.returncode, r.stderr, guard)
        if r.returncode != 0:
            raise SshError(f"{self.node}: cannot read {path}: {_last(r.stderr)}")
        return r.raw

    def spawn(self, argv: list[str], log: str, pidfile: str,
              guard: Guard | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
        """Start a long-running program on the host, its output to `log` there and its
        PID (with its start time, so a recycled PID is never taken for it) to `pidfile`.
        The returned process is the ssh session: it ends with the program, with its
        status. `guard`: a `workdir.guard` that must pass before anything is written
        (else the session exits GUARD_EXIT, the refusal on its stderr)."""
        first = f"{guard.line} || exit {GUARD_EXIT}; " if guard else ""
        inner = (f"{first}echo $$ $(cut -d' ' -f22 /proc/$$/stat) > {shlex.quote(pidfile)}; "
                 f"exec {shlex.join(argv)} > {shlex.quote(log)} 2>&1 < /dev/null")  # fmt: skip
        return subprocess.Popen(self.remote(["sh", "-c", inner]), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)  # fmt: skip

    def kill(self, pid: int, start: str, sig: int = signal.SIGTERM) -> bool:
        """Signal the host's process `pid` if it is still the one that started at `start`
        (field 22 of /proc/PID/stat); whether it was there."""
        line = f"{same_process(pid, start)} && kill -{int(sig)} {pid}"
        return self.run(line, check=False, timeout=20).returncode == 0

    def close(self) -> None:
        """End the kept shells, close the master connection (if any) and remove the
        control directory."""
        with self._shells_lock:
            shells, self._shells = list(self._shells.values()), {}
        for shell in shells:
            held = shell.lock.acquire(timeout=10)  # a command still running: ended with it
            shell.close()
            if held:
                shell.lock.release()
        if self.control.exists():
            subprocess.run([*self.base()[:-1], "-O", "exit", self.dest], capture_output=True,
                           timeout=10, check=False)  # fmt: skip
        for _ in range(100):  # the master removes its socket as it exits
            if not self.control.exists():
                break
            time.sleep(0.05)
        # whatever is left (a master still exiting under load keeps its socket there):
        # the directory is the lab's own
        shutil.rmtree(self._dir, ignore_errors=True)


# The longest text `append` writes in its command line (longer goes on stdin).
APPEND_INLINE = 8192
# Words that are syntax where a command begins (POSIX's reserved words, and bash's
# `function` and `select`): shlex leaves them unquoted, so a command line that starts
# with one would be a syntax error of the kept shell itself, which would end it.
RESERVED = frozenset("case do done elif else esac fi for function if in select then until "
                     "while".split())  # fmt: skip


def _words(argv: list[str] | str) -> bool:
    """Whether `argv`'s line can run in a subshell of the kept shell (`Shell.run`'s
    `words`): a list of words that cannot be a syntax error, whatever they hold."""
    return isinstance(argv, list) and bool(argv) and argv[0] not in RESERVED


def same_process(pid: int, start: str) -> str:
    """A shell test: process `pid` is still the one that started at `start` (field 22 of
    its /proc/PID/stat), not another that got its PID since."""
    return f"[ \"$(cut -d' ' -f22 /proc/{pid}/stat 2>/dev/null)\" = {shlex.quote(start)} ]"


def each(fn: Callable[..., object], args: Iterable[tuple[Any, ...]]) -> None:
    """`fn(*a)` for every `a` at once, one thread each (a call per host: their ssh round
    trips overlap instead of adding up); returns when all have."""
    items = list(args)
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as ex:
        for f in [ex.submit(fn, *a) for a in items]:
            f.result()


def _show(argv: list[str] | str) -> str:
    return argv if isinstance(argv, str) else shlex.join(argv)


def _last(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "no message"


def _lost(stderr: str) -> str | None:
    """ssh's own words when the connection, not the command, failed."""
    for line in stderr.splitlines():
        low = line.lower()
        if any(
            w in low
            for w in (
                "connection refused",
                "connection closed",
                "timed out",
                "broken pipe",
                "no route to host",
                "connection reset",
                "could not resolve",
                "permission denied",
                "host key",
            )
        ):
            return line.strip()
    return None
