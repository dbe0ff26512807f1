"""The IPsec under test: how each implementation is started in a testbed's IPsec nodes.

`REGISTRY` lists every backend once (name, module, what it is); the scenario's
validation, the CLI's choices and help and the docs derive from it. Each lives in its
own module here; the SA planning those that key their own SAs share is `sa_plan`.

A backend that cannot run a configuration raises `Unsupported` with the reason; the run
is then recorded as skipped with that reason, not silently dropped.
"""

from __future__ import annotations

import importlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
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


@dataclass(frozen=True)
class Entry:
    """One backend of the registry: its name, where its class lives and how it is built."""

    name: str
    module: str  # under ipsec_lab.backends
    cls: str
    what: str  # one line for --help and the docs
    kwargs: tuple[tuple[str, Any], ...] = ()
    stage_timing: bool = False  # takes ours' per-stage counters
    # Where it runs: on the namespace testbed, on real hosts (`--hosts`), or both.
    namespaces: bool = True
    hosts: bool = False

    @property
    def ipsec(self) -> bool:
        """Whether it runs IPsec at all (`none` is the baseline)."""
        return self.name != "none"


# Every backend, once: scenario validation, the CLI's choices and help, and the docs
# derive from this list. A new backend is its module and one line here.
REGISTRY: tuple[Entry, ...] = (
    Entry("none", "none", "NoIpsec", "plain forwarding, the baseline every ratio is taken against",
          hosts=True),
    Entry("strongswan", "strongswan", "StrongSwan",
          "charon negotiating IKEv2 (PSK): strongswan-kernel where the kernel has ESP, "
          "else strongswan-libipsec",
          (("data_plane", "auto"),), hosts=True),
    Entry("strongswan-kernel", "strongswan", "StrongSwan",
          "charon with its SAs in the kernel's xfrm", (("data_plane", "kernel"),), hosts=True),
    Entry("strongswan-libipsec", "strongswan", "StrongSwan",
          "charon with kernel-libipsec, strongSwan's own user-space ESP on a TUN device",
          (("data_plane", "libipsec"),), hosts=True),
    Entry("xfrm", "xfrm", "Xfrm", "the Linux kernel's IPsec, keyed by hand", hosts=True),
    Entry("xfrm-udp", "xfrm", "Xfrm", "the same with ESP in UDP, RFC 3948",
          (("udp_encap", True),), hosts=True),
    Entry("ours", "ours", "Ours", "this project's gateway, ipsec-gw", stage_timing=True,
          hosts=True),
    Entry("ours-udp", "ours", "Ours", "ipsec-gw with ESP in UDP, RFC 3948, and UDP GSO/GRO",
          (("udp_encap", True),), stage_timing=True, hosts=True),
    Entry("external", "external", "External",
          "a gateway pair the lab does not configure (an appliance, a cloud VPN): it drives "
          "and meters the traffic ends only; real hosts only (--hosts)",
          namespaces=False, hosts=True),
)  # fmt: skip
BY_NAME: dict[str, Entry] = {e.name: e for e in REGISTRY}
NAMES: tuple[str, ...] = tuple(BY_NAME)
IPSEC_NAMES: tuple[str, ...] = tuple(e.name for e in REGISTRY if e.ipsec)


def described(names: tuple[str, ...] = NAMES) -> str:
    """`name` (what it is), … — for --help."""
    return "; ".join(f"{n}: {BY_NAME[n].what}" for n in names)


def make(name: str, stage_timing: bool = False, hosts: Any = None) -> Backend:
    """The backend `name`; `stage_timing` switches on ours' per-stage counters (the
    others have none: the lab then records no per-stage split for them). `hosts`: the
    real hosts (a `hosts.Hosts`) it will run on — its checks then probe them, not this
    machine."""
    e = BY_NAME.get(name)
    if e is None:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(NAMES)})")
    cls = getattr(importlib.import_module(f"ipsec_lab.backends.{e.module}"), e.cls)
    kwargs = dict(e.kwargs)
    if e.stage_timing:
        kwargs["stage_timing"] = stage_timing
    backend: Backend = cls(**kwargs)
    if hosts is not None and hasattr(backend, "use_hosts"):
        backend.use_hosts(hosts)
    return backend


def markdown() -> str:
    """The backend table of docs/backends.md (`python -m ipsec_lab.backends` prints it)."""
    lines = ["| backend | what it is | module |", "|---|---|---|"]
    for e in REGISTRY:
        lines.append(f"| `{e.name}` | {e.what} | `backends/{e.module}.py` |")
    return "\n".join(lines) + "\n"
