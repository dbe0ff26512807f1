"""What a campaign will do, before anything starts (`ipsec-lab check`, `run --dry-run`):
its runs grouped by link, backend and configuration, each backend as it will resolve on
this machine (`strongswan` → `strongswan-kernel` or `strongswan-libipsec`), what will be
skipped and why, and about how long it takes.

The skip decisions are the runner's own (`link_skip`, `backend_skip`): the same probes of
this kernel (ESP, AH, IPComp in xfrm; netem), which need root; without root they are
reported as unknown rather than guessed.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ipsec_lab import backends, workloads
from ipsec_lab.backends import Unsupported
from ipsec_lab.scenario import Scenario
from ipsec_lab.store import RunKey
from ipsec_lab.testbed import Flow, Link, topology, tunnels
from ipsec_lab.testbed.build import LabError, netem_available
from ipsec_lab.testbed.placement import Placement, placement_of
from ipsec_lab.traffic.workload import Workload

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts

# Seconds a campaign spends besides traffic, set from one run of scenarios/quick.toml on a
# 2-core machine (118 s for 18 runs; estimated 134 s, 1.14 x): a link's testbed built and
# torn down, and a backend brought up and down once per configuration (its registry
# entry's `start_s`: charon negotiates IKE; ipsec-gw starts two daemons).
TESTBED_S = 2.0
RUN_OVERHEAD_S = 0.5  # per run: the idle-CPU sample, servers started, results read


def is_root() -> bool:
    return os.geteuid() == 0


def resolve_backend(name: str, hosts: Hosts | None = None) -> tuple[str, str]:
    """The backend `name` will run as here (or on `hosts`), and why (empty when it is
    itself): its registry entry's say."""
    return backends.resolve(name, hosts)


def slower_warnings(names: tuple[str, ...] | list[str], hosts: Hosts | None = None) -> list[str]:
    """A warning for each backend that resolves here to a slower variant of itself."""
    out = []
    for b in names:
        name, why = resolve_backend(b, hosts)
        slower = backends.BY_NAME[name].slower
        if slower and name != b:
            out.append(f"{b} runs as {name} here ({why}): {slower}")
    return out


def label(name: str, version: str | None) -> str:
    """A backend as a person should read it: `strongswan` with the variant it resolved to
    (`strongswan (libipsec)`), from the version string its runs stored."""
    if name == "strongswan" and version:
        if "kernel-libipsec" in version:
            return "strongswan (libipsec)"
        if "kernel xfrm" in version:
            return "strongswan (kernel)"
    return name


def link_skip(link: Link) -> str | None:
    """Why no run on `link` can happen here, or None (the runner's own decision)."""
    if link.needs_netem:
        ok, why = netem_available()
        if not ok:
            return (
                f"link {link.name} needs netem (delay/jitter/loss/reorder/duplication) "
                f"and this kernel has none: {why}; use --vm"
            )
    return None


def testbed_skip(name: str, sc: Scenario, hosts: Hosts | None) -> str | None:
    """Why backend `name` cannot run on this kind of testbed (namespaces of this machine,
    or the real hosts of a hosts file), or None."""
    e = backends.BY_NAME[name]
    if hosts is None:
        return (
            None if e.namespaces else f"{name} runs on real hosts only: give a hosts file (--hosts)"
        )
    if not e.hosts:
        ready = ", ".join(x.name for x in backends.REGISTRY if x.hosts)
        return f"{name} does not run on real hosts yet (those that do: {ready})"
    if name != "external":
        undriven = [n for n in topology(sc.topology).ipsec_nodes if not hosts.hosts[n].ssh]
        if undriven:
            return (f"{name} needs the lab to drive {', '.join(undriven)} (no `ssh` in "
                    f"{hosts.source}: an external DUT)")  # fmt: skip
    if sc.gateway.cpu_quota or sc.gateway.cpus:
        return ("[gateway] cpu_quota / cpus cannot be applied on real hosts: the lab "
                "emulates a slow gateway with a cgroup of this machine only")  # fmt: skip
    return None


