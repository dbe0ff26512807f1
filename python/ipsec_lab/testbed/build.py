"""Building a topology for real: network namespaces, veth pairs, addresses, routes, tc
shaping, and the processes started in them — all torn down on exit, also on failure.

Every namespace is named `ipl-<token>-<node>` and every cgroup `ipsec-lab-<token>`, so
`ipsec-lab clean` can recognise (and only touch) what a crashed run left. Configuration
goes through iproute2's `ip` (its -n: one program, not `ip netns exec` and ip) and `tc`,
each logged to the run directory's `commands.log`: a user can replay it by hand.
"""

from __future__ import annotations

import functools
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from ipsec_lab.testbed import Link, Topology, interface, netns
from ipsec_lab.testbed.links import shape_ends
from ipsec_lab.testbed.placement import Placement, steer

NS_PREFIX = "ipl-"
CGROUP_PREFIX = "ipsec-lab-"


class LabError(RuntimeError):
    """Something the lab needs failed; the message says what and shows the output."""


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, veth, tc): run it as root")


# Which Debian package gives each program the lab runs (for "missing tool" errors).
PACKAGES = {
    "ip": "iproute2", "tc": "iproute2", "ethtool": "ethtool", "iperf3": "iperf3", "nft": "nftables",
    "nginx": "nginx-light", "curl": "curl", "swanctl": "strongswan-swanctl",
    "/usr/lib/ipsec/charon": "strongswan-charon", "unshare": "util-linux", "tshark": "tshark",
    "taskset": "util-linux", "wireguard-go": "wireguard-go", "wg": "wireguard-tools",
}  # fmt: skip


def require_tools(*tools: str) -> None:
    for t in tools:
        if not (shutil.which(t) if "/" not in t else os.access(t, os.X_OK)):
            pkg = PACKAGES.get(t, "?")
            raise LabError(f"{t} is not installed (Debian package: {pkg}; `make deps` installs it)")


class CpuLimit:
    """A cgroup with a CPU quota (v2 `cpu.max`, or v1 `cpu.cfs_quota_us`): how a fast
    machine emulates a slow gateway. Processes join it before they exec."""

    def __init__(self, token: str, cpus_worth: float) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        # The shortest period that still gives the kernel's minimum quota (1 ms): a
        # throttled process then sleeps milliseconds, not tens of them, and a queue in
        # front of it does not overflow for want of it being scheduled (a 10 % quota
        # runs 1 ms in every 10 rather than 10 ms in every 100; 20 %, 1 ms in every 5).
        period = min(100_000, max(1_000, int(1000 / cpus_worth)))
        quota = max(1000, int(cpus_worth * period))
        if v2.exists():
            self.path = Path("/sys/fs/cgroup") / f"{CGROUP_PREFIX}{token}"
            parent = Path("/sys/fs/cgroup/cgroup.subtree_control")
            if "cpu" not in parent.read_text().split():
                parent.write_text("+cpu")
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.max").write_text(f"{quota} {period}")
        else:
            root = Path("/sys/fs/cgroup/cpu")
            if not root.is_dir():
                raise LabError("no cgroup CPU controller found under /sys/fs/cgroup")
            self.path = root / f"{CGROUP_PREFIX}{token}"
            self.path.mkdir(exist_ok=True)
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        self.procs = self.path / "cgroup.procs"

    def join_self(self) -> None:
        """For `preexec_fn`: the child puts itself in the cgroup before it execs."""
        with open(self.procs, "w") as f:
            f.write("0")

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)  # processes still leaving


def of_namespaces(tb: interface.Testbed, what: str) -> Testbed:
    """`tb` as the namespace testbed it is, for what only this machine has (`what`)."""
    if not isinstance(tb, Testbed):
        raise LabError(f"{what} needs a testbed of this machine's namespaces")
    return tb


