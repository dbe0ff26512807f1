"""What every backend is built from: the `Backend` protocol the runner drives, the
`Unsupported` refusal, and the helpers backends share (private files for keys, a
process-made backend's `died`). The registry of backends is the package's
(`ipsec_lab.backends.REGISTRY`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts
    from ipsec_lab.model.transforms import Configuration
    from ipsec_lab.testbed.interface import Process, Testbed


class Unsupported(Exception):
    """This backend cannot run this configuration here (the message says why)."""


def ipsec_configuration(configuration: str, backend: str) -> Configuration:
    """`configuration` parsed, for a backend that runs IPsec: `none` and `wireguard` are
    refused with what runs them."""
    from ipsec_lab.model.transforms import parse_configuration

    c = parse_configuration(configuration)
    if c.wireguard:
        raise Unsupported(f"{backend} runs IPsec; `wireguard` is WireGuard's configuration "
                          "(backends wireguard, wireguard-go, boringtun)")  # fmt: skip
    if c.is_none:
        raise Unsupported(f"{backend} runs an IPsec configuration; use backend `none` for none")
    return c


class Backend(Protocol):
    name: str

    def use_hosts(self, hosts: Hosts) -> None:
        """It will run on these real hosts: its checks probe them, not this machine."""

    def check(self, configuration: str) -> None:
        """Raise `Unsupported` if the configuration cannot run (cheap; no testbed)."""

    def start(self, tb: Testbed, configuration: str) -> None:
        """Bring the IPsec up in the testbed's IPsec nodes; traffic flows when it returns."""

    def stop(self, tb: Testbed) -> None:
        """Take it down (the testbed stays)."""

    def pids(self) -> list[int]:
        """The processes doing the IPsec work (for per-process CPU), if any."""

    def host_pids(self) -> dict[str, list[int]]:
        """On real hosts: node -> the PIDs there of the processes doing its IPsec work
        (none: the kernel's, or no process the lab can point at)."""

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

    def set_up_figures(self) -> dict[str, float | int | str]:
        """How its last start set its tunnels up, for the rows (an IKE daemon's N
        tunnels: its set-up time and rate, retransmits, CPU); empty where it has none
        beyond the start's time, which the runner takes itself."""

    def rekey(self, tb: Testbed, dry: bool = False) -> dict[str, Any]:
        """Roll every SA over to fresh keys while traffic flows, as this IPsec would in
        service (the `rekey` workload); its figures: `seconds`, `step_seconds`, the new
        `spis`. Raises `Unsupported` where the lab cannot drive one yet (`dry`: only
        that, nothing rolled over)."""


def exited(procs: Mapping[str, Process], what: str) -> str | None:
    """`died()` for backends made of processes: which of `procs` exited, with status."""
    gone = [f"{what} {k} exited (status {p.returncode})" for k, p in procs.items()
            if p.poll() is not None]  # fmt: skip
    return "; ".join(gone) or None


class Processless:
    """For backends that start no processes of their own (or none yet): `start` only
    checks, `stop` and `pids` have nothing to do."""

    name = "this backend"

    def use_hosts(self, hosts: Hosts) -> None:
        return None

    def check(self, configuration: str) -> None:
        return None

    def start(self, tb: Testbed, configuration: str) -> None:
        self.check(configuration)

    def stop(self, tb: Testbed) -> None:
        return None

    def pids(self) -> list[int]:
        return []

    def host_pids(self) -> dict[str, list[int]]:
        return {}

    def plane_clock(self) -> dict[str, tuple[int, int]]:
        return {}

    def died(self) -> str | None:
        return None

    def set_up_figures(self) -> dict[str, float | int | str]:
        return {}

    def rekey(self, tb: Testbed, dry: bool = False) -> dict[str, Any]:
        raise no_rekey(self.name)


def no_rekey(backend: str) -> Unsupported:
    """The refusal of a backend the `rekey` workload cannot drive yet."""
    return Unsupported(
        f"rekey: not yet for {backend} (ours and ours-udp rekey by a "
        "make-before-break rollover; xfrm's and the IKE daemons' are to come)"
    )


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
