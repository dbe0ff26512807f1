"""The IPsec under test: how each implementation is started in a testbed's IPsec nodes.

- `none`: plain forwarding, the baseline every ratio is taken against;
- `strongswan-kernel`: charon negotiating a real IKEv2 PSK tunnel, configured through
  swanctl, its SAs in the kernel's xfrm; `strongswan-libipsec`: the same with
  kernel-libipsec (strongSwan's own user-space ESP on a TUN device); `strongswan`: the
  kernel one where the kernel has ESP, else libipsec;
- `xfrm`: the Linux kernel's IPsec, keyed by hand; detected, and refused with the reason
  when the kernel lacks it; `xfrm-udp` the same with ESP in UDP (RFC 3948);
- `ours`: the `ipsec-gw` gateway daemon.

A backend that cannot run a configuration raises `Unsupported` with the reason; the run
is then recorded as skipped with that reason, not silently dropped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Protocol

from ipsec_lab.testbed.build import Testbed


class Unsupported(Exception):
    """This backend cannot run this configuration here (the message says why)."""


class Backend(Protocol):
    name: str

    def check(self, configuration: str) -> None:
        """Raise `Unsupported` if the configuration cannot run (cheap; no testbed)."""

    def start(self, tb: Testbed, configuration: str) -> None:
        """Bring the IPsec up in the testbed's IPsec nodes; traffic flows when it returns."""

    def stop(self, tb: Testbed) -> None:
        """Take it down (the testbed stays)."""

    def pids(self) -> list[int]:
        """The processes doing the IPsec work (for per-process CPU), if any."""

    def plane_clock(self) -> dict[str, tuple[int, int]]:
        """Per IPsec node whose own process seals and opens the packets (ESP in user
        space) and counts them: (CPU ns that process has run, packets it has sealed or
        opened), both so far; empty where there is none (the kernel's ESP, whose work
        is softirq time; an IKE daemon; a data plane that does not count)."""

    def died(self) -> str | None:
        """Why the IPsec is no longer whole (a process of it exited), or None. A run
        through a dead gateway is no measurement of IPsec: the lab's gateways keep plain
        routes (backend `none`'s path), so its traffic may even have gone in clear."""

    def version(self) -> str: ...


def exited(procs: dict[str, subprocess.Popen[bytes]], what: str) -> str | None:
    """`died()` for backends made of processes: which of `procs` exited, with status."""
    gone = [f"{what} {k} exited (status {p.returncode})" for k, p in procs.items()
            if p.poll() is not None]  # fmt: skip
    return "; ".join(gone) or None


class Processless:
    """For backends that start no processes of their own (or none yet): `start` only
    checks, `stop` and `pids` have nothing to do."""

    def check(self, configuration: str) -> None:
        return None

    def start(self, tb: Testbed, configuration: str) -> None:
        self.check(configuration)

    def stop(self, tb: Testbed) -> None:
        return None

    def pids(self) -> list[int]:
        return []

    def plane_clock(self) -> dict[str, tuple[int, int]]:
        return {}

    def died(self) -> str | None:
        return None


def private_file(path: Path, text: str) -> None:
    """Write `text` (it holds keys) to a file that is 0600 from its first byte — never
    world-readable in between, as a write then a chmod would leave it — and never through
    a symlink put in its place."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # a file that existed keeps its mode otherwise
        f.write(text)


def private_dir(path: Path) -> Path:
    """A directory only its owner (root) may list or enter, made 0700 from the start."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def make(name: str, stage_timing: bool = False) -> Backend:
    """The backend `name`; `stage_timing` switches on ours' per-stage counters (the
    others have none: the lab then records no per-stage split for them)."""
    if name == "none":
        from ipsec_lab.backends.none import NoIpsec

        return NoIpsec()
    if name in ("strongswan", "strongswan-kernel", "strongswan-libipsec"):
        from ipsec_lab.backends.strongswan import StrongSwan

        plane = {"strongswan-kernel": "kernel", "strongswan-libipsec": "libipsec"}
        return StrongSwan(plane.get(name, "auto"))
    if name in ("xfrm", "xfrm-udp"):
        from ipsec_lab.backends.xfrm import Xfrm

        return Xfrm(udp_encap=name == "xfrm-udp")
    if name == "ours":
        from ipsec_lab.backends.ours import Ours

        return Ours(stage_timing=stage_timing)
    if name == "ours-udp":
        from ipsec_lab.backends.ours import Ours

        return Ours(udp_encap=True, stage_timing=stage_timing)
    raise ValueError(f"unknown backend {name!r}")