class Testbed:
    """A topology built in namespaces. Use as a context manager:

    with Testbed(topology, rundir) as tb:
        tb.shape(link)
        tb.spawn("server", ["iperf3", "-s"], "iperf3-server")
        tb.run("client", ["iperf3", "-c", ...])
    """

    __test__ = False  # not a pytest test class, whatever its name
    remote = False  # namespaces of this machine (testbed.interface.Testbed)

    def __init__(
        self,
        topo: Topology,
        rundir: Path,
        cpu_quota: float | None = None,
        cpus: Sequence[int] = (),
        token: str | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.topo = topo
        # Absolute, always: programs started in the namespaces get paths under it, and
        # each resolves a relative one against something else (nginx: its prefix).
        self.rundir = rundir.resolve()
        self.token = token or secrets.token_hex(3)
        self.cpu_quota = cpu_quota
        # The IPsec's CPUs (its `limited` programs run there) and the traffic's (every
        # other program): the scenario's `[gateway] cpus`, or the campaign's placement.
        self.placement = placement or Placement("off", why="not placed")
        placed = self.placement.placed
        self.cpus = tuple(cpus) or (self.placement.dut if placed else ())
        self.traffic_cpus = self.placement.traffic if placed else ()
        self.cgroup: CpuLimit | None = None
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.made: list[str] = []
        self._log = self.rundir / "commands.log"
        self._sockets: Path | None = None
        self._cleanups: list[Callable[[], None]] = []

    def on_teardown(self, fn: Callable[[], None]) -> None:
        """Call `fn` first thing at teardown (for helpers started beside the testbed)."""
        self._cleanups.append(fn)

    @property
    def sockets(self) -> Path:
        """A short private directory for Unix sockets (a socket path must fit in 108
        bytes; run directories can be deeper). Removed at teardown."""
        if self._sockets is None:
            import tempfile

            self._sockets = Path(tempfile.mkdtemp(prefix=f"{NS_PREFIX}{self.token}-"))
        return self._sockets

    def log_mark(self) -> float:
        """A point in time for `logs_since`."""
        return time.time()

    def logs_since(self, mark: float, lines: int = 15, most: int = 4) -> list[tuple[str, str]]:
        """The tails of the program logs under the run directory written to since `mark`
        (the programs' own: `NAME.log` of each spawned one, nginx's error log, charon's
        log…), newest first: what a failed run's reason shows."""
        found = []
        for f in self.rundir.rglob("*.log"):
            try:
                st = f.stat()
            except OSError:
                continue
            if f.name != "commands.log" and st.st_size and st.st_mtime >= mark - 0.5:
                found.append((st.st_mtime, f))
        found.sort(reverse=True)
        out = []
        for _, f in found[:most]:
            text = tail(f, lines)
            if text.strip():
                out.append((str(f.relative_to(self.rundir)), text))
        return out

    def ns(self, node: str) -> str:
        return f"{NS_PREFIX}{self.token}-{node}"

    # --- commands -----------------------------------------------------------------

    def _note(self, line: str) -> None:
        """A line in the testbed's command log (what was done, in the order done)."""
        with open(self._log, "a") as log:
            log.write(line + "\n")

    def _cmd(
        self,
        argv: Sequence[str],
        timeout: float = 30,
        check: bool = True,
        limited: bool = False,
        cpus: Sequence[int] = (),
    ) -> str:
        """Run `argv` here to completion; its stdout. `cpus`: on those CPUs, started from
        a thread of its own moved there first (affinity is a thread's, and a child
        inherits its parent thread's): `taskset`'s effect with one program fewer, and
        without a preexec_fn, which would fork the whole lab instead of vfork."""
        placed = taskset(cpus)
        self._note(shlex.join([*placed, *argv]))  # the equivalent command, as typed
        pre = self.cgroup.join_self if (limited and self.cgroup) else None
        made: list[subprocess.Popen[str]] = []
        gave_up = threading.Event()
        lock = threading.Lock()

        def start() -> subprocess.Popen[str]:
            if cpus:
                os.sched_setaffinity(0, cpus)  # 0: this thread
            pipe = subprocess.PIPE
            p = subprocess.Popen(list(argv), stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL,
                                 text=True, preexec_fn=pre)  # fmt: skip
            with lock:  # a child started after the caller gave up is ended here
                made.append(p)
                if gave_up.is_set():
                    p.kill()
                    p.wait()
            return p

        try:
            p = netns.on_thread(start, "placed") if cpus else start()
        except BaseException as e:
            with lock:
                gave_up.set()
                for q in made:
                    q.kill()
            if isinstance(e, (OSError, subprocess.SubprocessError, ValueError)):
                # the CPUs or the cgroup refused it, or there is no such program
                where = f" on CPUs {placed[-1]}" if cpus else ""
                raise LabError(f"cannot run {shlex.join(argv)}{where}: {e}") from None
            raise
        with p:  # as subprocess.run: waited for here, killed on a timeout or an interrupt
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()  # not communicate: a grandchild may hold the pipes open
                raise LabError(f"timed out after {timeout:g} s: {shlex.join(argv)}") from None
            except BaseException:
                p.kill()
                raise
        if check and p.returncode != 0:
            raise LabError(f"failed ({p.returncode}): {shlex.join(argv)}\n{err.strip()}")
        return out

    def in_ns(self, node: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def run(
        self,
        node: str,
        argv: Sequence[str],
        timeout: float = 60,
        check: bool = True,
        limited: bool = False,
        ipsec: bool = False,
    ) -> str:
        """Run a program in a node to completion (bounded by `timeout`); its stdout.
        `limited`: under the CPU quota (study 4's slow client runs its programs so);
        `ipsec`: a program of the IPsec under test (on its CPUs, see `_placed`)."""
        ip = ["ip", "-n", self.ns(node), *argv[1:]] if argv and argv[0] == "ip" else None
        return self._cmd(ip or self.in_ns(node, argv), timeout=timeout, check=check,
                         limited=limited, cpus=self._cpus(ipsec))  # fmt: skip

    def _cpus(self, ipsec: bool) -> Sequence[int]:
        """A role's CPUs (none: unplaced): the IPsec's programs on the IPsec's (`[gateway]
        cpus` or the placement's), any other (traffic, probes, the lab's own commands)
        on the traffic's."""
        return (self.cpus if ipsec else self.traffic_cpus) or ()

    def _placed(self, argv: Sequence[str], ipsec: bool) -> list[str]:
        """`argv` on its role's CPUs (`_cpus`), through `taskset`."""
        return [*taskset(self._cpus(ipsec)), *argv]

    def spawn(
        self,
        node: str,
        argv: Sequence[str],
        name: str,
        env: dict[str, str] | None = None,
        limited: bool = False,
        ipsec: bool = False,
    ) -> subprocess.Popen[bytes]:
        """Start a long-running program in a node; it is stopped (by PID) at teardown.
        `limited`: it runs under the gateway CPU quota of the scenario; `ipsec`: it is
        the IPsec's (pinned to its CPUs)."""
        full = self.in_ns(node, self._placed(argv, ipsec))
        with open(self._log, "a") as log:
            log.write(f"[{name}] " + " ".join(full) + "\n")
        out = open(self.rundir / f"{name}.log", "wb")
        pre = self.cgroup.join_self if (limited and self.cgroup) else None
        p = subprocess.Popen(
            full,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=pre,
        )
        out.close()
        self.procs.append((name, p))
        return p

    def stop(self, p: subprocess.Popen[bytes], grace: float = 3.0) -> None:
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)

    # --- building -------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        try:
            self.build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.teardown()

    def build(self) -> None:
        require_root()
        require_tools("ip", "tc")
        self.rundir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.rundir.chmod(0o700)  # keys, configs and captures of this run: root's only
        if self.cpu_quota:
            self.cgroup = CpuLimit(self.token, self.cpu_quota)
        t = self.topo
        for node in t.nodes:
            self._cmd(["ip", "netns", "add", self.ns(node)])
            self.made.append(node)
            self.run(node, ["ip", "link", "set", "lo", "up"])
        for w in t.wires:
            self._cmd(
                ["ip", "link", "add", w.a_if, "netns", self.ns(w.a), "type", "veth",
                 "peer", "name", w.b_if, "netns", self.ns(w.b)]
            )  # fmt: skip
            for node, ifname, addr in ((w.a, w.a_if, w.a_addr), (w.b, w.b_if, w.b_addr)):
                # IPv6: usable at once (`nodad`: the addresses are ours alone, and an
                # address still in duplicate detection refuses to be bound or routed from)
                nodad = ["nodad"] if ":" in addr else []
                self.run(node, ["ip", "addr", "add", addr, "dev", ifname, *nodad])
                self.run(node, ["ip", "link", "set", ifname, "mtu", str(w.mtu), "up"])
        if self.placement.placed:
            require_tools("taskset")
            steer(self, self.topo, self.placement)
        for node, dest, via in t.routes:
            family = ["-6"] if ":" in via else []  # `default` alone does not say which
            self.run(node, ["ip", *family, "route", "add", dest, "via", via])
        for node in t.forwarding:
            self.sysctl(node, "net.ipv4.ip_forward", "1")
            if any(":" in w.a_addr for w in t.wires):
                self.sysctl(node, "net.ipv6.conf.all.forwarding", "1")

    def shape(self, link: Link) -> None:
        """Put the link profile on both ends of every shaped wire (egress): netem for
        delay/jitter/loss/reorder/duplication, tbf below it for the rate.

        A link with a rate also loses veth's segmentation offloads (TSO, GSO, UDP GSO — which
        `ours-udp` uses for ESP in UDP — and GRO): a real link carries frames of at most
        its MTU, and the wire counters then count those frames and their headers — not
        64 KB super-packets with one set of headers, which would hide most of a transfer's
        packets and header bytes (study 4's transactions and network load, study 1's
        output traffic). Unshaped links keep them (speed)."""
        if link.rate_mbit:
            require_tools("ethtool")
        shape_ends(self, link, self.topo.shaped_ends())

    def driven(self, node: str) -> bool:
        return True  # every node here is the lab's (on hosts, an external DUT is not)

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        """The local argv that runs `argv` (a traffic program) in `node`."""
        return self.in_ns(node, self._placed(argv, False))

    def sysctl(self, node: str, key: str, value: str) -> None:
        """Set a sysctl in `node` (the namespace goes with the testbed): written from a
        thread in its namespace (`netns`), as `sysctl -w` would, no program started."""
        self._note(shlex.join(self.in_ns(node, ["sysctl", "-qw", f"{key}={value}"])))
        try:
            netns.within(self.ns(node), lambda: netns.write_sysctl(key, value))
        except (OSError, ValueError) as e:
            raise LabError(f"sysctl {key}={value} in {node}: {e}") from None

    # Files and programs a workload uses in a node: here this machine's; on real hosts
    # (`hosts.testbed.HostsTestbed`, the same methods) the node's own.

    def file_for(self, node: str, rel: str, data: bytes, mode: int = 0o644) -> str:
        """`data` as a file programs in `node` can read (`rel` under the run's
        directory); its path there. Every node shares this machine's files."""
        f = self.rundir / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        f.chmod(mode)
        return str(f)

    def read_back(self, node: str, path: str) -> bytes | None:
        """A file a program in `node` wrote (None when there is none)."""
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return None

    def python(self, node: str) -> str:
        """The Python that runs the lab's small helpers in `node`: the lab's own."""
        return sys.executable

    def needs(self, *tools: str) -> None:
        """Fail now, naming the Debian package, when a tool a workload runs is missing."""
        require_tools(*tools)

    def host_cpu(self) -> dict[str, tuple[float, float, int]]:
        """Per-host CPU: none here — every node shares this machine, whose CPU the
        meters measure as a whole."""
        return {}

    def counters(self) -> dict[str, dict[str, int]]:
        """Interface counters of every wire end, `node/ifname` -> rx/tx bytes/packets."""
        out: dict[str, dict[str, int]] = {}
        ends = {(w.a, w.a_if) for w in self.topo.wires} | {(w.b, w.b_if) for w in self.topo.wires}
        # each node's /proc/thread-self/net/dev, read from a thread in its namespace
        # (`netns`): the counters `ip -s link` shows, no program started
        by_node: dict[str, list[str]] = {}
        for node, ifname in sorted(ends):
            by_node.setdefault(node, []).append(ifname)
        for node, ifnames in by_node.items():
            try:
                devs = netns.within(self.ns(node), netns.net_dev)
            except OSError as e:  # TimeoutError is one
                raise LabError(f"{node}'s interface counters: {e}") from None
            for ifname in ifnames:
                if ifname not in devs:
                    raise LabError(f"{node} has no interface {ifname} (counters)")
                out[f"{node}/{ifname}"] = devs[ifname]
        return out

    def teardown(self) -> None:
        while self._cleanups:
            self._cleanups.pop()()
        for _, p in reversed(self.procs):
            self.stop(p)
        self.procs.clear()
        for node in self.made:
            kill_namespace(self.ns(node))
        self.made.clear()
        if self.cgroup:
            self.cgroup.remove()
            self.cgroup = None
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None


def taskset(cpus: Sequence[int]) -> list[str]:
    """The `taskset` words that put a program on `cpus` (none when there are none)."""
    return ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []


def kill_namespace(ns: str) -> None:
    """Kill what still runs in one of our namespaces (by PID) and delete it."""
    p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
    for pid in p.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def probe(name: str, setup: Sequence[Sequence[str]], test: Sequence[str]) -> tuple[bool, str]:
    """Whether the kernel can do something: in a scratch namespace of ours, run the
    `setup` commands (`{ns}` stands for its name), then `test` inside it; (succeeded,
    what it said on stderr). The namespace goes, whatever happens."""
    ns = f"{NS_PREFIX}{secrets.token_hex(3)}-{name}"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        for argv in setup:
            subprocess.run([a.format(ns=ns) for a in argv], check=True, capture_output=True)
        p = subprocess.run(
            ["ip", "netns", "exec", ns, *test], capture_output=True, text=True, check=False
        )
        return p.returncode == 0, p.stderr.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        return False, str(e)
    finally:
        kill_namespace(ns)


@functools.cache
def netem_available() -> tuple[bool, str]:
    """Whether this kernel has netem (sch_netem), probed once on a veth pair; with the
    kernel's answer when it has not."""
    return probe(
        "netemprobe",
        [["ip", "-n", "{ns}", "link", "add", "p0", "type", "veth", "peer", "name", "p1"]],
        ["tc", "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"],
    )


def leftovers() -> tuple[list[str], list[Path]]:
    """Namespaces and cgroups a lab run made and did not remove."""
    p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    names = [line.split()[0] for line in p.stdout.splitlines() if line.startswith(NS_PREFIX)]
    groups = [
        g
        for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu"))
        if base.is_dir()
        for g in base.glob(f"{CGROUP_PREFIX}*")
    ]
    return names, groups


def clean() -> list[str]:
    """Remove every leftover of a crashed run; returns what was removed."""
    names, groups = leftovers()
    for ns in names:
        kill_namespace(ns)
    done = [f"namespace {n}" for n in names]
    for g in groups:
        procs = g / "cgroup.procs"
        for pid in procs.read_text().split() if procs.exists() else []:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        for _ in range(30):
            try:
                g.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        done.append(f"cgroup {g}")
    return done


if TYPE_CHECKING:  # mypy holds this testbed to the interface every testbed keeps
    _KEEPS: type[interface.Testbed] = Testbed
