"""A topology on real hosts: the same interface as the namespace testbed
(`testbed.build.Testbed`: run, spawn, stop, shape, counters, teardown), over OpenSSH.

Safety on machines the lab does not own:
- it configures only the interfaces the hosts file names, and refuses to start when one
  of them carries the host's SSH session;
- everything it adds (addresses, routes, qdiscs, offload settings, sysctl values with
  the value before, processes, files) is written to a ledger **before** it is done: in
  the local run directory (`hosts/NODE.ledger`) and on the host
  (`WORKDIR/<token>-<node>/ledger`, one undo command a line, every value in it quoted);
  teardown undoes the local copy newest first (what the lab wrote itself, never what the
  host's file says), also after a failure or Ctrl-C, and `ipsec-lab clean --hosts FILE`
  undoes what a killed run left from the host's copy;
- it runs, as root on a host, only what it wrote itself into a directory no one but
  root (or the login user) can write, checked up to `/` at the start and again with
  every command that uses it (`hosts.workdir`); each node has its own run directory;
- nothing a host says names a path here (log names: `hosts.ledger`);
- it never touches a host's default route: the namespace testbed's default routes
  become routes to the topology's other networks (`hosts.place`).
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ipsec_lab.hosts import Hosts, place, readings
from ipsec_lab.hosts.ledger import LOG_NAME, fetch_logs, read_ledger
from ipsec_lab.hosts.readings import proc_cpu, proc_cpu_line, proc_stat, ssh_interface
from ipsec_lab.hosts.ssh import Ssh, SshError, each, same_process
from ipsec_lab.hosts.workdir import LEDGER, Guard, UnsafeError, guard
from ipsec_lab.testbed import Link, Topology
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import READY_S, UDP_SOCKET_BUFFER_BYTES, OnHosts
from ipsec_lab.testbed.links import STOCK_QDISCS, link_counters, link_mtu, root_qdisc, shape_ends


class HostProcess:
    """A program the lab started on a host: the local ssh session that runs it (its
    `poll()`, `wait()`, `returncode` are the program's) and its PID there."""

    def __init__(self, node: str, name: str, session: subprocess.Popen[bytes],
                 pid: int, start: str) -> None:  # fmt: skip
        self.node, self.name, self.session = node, name, session
        self.pid, self.start = pid, start

    def poll(self) -> int | None:
        return self.session.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.session.wait(timeout)

    @property
    def returncode(self) -> int | None:
        return self.session.returncode


class HostsTestbed:
    """A topology placed on the hosts of a hosts file. Use as a context manager."""

    remote = True  # real hosts (testbed.interface.OnHosts)

    __test__ = False

    def __init__(self, topo: Topology, hosts: Hosts, rundir: Path, token: str | None = None,
                 external: bool = False) -> None:  # fmt: skip
        hosts.for_topology(topo, backend_external=external)
        self.hosts = hosts
        self.topo = place(topo, hosts)
        self.rundir = rundir.resolve()
        self.token = token or secrets.token_hex(3)
        self.ssh: dict[str, Ssh] = {
            h.node: Ssh(h.ssh, h.node, hosts.ssh_config) for h in hosts.driven()
            if h.node in topo.nodes and h.ssh is not None
        }  # fmt: skip
        self.procs: list[tuple[str, HostProcess]] = []
        self._spawned = 0
        self._pushed: set[tuple[str, str]] = set()
        self._connected: set[str] = set()  # hosts reached: only these can hold anything
        self._made: set[str] = set()  # hosts where this run's directory was made
        self._cleanups: list[Callable[[], None]] = []
        self._ledger_lock = threading.Lock()
        self._log = self.rundir / "commands.log"
        self.cpu_quota = None
        self.cpus: tuple[int, ...] = ()
        self.described: dict[str, Any] = {}  # each host's kernel, CPUs and NICs (build)

    # --- where things are -----------------------------------------------------------------

    def driven(self, node: str) -> bool:
        return node in self.ssh

    def workdir(self, node: str) -> str:
        """The directory of this run on `node` (under the hosts file's `workdir`): the
        node's own, also where several nodes share one machine or work directory."""
        return f"{self.hosts.hosts[node].workdir}/{self._name(node)}"

    def _name(self, node: str) -> str:
        return f"{self.token}-{node}"

    def _guard(self, node: str, op: str = "use") -> Guard:
        """The check of `node`'s work directory and this run's directory in it, put in
        front of every command that uses them."""
        return guard(self._host(node).uid, self.hosts.hosts[node].workdir, op, self._name(node))

    def _guard_for(self, node: str, argv: Sequence[str]) -> Guard | None:
        """The check, if `argv` names this run's directory on `node` (a program pushed
        there, a file in it)."""
        wd = self.workdir(node)
        return self._guard(node) if any(wd in a for a in argv) else None

    def on_teardown(self, fn: Callable[[], None]) -> None:
        self._cleanups.append(fn)

    def _host(self, node: str) -> Ssh:
        try:
            return self.ssh[node]
        except KeyError:
            raise LabError(f"{node} is not driven by the lab (no `ssh` in "
                           f"{self.hosts.source})") from None  # fmt: skip

    def _note(self, node: str, line: str) -> None:
        with open(self._log, "a") as log:
            log.write(f"[{node}] {line}\n")

    # --- the ledger -----------------------------------------------------------------------

    def record(self, node: str, what: str, undo: str) -> None:
        """Write down, on the host and here, how to undo what is about to be done."""
        entry = json.dumps({"what": what, "undo": undo}) + "\n"
        with self._ledger_lock:
            local = self.rundir / "hosts" / f"{node}.ledger"
            local.parent.mkdir(parents=True, exist_ok=True)
            with open(local, "a") as f:
                f.write(entry)
        self._host(node).append(entry, f"{self.workdir(node)}/{LEDGER}", self._guard(node))

    # --- commands -------------------------------------------------------------------------

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        """The local argv that runs `argv` on `node`."""
        return self._host(node).remote(list(argv))

    def run(self, node: str, argv: Sequence[str], timeout: float = 60, check: bool = True,
            limited: bool = False, ipsec: bool = False) -> str:  # fmt: skip
        self._note(node, shlex.join(argv))
        # an SshError is a LabError: it names the host, and the runner stores it so
        return self._host(node).run(list(argv), timeout=timeout, check=check,
                                    guard=self._guard_for(node, argv)).stdout  # fmt: skip

    def spawn(self, node: str, argv: Sequence[str], name: str,
              env: dict[str, str] | None = None, limited: bool = False,
              ipsec: bool = False) -> HostProcess:  # fmt: skip
        """Start a long-running program on `node`; stopped (by PID) at teardown."""
        h = self._host(node)
        wd = self.workdir(node)
        # a fresh pidfile per start: a program started again under the same name must
        # never be taken for the one before it (whose PID the old file holds)
        self._spawned += 1
        log, pidfile = f"{wd}/{name}.log", f"{wd}/{name}.{self._spawned}.pid"
        if env:
            argv = ["env", *[f"{k}={v}" for k, v in env.items()], *argv]
        self._note(node, f"[{name}] " + shlex.join(argv))
        g = self._guard(node)
        session = h.spawn(list(argv), log, pidfile, guard=g)
        deadline = time.monotonic() + READY_S
        while True:
            r = h.run(["cat", pidfile], check=False, timeout=10)
            said = r.stdout.split()
            if r.returncode == 0 and len(said) == 2 and all(x.isdigit() for x in said):
                break
            if session.poll() is not None or time.monotonic() > deadline:
                err = session.stderr.read().decode(errors="replace") if session.stderr else ""
                h.refused(session.returncode, err, g)
                raise LabError(f"{node}: {name} did not start: {err.strip()[-300:]}")
            time.sleep(0.05)
        pid, start = int(said[0]), said[1]
        self.record(node, f"process {name} (pid {pid})", _kill_line(pid, start))
        p = HostProcess(node, name, session, pid, start)
        self.procs.append((name, p))
        return p

    def stop(self, p: Any, grace: float = 3.0) -> None:
        if not isinstance(p, HostProcess) or p.poll() is not None:
            return
        h = self.ssh[p.node]
        try:
            h.kill(p.pid, p.start)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                h.kill(p.pid, p.start, 9)
                p.wait(5)
        except (SshError, subprocess.TimeoutExpired):
            p.session.kill()  # the host is gone: its ledger holds the process for `clean`
            p.session.wait(5)

    def sysctl(self, node: str, key: str, value: str, at_least: bool = False) -> None:
        """Set a sysctl on `node`, the value before recorded to be restored (`at_least`:
        a number only raised, never lowered)."""
        before = self.run(node, ["sysctl", "-n", key], check=at_least is False).strip()
        if at_least and not before.isdigit():
            return  # not this host's to set (a namespace sees no net.core.rmem_max)
        if at_least and int(before) >= int(value):
            return
        if before != value:
            self.record(node, f"sysctl {key} (was {before})",
                        shlex.join(["sysctl", "-qw", f"{key}={before}"]))  # fmt: skip
            self.run(node, ["sysctl", "-qw", f"{key}={value}"])

    # --- files and programs a backend puts on a host ---------------------------------------

    def put(self, node: str, rel: str, text: str, mode: int = 0o600) -> str:
        """Write `text` (it may hold keys: 0600 from the first byte) to `rel` under this
        run's directory on `node`; the path there."""
        path = f"{self.workdir(node)}/{rel}"
        self._host(node).push(text.encode(), path, mode, guard=self._guard(node))
        return path

    def file_for(self, node: str, rel: str, data: bytes, mode: int = 0o644) -> str:
        """`data` pushed to `rel` under this run's directory on `node`; its path there."""
        path = f"{self.workdir(node)}/{rel}"
        self._host(node).push(data, path, mode, guard=self._guard(node))
        return path

    def read_back(self, node: str, path: str) -> bytes | None:
        """A file a program on `node` wrote, fetched (None when there is none)."""
        g = self._guard_for(node, [path])
        if self._host(node).run(["test", "-f", path], check=False, timeout=15,
                                guard=g).returncode:  # fmt: skip
            return None
        return self._host(node).fetch(path, guard=g)

    def python(self, node: str) -> str:
        """The host's own Python 3 (`hosts check` looks for it where a workload needs it).
        Callers run it with `-I`: as root, from a login's directory, it must import
        nothing from that directory or the login's environment."""
        return "python3"

    def needs(self, *tools: str) -> None:
        """Nothing here: `hosts check` reports each host's tools, and a missing one
        fails the run with the host's own error."""

    def program(self, node: str, local: Path, name: str, preset: str | None = None) -> str:
        """A program on `node`: `preset` (one the hosts file names) if given, else
        `local` pushed into this run's directory once — after checking the host's
        architecture is this machine's."""
        if preset:
            return preset
        path = f"{self.workdir(node)}/bin/{name}"
        if (node, path) in self._pushed:
            return path
        import platform

        arch = self.run(node, ["uname", "-m"]).strip()
        if arch != platform.machine():
            raise LabError(f"{node} is {arch}, this machine's {name} build is "
                           f"{platform.machine()}: name one built for it in the hosts file "
                           f"(`{name.replace('-', '_')} = \"/path\"`)")  # fmt: skip
        self._host(node).push(local.read_bytes(), path, 0o755, guard=self._guard(node))
        self._pushed.add((node, path))
        return path

    def owned_dir(self, node: str, rel: str, user: str) -> str:
        """A directory of this run on `node` owned by `user` (group root, 0770)."""
        path = f"{self.workdir(node)}/{rel}"
        self.run(node, ["install", "-d", "-m", "0770", "-o", user, "-g", "root", path])
        self.run(node, ["chmod", "0711", self.workdir(node)])  # passable, not listable
        return path

    def wait_socket(self, node: str, path: str, probe: list[str], proc: Any,
                    timeout: float) -> bool:  # fmt: skip
        """Until `probe`, the daemon's client over its socket `path` (there from bind(), before
        listen()), exits 0 on `node`; False if `proc` exits or `timeout` passes."""
        line = f"test -S {shlex.quote(path)} && {shlex.join(probe)}"
        deadline = time.monotonic() + timeout
        while self._host(node).run(["sh", "-c", line], check=False, timeout=15).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def log_tail(self, node: str, name: str, lines: int = 15) -> str:
        log = f"{self.workdir(node)}/{name}.log"
        return self.run(node, ["tail", "-n", str(lines), log], check=False)

    def ipsec_gw(self, node: str) -> str | None:
        return self.hosts.hosts[node].ipsec_gw

    def cpu_ns(self, node: str, pid: int) -> int:
        """Nanoseconds process `pid` on `node` has run (its /proc/PID/schedstat)."""
        r = self._host(node).run(["cat", f"/proc/{pid}/schedstat"], check=False, timeout=15)
        return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.split() else 0

    def log_mark(self) -> float:
        return time.time()

    def logs_since(self, mark: float, lines: int = 15, most: int = 4) -> list[tuple[str, str]]:
        """The tails of the programs' logs on the hosts written to since `mark`."""
        out: list[tuple[str, str]] = []
        for node, h in self.ssh.items():
            if node not in self._made:
                continue
            wd = shlex.quote(self.workdir(node))
            line = (f"cd {wd} && for f in $(find . -maxdepth 1 -name '*.log' -newermt "
                    f"@{int(mark) - 1} -size +0 | head -{int(most)}); do echo \"== $f\"; "
                    f"tail -n {int(lines)} \"$f\"; done")  # fmt: skip
            try:
                text = h.run(line, check=False, timeout=20, guard=self._guard(node)).stdout
            except (SshError, UnsafeError):
                continue
            for part in text.split("== ./")[1:]:
                name, _, body = part.partition("\n")
                if LOG_NAME.match(name) and body.strip():
                    out.append((f"{node}:{name}", body.rstrip()))
        return out[:most]

    # --- building -------------------------------------------------------------------------

    def __enter__(self) -> HostsTestbed:
        try:
            self.build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.teardown()

    def connect(self) -> None:
        """Reach every driven host (in parallel) and make this run's directory there:
        the work directory checked up to `/` (made 0700 by root where it is not yet),
        then the run's own directory made 0700 (it must not exist) with an empty ledger —
        one round trip (`hosts.workdir`). Raises naming every host that cannot be
        reached or whose work directory the lab will not use."""
        errors: list[str] = []

        def one(node: str, h: Ssh) -> None:
            try:
                h.connect()
                self._connected.add(node)
                g = self._guard(node, "make")
                r = h.run(g.line, check=False, timeout=30)
                h.refused(r.returncode, r.stderr, g)
                if r.returncode != 0:
                    raise SshError(f"{h.who}: cannot make {self.workdir(node)}: "
                                   f"{r.stderr.strip()[-300:]}")  # fmt: skip
                self._made.add(node)
            except (SshError, UnsafeError) as e:
                errors.append(str(e))

        each(one, self.ssh.items())
        if errors:
            raise LabError("; ".join(sorted(errors)))

    def build(self) -> None:
        self.rundir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.connect()
        for node in self.ssh:
            ssh_if = ssh_interface(self.ssh[node])
            for w in self.topo.wires:
                for n, ifname in ((w.a, w.a_if), (w.b, w.b_if)):
                    if n == node and ifname == ssh_if:
                        raise LabError(f"{node}: {ifname} carries the lab's SSH session: "
                                       "test traffic must use other interfaces")  # fmt: skip
        for w in self.topo.wires:
            for node, ifname, addr, side in ((w.a, w.a_if, w.a_addr, w.a_side),
                                             (w.b, w.b_if, w.b_addr, w.b_side)):  # fmt: skip
                if not self.driven(node):
                    continue
                if self.hosts.hosts[node].sides[side].present:
                    continue
                have = self.run(node, ["ip", "-o", "addr", "show", "dev", ifname])
                if f" {addr} " in have:
                    continue  # there already: not ours to remove
                self.record(node, f"address {addr} on {ifname}",
                            shlex.join(["ip", "addr", "del", addr, "dev", ifname]))  # fmt: skip
                nodad = ["nodad"] if ":" in addr else []
                self.run(node, ["ip", "addr", "add", addr, "dev", ifname, *nodad])
        self.described = self.describe()
        for node, dest, via in self.topo.routes:
            if not self.driven(node):
                continue
            family = ["-6"] if ":" in via else []
            have = self.run(node, ["ip", *family, "route", "show", "exact", dest]).strip()
            if have:
                if f"via {via} " in have + " ":
                    continue  # there already, as the lab wants it: not ours to remove
                raise LabError(f"{node} already routes {dest} ({have.splitlines()[0]}): the "
                               "lab will not replace a route it did not make; give the "
                               "hosts other addresses or remove that route")  # fmt: skip
            self.record(node, f"route {dest} via {via}",
                        shlex.join(["ip", *family, "route", "del", dest, "via", via]))  # fmt: skip
            self.run(node, ["ip", *family, "route", "add", dest, "via", via])
        for node in self.topo.forwarding:
            if self.driven(node):
                self.sysctl(node, "net.ipv4.ip_forward", "1")
        # The UDP workloads' socket buffers (iperf3 -w, traffic.iperf.UDP_SOCKET_BUFFER)
        # on the traffic ends: a stock kernel caps them at 212992 B, and iperf3 then
        # refuses to run ("socket buffer size not set correctly").
        ends = {f.source for f in self.topo.flows} | {f.sink for f in self.topo.flows}
        for node in sorted(n for n in ends if self.driven(n)):
            for key in ("net.core.rmem_max", "net.core.wmem_max"):
                self.sysctl(node, key, str(UDP_SOCKET_BUFFER_BYTES), at_least=True)

    def describe(self) -> dict[str, Any]:
        """What each driven host is — kernel, CPUs, and per test interface the NIC's
        driver, speed, MTU and offloads — into the run directory's hosts/environment.json
        (a figure is only as good as what it was measured on)."""
        out: dict[str, Any] = {}
        for node in self.ssh:
            ifs = sorted({i for w in self.topo.wires for n, i in ((w.a, w.a_if), (w.b, w.b_if))
                          if n == node})  # fmt: skip
            line = "uname -srm; nproc; " + "; ".join(
                f"echo {shlex.quote('== ' + i)}; cat {shlex.quote(f'/sys/class/net/{i}/mtu')} "
                f"{shlex.quote(f'/sys/class/net/{i}/speed')} 2>/dev/null; ethtool -i "
                f"{shlex.quote(i)} 2>/dev/null | grep '^driver'; ethtool -k {shlex.quote(i)} "
                "2>/dev/null | grep -E '^(tcp-segmentation|generic-segmentation|"
                "generic-receive)-offload:'" for i in ifs)  # fmt: skip
            text = self.run(node, ["sh", "-c", line], check=False)
            head, *parts = text.split("== ")
            first = head.splitlines()
            host: dict[str, Any] = {
                "kernel": first[0] if first else "?",
                "cpus": first[1] if len(first) > 1 else "?",
                "interfaces": {},
            }
            for part in parts:
                name, *rows = part.splitlines()
                if name not in ifs:  # only what was asked
                    continue
                nums = [r for r in rows if r.strip().lstrip("-").isdigit()]
                facts = dict(r.split(":", 1) for r in rows if ":" in r)
                host["interfaces"][name] = {
                    "mtu": int(nums[0]) if nums else None,
                    "speed_mbit": int(nums[1]) if len(nums) > 1 and int(nums[1]) > 0 else None,
                    **{k.strip(): v.strip() for k, v in facts.items()},
                }
            out[node] = host
        f = self.rundir / "hosts" / "environment.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(out, indent=1) + "\n")
        return out

    def shape(self, link: Link) -> None:
        """The link profile on every driven end of the shaped wires (as the namespace
        testbed: netem for delay/loss, tbf for the rate, offloads off under a rate) —
        the qdisc and each offload's setting before recorded and restored."""
        if link.rate_mbit is None and not link.needs_netem and not link.mtu:
            return
        for node, ifname in self.topo.shaped_ends():
            if not self.driven(node):
                continue
            if link.mtu:
                was = str(link_mtu(self, node, ifname))
                self.record(node, f"MTU of {ifname}", shlex.join(
                    ["ip", "link", "set", "dev", ifname, "mtu", was]))  # fmt: skip
            root = root_qdisc(self, node, ifname)
            if root not in STOCK_QDISCS:
                raise LabError(f"{node}: {ifname} has its own root qdisc ({root}): the lab "
                               "shapes only an interface with the kernel's default one, "
                               "which it can put back")  # fmt: skip
            if link.rate_mbit:
                text = self.run(node, ["ethtool", "-k", ifname], check=False)
                feats = readings.offload_features(text)
                restore = [w for f, on in feats.items() for w in (f, "on" if on else "off")]
                if restore:
                    self.record(node, f"offloads of {ifname}",
                                shlex.join(["ethtool", "-K", ifname, *restore]))  # fmt: skip
            self.record(node, f"qdisc on {ifname}",
                        shlex.join(["tc", "qdisc", "del", "dev", ifname, "root"]))  # fmt: skip
        shape_ends(self, link, [(n, i) for n, i in self.topo.shaped_ends() if self.driven(n)])

    def counters(self) -> dict[str, dict[str, int]]:
        """Interface counters of every driven wire end, `node/ifname` -> rx/tx."""
        out: dict[str, dict[str, int]] = {}
        ends = {(w.a, w.a_if) for w in self.topo.wires} | {(w.b, w.b_if) for w in self.topo.wires}
        by_node: dict[str, list[str]] = {}
        for node, ifname in sorted(ends):
            if self.driven(node):
                by_node.setdefault(node, []).append(ifname)
        for node, ifs in by_node.items():
            data = json.loads(self.run(node, ["ip", "-j", "-s", "link", "show"]))
            for d in data:
                if d.get("ifname") in ifs:
                    out[f"{node}/{d['ifname']}"] = link_counters(d)
        return out

    def host_cpu(self) -> dict[str, tuple[float, float, int]]:
        """Each driven host's CPU so far from its /proc/stat: (busy s, total s, CPUs)."""
        out: dict[str, tuple[float, float, int]] = {}
        lock = threading.Lock()

        def one(node: str, h: Ssh) -> None:
            try:
                text = h.run(["cat", "/proc/stat"], timeout=15, root=False).stdout
            except SshError:
                return
            with lock:
                out[node] = proc_stat(text)

        each(one, self.ssh.items())
        return out

    def host_procs(self, pids: dict[str, list[int]]) -> dict[str, tuple[float, int]]:
        """Per host, the CPU seconds and resident bytes of processes `pids` (node ->
        PIDs there), from their /proc; a process gone counts nothing."""
        out: dict[str, tuple[float, int]] = {}
        lock = threading.Lock()

        def one(node: str, ps: list[int]) -> None:
            try:
                text = self._host(node).run(proc_cpu_line(ps), timeout=15, root=False).stdout
            except SshError:
                return
            with lock:
                out[node] = proc_cpu(text)

        each(one, [(n, ps) for n, ps in pids.items() if ps and n in self.ssh])
        return out

    # --- tearing down ---------------------------------------------------------------------

    def teardown(self) -> None:
        while self._cleanups:
            self._cleanups.pop()()
        for _, p in reversed(self.procs):
            self.stop(p)
        self.procs.clear()
        problems: list[str] = []
        for node, h in self.ssh.items():
            if node not in self._connected:  # never reached: the lab did nothing there
                h.close()
                continue
            local = self.rundir / "hosts" / f"{node}.ledger"
            try:
                problems += self._restore(node, h)
            except UnsafeError as e:  # changed hands after the check: left as it is
                problems.append(f"{e} (the run's directory is left as it is)")
            except SshError as e:
                problems.append(f"{e} (its ledger: {local}; `ipsec-lab clean --hosts` "
                                "undoes it once the host is back)")  # fmt: skip
            finally:  # whatever else went wrong: its connection and directory go
                h.close()
        if problems:
            raise LabError("could not restore every host: " + "; ".join(problems))

    def _restore(self, node: str, h: Ssh) -> list[str]:
        """Undo, newest first, what the local copy of `node`'s ledger says (what the lab
        wrote itself, never what the host's file says), then fetch the logs and remove
        the run's directory — after checking it is still the lab's (one round trip). If
        it is not, the lines that name it are not run and it is left where it is; the
        problem is returned."""
        local = self.rundir / "hosts" / f"{node}.ledger"
        entries = read_ledger(local.read_text()) if local.exists() else []
        wd = self.workdir(node)
        unsafe: UnsafeError | None = None
        if node in self._made:
            g = self._guard(node)
            r = h.run(g.line, check=False, timeout=30)
            try:
                h.refused(r.returncode, r.stderr, g)
            except UnsafeError as e:
                unsafe = e
            if unsafe is None:
                fetch_logs(h, wd, self.rundir / "hosts" / node, lambda x: self._note(node, x))
        skipped = []
        for entry in reversed(entries):
            if unsafe is not None and wd in entry["undo"]:
                skipped.append(entry["what"])
                continue
            h.run(entry["undo"], check=False, timeout=30)
        if unsafe is not None:
            left = f"; not run, as they use it: {', '.join(skipped)}" if skipped else ""
            return [f"{unsafe} (the run's directory is left as it is{left})"]
        if node in self._made:
            h.run(["rm", "-rf", "--", wd], timeout=30, guard=self._guard(node))
        return []


def _kill_line(pid: int, start: str) -> str:
    """A shell line that stops process `pid` if it is still the one that started at
    `start`: TERM, up to 3 s, then KILL."""
    same = same_process(pid, start)
    return (f"if {same}; then kill -TERM {pid}; for i in $(seq 30); do {same} || break; "
            f"sleep 0.1; done; {same} && kill -KILL {pid}; fi; true")  # fmt: skip


if TYPE_CHECKING:  # mypy holds this testbed to what every testbed, and one of hosts, keeps
    _KEEPS: type[OnHosts] = HostsTestbed
