"""The user-space WireGuards (`wireguard-go`, `boringtun`): one process per tunnel end
on a TUN device it makes, keyed with `wg` over its UAPI socket; everything else — keys,
ports, MTU, handshake, fail-closed routing, stop — is `wireguard._WireGuard`'s, shared
with the kernel's WireGuard (see that module's notes).

`wireguard-go`: Debian's. It ships 0.0.20220316, which predates upstream's 2023 batching
and offload work: every row's backend version says so, so that nobody reads its figures
as today's wireguard-go.

`boringtun`: Cloudflare's, in Rust (`boringtun-cli` from crates.io)."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from ipsec_lab.backends.base import Unsupported, exited
from ipsec_lab.backends.wireguard import End, _WireGuard
from ipsec_lab.testbed.build import LabError, tail
from ipsec_lab.testbed.interface import READY_S, Testbed, on_hosts
from ipsec_lab.testbed.ready import wait_for_socket

WG_GO = "wireguard-go"
BORINGTUN = "boringtun-cli"
BORINGTUN_VERSION = "0.7.1"  # the one the Makefile installs (crates.io)
UAPI_DIR = Path("/var/run/wireguard")  # the control sockets, IFNAME.sock
DEBIAN_NOTE = (
    "predates upstream's 2023 batching and offload work, so not today's wireguard-go speed"
)
BATCHING_SINCE = 20230000  # the first upstream release date with them (v0.0.2023MMDD)
# N tunnels: a process per device, and gwB runs a device per site (wireguard.py)
MOST_SITES = 64
MOST_SITES_WHY = "gwB plays every site, a user-space WireGuard process each: the lab's bound"


class _UserSpace(_WireGuard):
    """A user-space WireGuard (`program`): one process per end, in its node's namespace
    (or on its real host), on a TUN device it makes; `wg` reaches it through its UAPI
    socket (/var/run/wireguard/DEV.sock), as the kernel's through netlink."""

    program = ""
    package = ""  # where `program` comes from, for the refusal
    args: tuple[str, ...] = ("--foreground",)

    def check(self, configuration: str) -> None:
        super().check(configuration)
        if not self.on_hosts and self.binary() is None:
            raise Unsupported(f"no {self.program} here ({self.package}; `make deps`)")

    def binary(self) -> str | None:
        """`program` on this machine's PATH (None: not here)."""
        return shutil.which(self.program)

    def _program(self, tb: Testbed) -> str:
        """The program that runs: on a host the one on its PATH, here the one `check`
        found."""
        return self.program if on_hosts(tb) else (self.binary() or self.program)

    def _devices(self, tb: Testbed, ends: list[End]) -> None:
        on = tb if on_hosts(tb) else None
        program = self._program(tb)
        for e in ends:
            # its control socket, should the lab not reach stop (wireguard-go watches the
            # file and exits when it goes; either way the file is the run's to remove)
            sock = UAPI_DIR / f"{e.dev}.sock"
            if on is not None:
                on.record(e.node, f"{self.name} {e.dev}'s control socket",
                          shlex.join(["rm", "-f", str(sock)]))  # fmt: skip
            else:
                tb.on_teardown(functools.partial(sock.unlink, missing_ok=True))
            e.proc = tb.spawn(e.node, [program, *self.args, e.dev], f"{self.name}-{e.dev}",
                              limited=e.node in tb.topo.limited_nodes, ipsec=True)  # fmt: skip
        for e in ends:
            assert e.proc is not None
            sock = UAPI_DIR / f"{e.dev}.sock"
            up = (on.wait_socket(e.node, str(sock), ["wg", "show", e.dev], e.proc, READY_S)
                  if on is not None else wait_for_socket(sock, e.proc, READY_S))  # fmt: skip
            if not up:
                raise LabError(f"{self.name} on {e.node} did not start (no UAPI socket "
                               f"{sock}):\n{self._log(tb, e)}")  # fmt: skip

    def _log(self, tb: Testbed, e: End) -> str:
        if on_hosts(tb):
            return tb.log_tail(e.node, f"{self.name}-{e.dev}")
        return tail(tb.rundir / f"{self.name}-{e.dev}.log")

    def _down(self, tb: Testbed, e: End) -> None:
        sock = UAPI_DIR / f"{e.dev}.sock"
        try:
            if e.proc is not None:
                tb.stop(e.proc)  # its device goes with it
        finally:
            if on_hosts(tb):
                tb.run(e.node, ["rm", "-f", str(sock)], check=False)
            else:
                sock.unlink(missing_ok=True)

    def pids(self) -> list[int]:
        """This machine's processes of the tunnel (on real hosts, none here)."""
        return [e.proc.pid for e in self._ends if e.proc is not None and e.proc.poll() is None
                and not self.on_hosts]  # fmt: skip

    def host_pids(self) -> dict[str, list[int]]:
        """On real hosts: node -> its running processes of the tunnel there."""
        out: dict[str, list[int]] = {}
        for e in self._ends:
            if self.on_hosts and e.proc is not None and e.proc.poll() is None:
                out.setdefault(e.node, []).append(e.proc.pid)
        return out

    def died(self) -> str | None:
        return exited({f"{e.node} ({e.dev})": e.proc for e in self._ends if e.proc},
                      self.program)  # fmt: skip

    def said(self, text: str) -> str:
        """The row's version from what `program --version` printed."""
        return text

    def _node_version(self, tb: Testbed, node: str) -> str:
        said = tb.run(node, [self._program(tb), "--version"], check=False).strip()
        return self.said(said.splitlines()[0] if said else "")

    def version(self) -> str:
        if self._version:
            return self._version + (" (on the hosts)" if self.on_hosts else "")
        try:
            p = subprocess.run([self.binary() or self.program, "--version"],
                               capture_output=True, text=True, timeout=5)  # fmt: skip
            said = p.stdout.strip().splitlines()[0] if p.stdout.strip() else ""
        except (OSError, subprocess.TimeoutExpired):
            said = ""
        return self.said(said)