def start_skip(name: str, sc: Scenario, hosts: Hosts | None, tunnels_: int) -> str | None:
    """Why backend `name` cannot start with `tunnels_` tunnels on this kind of testbed
    (`testbed_skip`, then the tunnel count's own refusals), or None: what the runner
    and `check` both ask before the backend's own check."""
    return (
        testbed_skip(name, sc, hosts)
        or backends.tunnels_refusal(name, tunnels_, hosts is not None)
        or tunnels.refusal(sc.topology, tunnels_)
    )


def backend_skip(name: str, configuration: str, hosts: Hosts | None = None,
                 tunnels: int = 1) -> str | None:  # fmt: skip
    """Why `name` cannot run `configuration` here (or on `hosts`) with `tunnels`, or None
    (the runner's own decision)."""
    if why := backends.tunnels_refusal(name, tunnels, hosts is not None):
        return why
    try:
        backends.make(name, hosts=hosts, tunnels=tunnels).check(configuration)
    except Unsupported as e:
        return str(e)
    except LabError as e:  # a program it needs is missing: every such run would fail
        return f"cannot run: {e}"
    return None


def run_seconds(w: Workload, link: Link, warmup_s: float) -> float:
    """About how long one run of `w` on `link` takes (traffic, warm-up and set-up)."""
    traffic = workloads.of(w).seconds(w, link.rate_mbit or 1000.0)
    return traffic + warmup_s + RUN_OVERHEAD_S


@dataclass
class Group:
    """The runs of one (link, backend, configuration, tunnel count)."""

    link: str
    backend: str
    resolved: str
    configuration: str
    runs: int
    seconds: float
    status: str  # run | skip | unknown
    reason: str = ""
    tunnels: int = 1  # between the gateways (the scenario's `tunnels`)


# --- the campaign's runs -------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    key: RunKey
    link: Link
    workload: Workload
    flow: Flow


def plan(sc: Scenario) -> list[Planned]:
    """Every run of the scenario, in the order the runner takes them: per link, backend,
    configuration (`none` once), tunnel count, workload, flow (spread over the count's
    tunnels: `testbed.tunnels.spread`) and repetition."""
    topo = topology(sc.topology)
    out: list[Planned] = []
    for link in sc.links:
        for b in sc.backends:
            for cfg in ("none",) if b == "none" else sc.configurations:
                for n in sc.tunnels:
                    for w in sc.workloads:
                        for flow in (tunnels.spread(f, n) for f in topo.flows):
                            for rep in range(1, sc.repetitions + 1):
                                key = RunKey(b, cfg, link.name, w.name, flow.name, rep)
                                out.append(Planned(key, link, w, flow))
    return out


def spread_skip(p: Planned) -> str | None:
    """Why run `p` does not go over its tunnels (None: it does, or there is one)."""
    n = p.flow.destinations
    if n == 1 or workloads.of(p.workload).spreads:
        return None
    can = ", ".join(k.name for k in workloads.REGISTRY if k.spreads)
    return (f"{n} tunnels: {workloads.of(p.workload).said()} sends to one address (the "
            f"tunnel count is measured with {can})")  # fmt: skip


def generators(sc: Scenario, hosts: Hosts | None = None) -> dict[str, str]:
    """Per workload that sends UDP, the generator it will run with here and why."""
    import shutil

    out: dict[str, str] = {}
    for w in sc.workloads:
        if not workloads.of(w).generated(w):
            continue
        auto = w.generator == "auto"
        if w.generator == "iperf3":
            out[w.name] = "iperf3 (asked for)"
        elif sc.topology != "line":
            out[w.name] = ("iperf3 (the paced generators cannot drive the sources' own "
                           "host-to-host IPsec)")  # fmt: skip
        elif hosts is not None:
            out[w.name] = (
                "udp-gso where the client host has python3 (else trafgen, netsniff-ng) and "
                "the server nft, else iperf3"
                if auto
                else f"{w.generator} (asked for)"
            )
        elif not shutil.which("nft"):
            out[w.name] = ("iperf3 (no nft here to count a paced generator's packets: "
                           "Debian nftables)" if auto else f"{w.generator}: no nft here to "
                           "count its packets (Debian nftables)")  # fmt: skip
        elif w.generator == "trafgen" and not shutil.which("trafgen"):
            out[w.name] = "trafgen: missing here (Debian netsniff-ng)"
        else:  # udp-gso needs only the lab's own Python here
            out[w.name] = "udp-gso (the fastest here)" if auto else f"{w.generator} (asked for)"
    return out


