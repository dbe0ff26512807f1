"""`ipsec-lab hosts check`: everything the lab needs of each real host, before any
traffic — reachable, root (or passwordless sudo), each tool with its version and the
Debian package that has it, kernel modules, the test interfaces there, up, not the one
SSH uses, with an MTU that fits, and a clock close to this machine's.

Every check is a row (host, what, status, detail): `ok`, `warn` (the lab can run, with
the caveat said) or `fail` (it cannot: the detail says what to do). The work directory
fails when it, or a directory above it, is another user's or writable by others (the
lab runs commands as root from there: `hosts.workdir`); the check makes nothing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from ipsec_lab import backends as registry
from ipsec_lab import workloads as kinds
from ipsec_lab.backends.mtu import facts as mtu_facts
from ipsec_lab.backends.userspace_wireguard import BORINGTUN_VERSION
from ipsec_lab.hosts import Hosts, sides_of
from ipsec_lab.hosts.readings import named_line, running, ssh_interface
from ipsec_lab.hosts.ssh import Ssh, SshError, each
from ipsec_lab.hosts.workdir import guard, refusals
from ipsec_lab.testbed import INNER_MTU, TOPOLOGIES, topology
from ipsec_lab.traffic.workload import Workload

# What each tool is for, how its version shows, and the Debian package with it.
TOOLS: dict[str, tuple[str, str, str]] = {
    "ip": ("addresses, routes, counters, xfrm", "ip -V", "iproute2"),
    "tc": ("link shaping", "tc -V", "iproute2"),
    "ss": ("waiting for servers", "ss -V", "iproute2"),
    "sysctl": ("forwarding and PMTU settings", "sysctl --version", "procps"),
    "ethtool": ("offloads under shaping, NIC facts", "ethtool --version", "ethtool"),
    "iperf3": ("TCP, UDP, IMIX and RFC 2544 traffic", "iperf3 --version", "iperf3"),
    "nginx": ("the HTTP workload's server", "nginx -v", "nginx-light"),
    "curl": ("the HTTP workload's client", "curl --version", "curl"),
    "swanctl": (
        "strongSwan backends",
        "swanctl --help | grep -m1 strongSwan",
        "strongswan-swanctl",
    ),
    "tcpdump": ("captures", "tcpdump --version", "tcpdump"),
    "nft": ("ipsec-gw's guard (fail closed)", "nft --version", "nftables"),
    "python3": (
        "xfrm-udp's ESP-in-UDP socket; the lab's UDP sender (udp-gso)",
        "python3 --version",
        "python3",
    ),
    "/usr/lib/ipsec/charon": (
        "strongSwan's IKE daemon",
        "/usr/lib/ipsec/charon --version",
        "strongswan-charon",
    ),
    "unshare": ("charon's private /run", "unshare --version", "util-linux"),
    "aiosmtpd": ("the SMTP workload's server", "python3 -m aiosmtpd --version", "python3-aiosmtpd"),
    # (trafgen --version exits 1 after printing it)
    "trafgen": ("the fast UDP generator", "trafgen --version || true", "netsniff-ng"),
    "ping": ("resolving a paced generator's next hop", "ping -V", "iputils-ping"),
    "irtt": ("latency probes", "irtt version", "irtt"),
    "wireguard-go": ("WireGuard in user space", "wireguard-go --version", "wireguard-go"),
    # not a Debian package: crates.io's (what `make deps` runs here; an install line in
    # place of a package's name)
    "boringtun-cli": (
        "Cloudflare's WireGuard in user space",
        "boringtun-cli --version",
        f"cargo install --locked boringtun-cli --version {BORINGTUN_VERSION} --root /usr/local",
    ),
    "wg": ("WireGuard's keys and peers", "wg --version", "wireguard-tools"),
}
# Tools the lab does without, saying what it does instead (a `warn`, not a `fail`).
OPTIONAL = {
    "python3": "the lab's UDP sender (udp-gso) cannot run here: UDP workloads fall back to "
    "trafgen, else iperf3, whose sender runs out of small packets first",
    "trafgen": "a workload asking for trafgen cannot run; auto uses udp-gso (python3), else iperf3",
    "nft": "a paced generator's packets cannot be counted at this sink: UDP workloads use iperf3",
    "ping": "a paced generator's next hop must already be in the neighbour table",
}
# Tools every driven host needs, then per backend and per workload.
BASE_TOOLS = ("ip", "sysctl", "ss")
TRAFFIC_TOOLS = ("iperf3",)
GATEWAY_TOOLS = ("tc", "ethtool")
# (each backend's own tools, on the IPsec nodes: its entry's in ipsec_lab.backends)
# (each workload's own tools, at the traffic's ends: its kind's in ipsec_lab.workloads)
MODULES = {"esp4": "ESP over IPv4 (xfrm)", "esp6": "ESP over IPv6 (xfrm)", "ah4": "AH (xfrm)",
           "xfrm_ipcomp": "IPComp (xfrm)", "sch_netem": "delay/loss links"}  # fmt: skip
# A clock further off than this is reported (one-way figures across hosts need better).
CLOCK_WARN_S = 0.5


@dataclass
class Row:
    host: str
    check: str
    status: str  # ok | warn | fail
    detail: str


def needed_tools(node: str, topo_name: str, backends: tuple[str, ...] = (),
                 workloads: tuple[Workload, ...] = ()) -> list[str]:  # fmt: skip
    topo = topology(topo_name)
    need = list(BASE_TOOLS)
    flows = {f.source for f in topo.flows} | {f.sink for f in topo.flows}
    if node in flows:
        need += TRAFFIC_TOOLS
        for w in workloads:
            need += kinds.of(w).tools(w)

    if node in topo.ipsec_nodes or any(node in (w.a, w.b) for w in topo.wires if w.shaped):
        need += GATEWAY_TOOLS
        for b in backends:
            need += registry.BY_NAME[b].tools
    return list(dict.fromkeys(need))


def optional_tools(node: str, topo_name: str, required: list[str],
                   workloads: tuple[Workload, ...] = ()) -> list[str]:  # fmt: skip
    """Tools the lab does without on `node` (OPTIONAL), for the workloads given: the
    paced generators' (python3 for udp-gso, trafgen) on a UDP source and nft on its sink
    where they can drive the topology."""
    topo = topology(topo_name)
    # udp-gso or trafgen sends a generated workload's UDP (from the source) and nft counts
    # it (at the sink) where the topology lets it (`line`: the sources do no IPsec of
    # their own)
    if topo_name != "line" or not any(kinds.of(w).generated(w) for w in workloads):
        return []
    source = ["python3", "trafgen", "ping"]
    want = (source if node in {f.source for f in topo.flows} else []) + (
        ["nft"] if node in {f.sink for f in topo.flows} else [])  # fmt: skip
    return [t for t in want if t not in required]


def check_host(hosts: Hosts, node: str, topo_name: str, backends: tuple[str, ...],
               workloads: tuple[Workload, ...]) -> list[Row]:  # fmt: skip
    h = hosts.hosts[node]
    out: list[Row] = []
    if h.ssh is None:
        return [Row(node, "ssh", "ok", "not driven by the lab (an external DUT): nothing to check")]
    s = Ssh(h.ssh, node, hosts.ssh_config)
    try:
        try:
            user = s.connect()
        except SshError as e:
            return [Row(node, "reachable", "fail", str(e))]
        out.append(Row(node, "reachable", "ok", f"ssh {h.ssh} as {user}"
                       + (" (sudo -n)" if s.sudo else "")))  # fmt: skip
        need = needed_tools(node, topo_name, backends, workloads)
        out += _tools(s, node, need)
        out += _tools(s, node, optional_tools(node, topo_name, need, workloads), optional=True)
        out += _modules(s, node, backends, node in topology(topo_name).ipsec_nodes)
        users = {u for b in backends if (u := registry.BY_NAME[b].user)}
        if node in topology(topo_name).ipsec_nodes and users:
            out += _ours(s, node, h.ipsec_gw, sorted(users))
        if node in topology(topo_name).ipsec_nodes and any(
            b.startswith("strongswan") for b in backends
        ):
            out += _strongswan(s, node, backends)
        out += _interfaces(s, hosts, node, topo_name)
        out.append(_clock(s, node))
        out.append(_workdir(s, node, h.workdir))
    except SshError as e:
        out.append(Row(node, "connection", "fail", str(e)))
    finally:
        s.close()
    return out


def _tools(s: Ssh, node: str, tools: list[str], optional: bool = False) -> list[Row]:
    out = []
    for t in tools:
        what, version, pkg = TOOLS[t]
        # the tool must run, not only be found: its version command's status decides
        # 60 s: a first start from a cold disk can be slow (python3 in an emulated VM)
        r = s.run(f"command -v {t} >/dev/null && {version} 2>&1", check=False, timeout=60)
        first = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
        get = f"install it: {pkg}" if " " in pkg else f"install Debian package {pkg}"
        if (r.returncode != 0 or not first) and optional:
            why = f"missing ({what}): {OPTIONAL[t]}; {get}"
            out.append(Row(node, f"tool {t}", "warn", why))
        elif r.returncode != 0 or not first:
            out.append(Row(node, f"tool {t}", "fail",
                           f"missing ({what}): {get}"))  # fmt: skip
        else:
            out.append(Row(node, f"tool {t}", "ok", first[:60]))
    return out


def _ours(s: Ssh, node: str, preset: str | None, users: list[str]) -> list[Row]:
    """What ipsec-gw needs of a host: its user, a TUN device, a binary it can run."""
    import platform

    out = []
    for user in users:
        r = s.run(["id", "-u", user], check=False, timeout=20)
        if r.returncode == 0:
            out.append(Row(node, f"user {user}", "ok", f"uid {r.stdout.strip()}"))
        else:
            out.append(Row(node, f"user {user}", "fail", "missing (ipsec-gw gives up root "
                           f"for it): useradd --system --no-create-home {user}"))  # fmt: skip
    r = s.run(["test", "-c", "/dev/net/tun"], check=False, timeout=20)
    ok = r.returncode == 0
    out.append(Row(node, "/dev/net/tun", "ok" if ok else "fail",
                   "present" if ok else "missing: modprobe tun"))  # fmt: skip
    if preset:
        r = s.run([preset, "--version"], check=False, timeout=20)
        ok = r.returncode == 0
        why = r.stdout.strip() if ok else f"{preset} does not run: {r.stderr.strip()[-80:]}"
        out.append(Row(node, "ipsec-gw", "ok" if ok else "fail", why))
    else:
        arch = s.run(["uname", "-m"], check=False, timeout=20).stdout.strip()
        ok = arch == platform.machine()
        mine = platform.machine()
        why = (f"this machine's build is pushed ({arch})" if ok else
               f"host is {arch}, this machine's build {mine}: set {node}.ipsec_gw")  # fmt: skip
        out.append(Row(node, "ipsec-gw", "ok" if ok else "fail", why))
    return out


def _strongswan(s: Ssh, node: str, backends: tuple[str, ...]) -> list[Row]:
    """What the lab's own charon needs of a host: IKE's ports free (a charon the host
    runs already holds UDP 500 and 4500), and a TUN device for kernel-libipsec."""
    out = []
    pids = running(s.run(named_line("charon"), check=False, timeout=20).stdout)
    if pids:
        out.append(Row(node, "charon", "warn",
                       f"a charon already runs (pid {', '.join(pids)}): it may hold UDP 500 "
                       "and 4500, and the lab's charon then cannot bind (stop it for the "
                       "run)"))  # fmt: skip
    else:
        out.append(Row(node, "charon", "ok", "none running: IKE's ports are free"))
    if any(b in ("strongswan", "strongswan-libipsec") for b in backends):
        ok = s.run(["test", "-c", "/dev/net/tun"], check=False, timeout=20).returncode == 0
        out.append(Row(node, "/dev/net/tun", "ok" if ok else "fail",
                       "present (kernel-libipsec)" if ok else "missing: modprobe tun"))  # fmt: skip
    return out


def _modules(s: Ssh, node: str, backends: tuple[str, ...], ipsec: bool) -> list[Row]:
    kernel = any(registry.BY_NAME[b].kernel_esp for b in backends)
    # a backend's own modules (the kernel's WireGuard): needed on its IPsec nodes only,
    # listed only where it is chosen
    own = {m: what for b in backends if ipsec for m, what in registry.BY_NAME[b].modules}
    out = []
    for m, what in {**MODULES, **own}.items():
        line = (f"test -d /sys/module/{m} && echo loaded || "
                f"(modinfo -n {m} >/dev/null 2>&1 && echo available) || echo missing")  # fmt: skip
        state = s.run(line, check=False, timeout=20).stdout.strip() or "missing"
        needed = (kernel and m != "sch_netem") or m in own
        status = "ok" if state != "missing" else ("fail" if needed else "warn")
        out.append(Row(node, f"module {m}", status, f"{state} ({what})"))
    return out


def _interfaces(s: Ssh, hosts: Hosts, node: str, topo_name: str) -> list[Row]:
    h = hosts.hosts[node]
    topo = topology(topo_name)
    ssh_if = ssh_interface(s)
    out = []
    for side in sides_of(topo, node):
        i = h.sides.get(side)
        if i is None:
            out.append(Row(node, f"{side}", "fail", f"not in the hosts file ({node}.{side})"))
            continue
        r = s.run(["ip", "-j", "link", "show", "dev", i.interface], check=False, timeout=20)
        if r.returncode != 0:
            out.append(Row(node, f"{side} {i.interface}", "fail", "no such interface"))
            continue
        link = json.loads(r.stdout)[0]
        if i.interface == ssh_if:
            out.append(Row(node, f"{side} {i.interface}", "fail",
                           "carries the lab's SSH session: name another interface for "
                           "test traffic"))  # fmt: skip
            continue
        up = "UP" in link.get("flags", [])
        mtu = int(link.get("mtu", 0))
        if not up:
            out.append(Row(node, f"{side} {i.interface}", "fail",
                           f"down: `ip link set {i.interface} up`"))  # fmt: skip
            continue
        status, detail = "ok", f"up, MTU {mtu}"
        if side == "inside" and mtu < INNER_MTU:
            status = "warn"
            detail += f" (< {INNER_MTU}: the hosts' own packets are smaller than a real LAN's)"
        elif side != "inside":
            # what the tunnel over this link offers its hosts (ours' `mtu = "auto"`; the
            # kernel's xfrm the same): the link's MTU less ESP's overhead
            # tunnel mode between gateways (line), transport host to host (pair, clients)
            esp = mtu_facts(topo_name, "ours", "esp:aes128gcm16", mtu)["largest_whole_inner"]
            udp = mtu_facts(topo_name, "ours-udp", "esp:aes128gcm16", mtu)["largest_whole_inner"]
            detail += (f": the tunnel's inner MTU will be {esp} B (esp:aes128gcm16; {udp} B "
                       "in UDP), the link's less ESP's overhead — a larger inner packet is "
                       "refused with ICMP (DF) or fragmented before it is sealed")  # fmt: skip
        if i.address:
            detail += f", {i.address}" + (" (present)" if i.present else " (the lab adds it)")
        out.append(Row(node, f"{side} {i.interface}", status, detail))
    return out


def _clock(s: Ssh, node: str) -> Row:
    t0 = time.time()
    r = s.run("date +%s.%N", root=False, check=False, timeout=20)
    t1 = time.time()
    try:
        off = float(r.stdout.strip()) - (t0 + t1) / 2
    except ValueError:
        return Row(node, "clock", "warn", "could not read the host's clock")
    status = "ok" if abs(off) <= CLOCK_WARN_S else "warn"
    detail = f"{off * 1000:+.0f} ms from this machine (±{(t1 - t0) * 500:.0f} ms)"
    if status == "warn":
        detail += ": one-way figures across hosts need synchronised clocks (chrony/NTP)"
    return Row(node, "clock", status, detail)


def _workdir(s: Ssh, node: str, workdir: str) -> Row:
    """The work directory and every directory above it root's (or the login user's)
    and writable by no one else (`hosts.workdir`), read only: nothing is made here."""
    g = guard(s.uid, workdir, "check")
    r = s.run(g.line, check=False, timeout=20)
    found = refusals(r.stderr)
    if found:
        return Row(node, "work directory", "fail", f"{workdir}: {found[0].why()}")
    if r.returncode != 0:
        return Row(node, "work directory", "fail",
                   f"{workdir}: cannot check ({_last_line(r.stderr)})")  # fmt: skip
    said = dict(x.split("\t", 1) for x in r.stdout.splitlines() if "\t" in x)
    if "readonly" in said:
        return Row(node, "work directory", "fail", f"{workdir}: {said['readonly']} is read-only")
    if "missing" in said:
        return Row(node, "work directory", "ok", f"{workdir} (made 0700 by root at the first "
                   "run; every directory above it is root's or yours, not writable by "
                   "others)")  # fmt: skip
    return Row(node, "work directory", "ok", f"{workdir} (it and every directory above it "
               "root's or yours, not writable by others)")  # fmt: skip


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "no message"


def run_checks(hosts: Hosts, topo_name: str | None = None, backends: tuple[str, ...] = (),
               workloads: tuple[Workload, ...] = ()) -> list[Row]:  # fmt: skip
    """Every host's checks, the hosts in parallel, in the file's order."""
    name = topo_name or hosts.topology or _guess(hosts)
    by: dict[str, list[Row]] = {}

    def one(node: str) -> None:
        by[node] = check_host(hosts, node, name, backends, workloads)

    each(one, [(n,) for n in hosts.hosts])
    return [r for n in hosts.hosts for r in by[n]]


def _guess(hosts: Hosts) -> str:
    """The topology whose nodes are exactly the file's (for a file without `topology`)."""
    for name in TOPOLOGIES:
        if set(topology(name).nodes) == set(hosts.hosts):
            return name
    return "line"


def as_json(rows: list[Row]) -> list[dict[str, str]]:
    return [asdict(r) for r in rows]
