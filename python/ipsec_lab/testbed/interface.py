"""What every testbed offers the backends, the traffic and the runner — namespaces of this
machine (`testbed.build.Testbed`) and real hosts over ssh (`hosts.testbed.HostsTestbed`)
alike — declared once, so mypy checks that both keep it. What only a testbed of real
hosts offers besides (files put on a host, programs pushed there, undo records in its
ledger) is `OnHosts`; `on_hosts(tb)` tells them apart and narrows the type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

# How long a program the lab started may take to say it is ready (its socket, its log
# line, its PID file). Long: a program that exits is seen at once, so the limit only
# decides how long a hang goes unseen — while a loaded machine starts a program slowly
# (Python in a TCG-emulated guest beside another lane of tests took over 10 s, and a
# CI run failed on an interop case that had nothing wrong with it).
READY_S = 60.0

if TYPE_CHECKING:
    from ipsec_lab.testbed import Link, Topology

# UDP socket buffers (`iperf3 -w`, which the server applies to its receiving socket too).
# The traffic programs are the instrument, not what is measured: the kernel's default
# 212992 B holds ~90 datagrams of 1000 B, 15 ms at 50 Mbit/s, so a sink scheduled late on a
# shared machine dropped datagrams the gateways had delivered (iperf3 loss with the sink's
# UdpRcvbufErrors rising and no drop anywhere else), and a loss-free-rate search read that
# as the gateway's limit. 4 MiB waits out ~0.5 s at that rate. The kernel caps it at
# net.core.rmem_max / wmem_max (4 MiB on this machine; 212992 on a stock kernel): each
# testbed (and the micro-VM) raises the cap to at least this where the traffic ends.
UDP_SOCKET_BUFFER_BYTES = 4 << 20


class Process(Protocol):
    """A program a testbed started (`spawn`)."""

    pid: int  # on the node it runs on

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    @property
    def returncode(self) -> int | Any: ...


class Testbed(Protocol):
    """A built topology the lab drives: every node reachable by name."""

    topo: Topology  # as placed (real hosts: their interfaces and addresses)
    rundir: Path  # this machine's directory for its logs and files
    remote: bool  # real hosts (`OnHosts`), not namespaces of this machine
    token: str  # this testbed's own, in the names it gives what it makes

    def run(self, node: str, argv: Sequence[str], timeout: float = 60, check: bool = True,
            limited: bool = False, ipsec: bool = False) -> str:  # fmt: skip
        """Run `argv` on `node` to its end; its stdout (a failure raises LabError)."""

    def spawn(self, node: str, argv: Sequence[str], name: str, env: dict[str, str] | None = None,
              limited: bool = False, ipsec: bool = False) -> Process:  # fmt: skip
        """Start `argv` on `node` in the background, its output in the log `name`."""

    def stop(self, p: Any, grace: float = 3.0) -> None:
        """Stop a program `spawn` started (TERM, then KILL after `grace`)."""

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        """`argv` as this machine runs it on `node` (for a program that starts others)."""

    def driven(self, node: str) -> bool:
        """Whether the lab drives `node` (an external DUT's hosts it does not)."""

    def sysctl(self, node: str, key: str, value: str) -> None: ...

    def file_for(self, node: str, rel: str, data: bytes, mode: int = 0o644) -> str:
        """`data` as a file where `node` can read it; its path there."""

    def read_back(self, node: str, path: str) -> bytes | None:
        """The file `path` on `node`, here (None: it is not there)."""

    def python(self, node: str) -> str:
        """The Python interpreter to run the lab's helper scripts with on `node`."""

    def needs(self, *tools: str) -> None:
        """Raise LabError naming any of `tools` the nodes lack."""

    def shape(self, link: Link) -> None: ...

    def counters(self) -> dict[str, dict[str, int]]:
        """Per `node/interface`, its byte and packet counters now."""

    def host_cpu(self) -> dict[str, tuple[float, float, int]]: ...

    def log_mark(self) -> float: ...

    def logs_since(self, mark: float, lines: int = 15, most: int = 4) -> list[tuple[str, str]]:
        """The tails of the program logs that changed since `mark` (for a failure)."""

    def on_teardown(self, fn: Callable[[], None]) -> None: ...


class OnHosts(Testbed, Protocol):
    """A testbed of real hosts: what backends need there besides."""

    def ipsec_gw(self, node: str) -> str | None:
        """The host's own ipsec-gw binary (the hosts file's `ipsec_gw`), if it names one."""

    def cpu_ns(self, node: str, pid: int) -> int:
        """Nanoseconds process `pid` on `node` has run."""

    def workdir(self, node: str) -> str:
        """This run's directory on `node` (the lab's work directory there)."""

    def put(self, node: str, rel: str, text: str, mode: int = 0o600) -> str:
        """`text` as a private file in the lab's work directory on `node`; its path."""

    def program(self, node: str, local: Path, name: str, preset: str | None = None) -> str:
        """This machine's program pushed to `node` (or the host's own `preset`); its path."""

    def owned_dir(self, node: str, rel: str, user: str) -> str: ...

    def record(self, node: str, what: str, undo: str) -> None:
        """Note in `node`'s ledger how to undo `what` (run at teardown, or by `clean`)."""

    def wait_socket(self, node: str, path: str, probe: list[str], proc: Any,
                    timeout: float) -> bool: ...  # fmt: skip

    def log_tail(self, node: str, name: str, lines: int = 15) -> str: ...

    def host_procs(self, pids: dict[str, list[int]]) -> dict[str, tuple[float, int]]:
        """Per node, (CPU s, resident bytes) of its processes `pids`."""


def on_hosts(tb: Testbed) -> TypeGuard[OnHosts]:
    """Whether `tb` is a testbed of real hosts (and so offers `OnHosts`)."""
    return tb.remote