class WireguardGo(_UserSpace):
    """wireguard-go (Debian's): its version says when it predates upstream's batching."""

    name = "wireguard-go"
    program = WG_GO
    package = "Debian package wireguard-go"

    def said(self, text: str) -> str:
        return versioned(text)


class Boringtun(_UserSpace):
    """boringtun, Cloudflare's user-space WireGuard in Rust (`boringtun-cli`, from
    crates.io: the Makefile installs BORINGTUN_VERSION into /usr/local/bin). In the
    foreground, with its default four threads, and as root as the lab runs every tunnel
    (`--disable-drop-privileges`: its own drop takes the user of `sudo`, which a lab run
    as root has not)."""

    name = "boringtun"
    program = BORINGTUN
    modifies_peers = False
    handshake_since = True
    package = f"`cargo install boringtun-cli --version {BORINGTUN_VERSION}`"
    args = ("--foreground", "--disable-drop-privileges")

    def binary(self) -> str | None:
        # also where the Makefile puts it, off a sudo's PATH (secure_path has no
        # /usr/local/bin on some systems) — never a user's own directory (~/.cargo/bin:
        # under `sudo -E` $HOME is the user's, and root would run what they can write)
        for where in (shutil.which(self.program), f"/usr/local/bin/{self.program}"):
            if where and Path(where).is_file() and os.access(where, os.X_OK):
                return where
        return None

    def said(self, text: str) -> str:
        return text.replace("boringtun ", "boringtun-cli ", 1) if text else (
            "boringtun-cli (unknown version)")  # fmt: skip


def versioned(said: str) -> str:
    """The row's version: what wireguard-go says, and — for a release from before
    upstream's batching (v0.0.YYYYMMDD before 2023) — that its figures are not today's."""
    m = re.search(r"v0\.0\.(\d{8})", said)
    if not said:
        return "wireguard-go (unknown version)"
    return f"{said} ({DEBIAN_NOTE})" if m and int(m.group(1)) < BATCHING_SINCE else said