def forecast(sc: Scenario, hosts: Hosts | None = None) -> dict[str, Any]:
    """The campaign's plan, as `check` prints it (JSON-ready); with `hosts`, on them."""
    root = is_root() and hosts is None  # on real hosts this kernel's probes say nothing
    groups: dict[tuple[str, str, str, int, str], Group] = {}
    resolved = {b: resolve_backend(b, hosts) for b in sc.backends}
    link_why = {lk.name: link_skip(lk) if root else None for lk in sc.links}
    for p in plan(sc):
        k, n = p.key, p.flow.destinations
        spread_why = spread_skip(p) or ""  # runs of this group that cannot spread
        gk = (k.link, k.backend, k.configuration, n, spread_why)
        g = groups.get(gk)
        if g is None:
            name, _ = resolved[k.backend]
            where = start_skip(k.backend, sc, hosts, n) or spread_why
            if where:
                status, why = "skip", where
            elif link_why[k.link]:
                status, why = "skip", link_why[k.link] or ""
            elif (
                hosts is None
                and not root
                and (p.link.needs_netem or backends.BY_NAME[name].probes_kernel)
            ):
                status, why = "unknown", "probing this kernel needs root: run check as root"
            else:
                why = backend_skip(k.backend, k.configuration, hosts, n) or ""
                status = "skip" if why else "run"
            e = backends.BY_NAME[k.backend]
            start = e.start_estimate(n, sc.gateway.ike_sas)
            g = Group(k.link, k.backend, name, k.configuration, 0, start, status, why, n)
            groups[gk] = g
        g.runs += 1
        g.seconds += run_seconds(p.workload, p.link, sc.warmup_s)
    rows = list(groups.values())
    runnable = [g for g in rows if g.status != "skip"]
    seconds = sum(g.seconds for g in runnable) + TESTBED_S * len({g.link for g in runnable})
    warnings = slower_warnings(sc.backends, hosts)
    placed = campaign_placement(sc, hosts)
    if placed.shared:
        warnings.append(f"the IPsec under test shares CPUs with the traffic "
                        f"({placed.shared_why()}): every row will say SHARED CORES")  # fmt: skip
    if not root and hosts is None:  # on real hosts the lab needs no root here
        warnings.append("not root: `ipsec-lab run` needs root, and this check could not "
                        "probe the kernel (ESP, AH, IPComp, netem)")  # fmt: skip
    return {
        "scenario": sc.name,
        "source": sc.source,
        "topology": sc.topology,
        "repetitions": sc.repetitions,
        "backends": {b: {"runs_as": n, "why": w} for b, (n, w) in resolved.items()},
        "groups": [asdict(g) for g in rows],
        "runs": sum(g.runs for g in rows),
        "will_run": sum(g.runs for g in rows if g.status == "run"),
        "skipped": sum(g.runs for g in rows if g.status == "skip"),
        "unknown": sum(g.runs for g in rows if g.status == "unknown"),
        "estimated_s": round(seconds),
        "generators": generators(sc, hosts),
        "placement": {**placed.record(), "says": placed.describe()},
        "warnings": warnings,
    }


def campaign_placement(sc: Scenario, hosts: Hosts | None = None) -> Placement:
    """Where the scenario's roles run here (testbed.placement): it records host-to-host
    topologies, whose hosts do both, and trafgen's own pinning as shared."""
    topo = topology(sc.topology)
    ends = {n for f in topo.flows for n in (f.source, f.sink)}
    trafgen = hosts is None and any(how.startswith("trafgen") for how in generators(sc).values())
    both = bool(ends & set(topo.ipsec_nodes))
    return placement_of(sc.placement, sc.gateway.cpus, sc.gateway.cpu_quota, hosts is not None,
                        host_to_host=both, trafgen=trafgen)  # fmt: skip


def duration(s: float) -> str:
    """Seconds as a person reads a duration: 45 s, 3 min 20 s, 1 h 05 min."""
    s = round(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
