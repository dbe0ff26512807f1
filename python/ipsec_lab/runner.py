"""A campaign: every (link, backend, configuration, workload, flow, repetition) of a
scenario, run in order on real testbeds, each finished run committed to the store.

Order: one testbed per link profile (built, shaped, torn down); in it, each backend and
configuration brought up once and every workload, flow and repetition run through it.
A run the backend cannot do is stored as skipped with the reason. A failure (a testbed
that cannot be built, a backend not starting, a tool erroring) is stored as failed with
its reason and the tail of the failing programs' own logs, and the campaign goes on with
the rest; it then ends with status `failed` (the CLI exits non-zero) and `--resume` retries
only the failed runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipsec_lab import backends, ceiling, environment, meters, metrics, scenario, workloads
from ipsec_lab.backends import Unsupported
from ipsec_lab.backends import mtu as backends_mtu
from ipsec_lab.meters.soaker import Soaker
from ipsec_lab.preflight import (
    Planned,
    campaign_placement,
    label,
    link_skip,
    plan,
    spread_skip,
    start_skip,
)
from ipsec_lab.scenario import Scenario
from ipsec_lab.store import RunKey, Store, group_results
from ipsec_lab.testbed import Link, Topology, topology
from ipsec_lab.testbed import tunnels as many
from ipsec_lab.testbed.build import LabError, require_root, require_tools
from ipsec_lab.testbed.build import Testbed as Namespaces
from ipsec_lab.testbed.interface import Testbed, on_hosts
from ipsec_lab.testbed.links import link_mtu
from ipsec_lab.traffic import Meters, Row, soak
from ipsec_lab.traffic.workload import Context, Lookup

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts


def same_scenario(text: str, sc: Scenario) -> bool:
    """Whether `text` parses to the scenario `sc` (the same runs of the same things:
    comments, spacing, key order and spellings such as "100M" for 100 may differ)."""
    try:
        other = scenario.parse(text, sc.source)
    except scenario.ScenarioError:
        return False
    return dataclasses.replace(other, source="", text="") == dataclasses.replace(
        sc, source="", text=""
    )


def here() -> dict[str, Any]:
    """This machine and build as a campaign records them (`environment.describe` and the
    build id: the lab's code, its engine and the ipsec-gw it runs)."""
    gw = backends.ours.gateway_binary()
    return {**environment.describe(), "build": environment.build_id(*([gw] if gw else []))}


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)


@dataclass
class Progress:
    """What the runner reports as it goes (the CLI turns it into a rich display).
    `done` counts every run that ended (done, failed or skipped); `last` describes the
    run that ended last, one line; `more` the rest of a failed run's reason (the programs'
    log tails: what a log of the run, CI's, needs to say why)."""

    total: int
    done: int = 0
    failed: int = 0
    skipped: int = 0
    current: str = ""
    last: str = ""
    more: str = ""


def failure_reason(e: BaseException, logs: list[tuple[str, str]]) -> str:
    """A failed run's stored reason: what failed, then the tail of each program log
    that changed during the run (nginx's error log, charon's log, ipsec-gw's stderr)."""
    msg = str(e) if isinstance(e, LabError) else f"{type(e).__name__}: {e}"
    for name, text in logs:
        msg += f"\n--- {name} (last lines) ---\n{text}"
    return msg


class Campaign:
    def __init__(
        self,
        sc: Scenario,
        lab: Path,
        resume: bool = False,
        on_progress: Callable[[Progress], None] | None = None,
        hosts: Hosts | None = None,
    ) -> None:
        self.sc = sc
        # Real hosts over SSH instead of namespaces of this machine (ipsec_lab.hosts).
        self.hosts = hosts
        # Absolute: paths under it are handed to other programs (see Testbed).
        self.lab = lab.resolve()
        self.store = Store(self.lab / "results.sqlite")
        self.on_progress = on_progress or (lambda p: None)
        existing = self.store.resumable(sc.text, lambda t: same_scenario(t, sc)) if resume else None
        if existing is None:
            self.id = self.store.new_campaign(sc.name, sc.source, sc.text, here())
        else:
            self.id = existing
            # runs of two builds in one campaign: no build id is true of it (and
            # `reproduce --if-changed` never takes it for this build's)
            camp = self.store.campaign(existing)
            was = json.loads(camp["environment"] or "{}").get("build") if camp else None
            if was != here()["build"]:
                self.store.add_environment(self.id, {"build": f"mixed ({was} and more)"})
        self.plan = plan(sc)
        # Which CPUs the traffic and the IPsec under test run on (recorded in every row)
        self.placement = campaign_placement(sc, hosts)
        # where the runs measure, for each row's testbed key (ceiling.py)
        self.where = ({"hosts": {h.node: h.ssh for h in hosts.hosts.values()}}
                      if hosts else environment.identity())  # fmt: skip
        self.soaker: Soaker | None = None
        # each backend as `preflight.label` names it once it has started (its variant)
        self.shown: dict[str, str] = {}
        # the running backend's start: its tunnels, their set-up time and memory (rows)
        self.set_up: dict[str, Any] = {}
        self.finished = self.store.finished_keys(self.id)
        self.failed_keys: set[RunKey] = set()
        # What went wrong outside any run (a testbed that could not be torn down whole):
        # the CLI prints it after the summary.
        self.warnings: list[str] = []
        self.progress = Progress(total=len(self.plan), done=len(self.finished))
        # `run --quick`: soak workloads run this many minutes instead of their own
        self.soak_minutes: float | None = None

    def _stop_soaker(self) -> None:
        if self.soaker:
            self.soaker.close()
            self.soaker = None

    def pending(self) -> list[Planned]:
        return [p for p in self.plan if p.key not in self.finished]

    def run(self) -> None:
        if self.hosts is None:
            require_root()
            require_tools("ip", "tc", "iperf3", "ss")
        else:
            require_tools("ssh")
        self.store.set_status(self.id, "running")
        try:
            for link, group in _by_link(self.pending()):
                self._link(link, group)
        except KeyboardInterrupt:
            self.store.set_status(self.id, "interrupted")
            raise
        except BaseException:
            self.store.set_status(self.id, "failed")
            raise
        self.store.set_status(self.id, "failed" if self.progress.failed else "finished")

    def _link(self, link: Link, group: list[Planned]) -> None:
        sc = self.sc
        # Skips are decided before building anything (cheap, and no testbed for nothing).

        reason = link_skip(link)
        if reason:
            for p in group:
                self._store(p, "skipped", time.time(), reason=reason)
            return
        runnable: list[Planned] = []
        checked: dict[tuple[str, str, int], str | None] = {}
        for p in group:
            k = (p.key.backend, p.key.configuration, p.flow.destinations)
            if k not in checked:
                checked[k] = start_skip(k[0], self.sc, self.hosts, k[2])
                if checked[k] is None:
                    try:
                        backends.make(k[0], hosts=self.hosts, tunnels=k[2]).check(k[1])
                    except Unsupported as e:
                        checked[k] = str(e)
            why = checked[k] or spread_skip(p)
            if why is not None:
                self._store(p, "skipped", time.time(), reason=why)
            else:
                runnable.append(p)
        if not runnable:
            return
        rundir = self.lab / f"campaign-{self.id}" / _slug(link.name)
        topo = topology(sc.topology)
        started = time.time()
        pending = list(runnable)
        try:
            with self._testbed(topo, rundir, runnable) as tb:
                if self.hosts is not None:  # the hosts' kernels, CPUs and NICs
                    self.store.add_environment(self.id, {
                        "hosts_file": str(self.hosts.source), "hosts": tb.described})  # fmt: skip
                tb.shape(link)
                if sc.soaker:
                    self.soaker = Soaker()
                    self.soaker.start()
                    tb.on_teardown(self._stop_soaker)
                for (bname, cfg, n), runs in _by_backend(runnable):
                    self._backend(tb, link, bname, cfg, runs, n)
                    pending = [p for p in pending if p not in runs]
        except (LabError, OSError) as e:
            # The testbed itself failed (building, shaping, tearing down): every run of
            # this link not yet stored fails with that reason; the next link goes on.
            reason = f"testbed for link {link.name} failed: {failure_reason(e, [])}"
            left = [p for p in pending if p.key not in self.finished
                    and p.key not in self.failed_keys]  # fmt: skip
            for p in left:
                self._store(p, "failed", started, reason=reason)
            if not left:  # every run was stored: the failure was in tearing down
                self.warnings.append(reason)

    def _testbed(self, topo: Topology, rundir: Path, runs: list[Planned]) -> Any:
        """The testbed the runs go on: namespaces of this machine, or the real hosts
        (either a context manager that yields itself, a `testbed.interface.Testbed`)."""
        if self.hosts is None:
            return Namespaces(topo, rundir, self.sc.gateway.cpu_quota, self.sc.gateway.cpus,
                           placement=self.placement)  # fmt: skip
        from ipsec_lab.hosts.testbed import HostsTestbed

        external = any(p.key.backend == "external" for p in runs)
        return HostsTestbed(topo, self.hosts, rundir, external=external)

    def _backend(self, tb: Testbed, link: Link, bname: str, cfg: str, runs: list[Planned],
                 n: int = 1) -> None:  # fmt: skip
        self.set_up = {}
        backend = backends.make(bname, stage_timing=self.sc.stage_timing, hosts=self.hosts,
                                aqm=self.sc.gateway.aqm, tunnels=n,
                                tun_queue=self.sc.gateway.tun_queue,
                                ike_sas=self.sc.gateway.ike_sas)  # fmt: skip
        many_ = f", {n} tunnels" if n > 1 else ""
        self.progress.current = f"{bname} {cfg} | {link.name} | starting{many_}"
        self.on_progress(self.progress)
        started = time.time()
        mark = tb.log_mark()
        try:
            many.route_far(tb, n)  # the routes besides the IPsec's own (none: all there is)
            t0 = time.monotonic()
            backend.start(tb, cfg)
            # what setting up its tunnels took (to the backend's own "up"), and the
            # memory its processes hold with them up (issue 44's per-tunnel figures)
            self.set_up = {"tunnels": n, "setup_s": time.monotonic() - t0,
                           **backend.set_up_figures()}  # fmt: skip
            try:  # a figure of the row, never a reason for the start to fail
                held = self._procs(tb, backend)()
            except (LabError, OSError):
                held = None
            if held is not None:
                self.set_up["ipsec_rss_bytes_at_start"] = held[1]
        except Exception as e:
            # Unsupported at start: only the testbed could tell (a real host's kernel
            # refusing an SA) — a skip with that reason, as a check would have made it.
            skip = isinstance(e, Unsupported)
            reason = str(e) if skip else (
                f"backend {bname} ({cfg}) failed to start: "
                + failure_reason(e, tb.logs_since(mark))
            )  # fmt: skip
            for p in runs:
                self._store(p, "skipped" if skip else "failed", started, reason=reason)
            try:
                backend.stop(tb)
            except Exception:
                pass
            return
        version = backend.version()

        self.shown[bname] = label(bname, version)
        try:
            for p in runs:
                self._one(tb, backend, p, version)
        finally:
            backend.stop(tb)

    def _one(self, tb: Testbed, backend: backends.Backend, p: Planned, version: str) -> None:
        k = p.key
        self.progress.current = (
            f"{self.shown.get(k.backend, k.backend)} {k.configuration} | {k.link} | "
            f"{k.workload} {k.flow} "
            f"| rep {k.repetition}/{self.sc.repetitions}"
        )
        self.on_progress(self.progress)
        started = time.time()
        mark = tb.log_mark()
        # The flow as the testbed placed it (real hosts: their interfaces and addresses),
        # spread over the run's tunnels
        base = next(f for f in tb.topo.flows if f.name == many.base_name(p.flow))
        flow = many.spread(base, p.flow.destinations)

        dead = backend.died()
        if dead:  # an earlier run's end found it so too; nothing to measure now
            self._store(p, "failed", started, reason=f"{k.backend} is down: {dead}",
                        version=version)  # fmt: skip
            return
        stages = getattr(backend, "stage_ns", None) if self.sc.stage_timing else None
        # Someone else's work on the machine skews every CPU figure of the run: sampled
        # with the IPsec up and no traffic yet, and flagged in each row.
        busy = meters.other_cpu(backend.pids(), self.soaker)
        # the outer link's MTU as the run finds it, and what the tunnel fits whole in it
        node, ifname = flow.wire_end.split("/", 1)
        outer = link_mtu(tb, node, ifname) if tb.driven(node) else None  # external: unknown
        inner = getattr(backend, "inner_mtu", None)  # a tunnel device of its own (ours)
        mtu = backends_mtu.facts(self.sc.topology, k.backend, k.configuration, outer,
                                 inner() if inner and outer else None)  # fmt: skip
        # what sets plain forwarding's figure here: a `none` row of this key is the
        # ceiling of every backend's (ceiling.py), in this campaign or a later one
        key = ceiling.testbed_key(self.where, self.sc.topology, p.link, k.flow, p.workload,
                                  self.sc.generator, self.placement.record(), outer)  # fmt: skip

        def metered(label: str, fn: Callable[[], Row]) -> Row:
            s0 = stages() if stages else None
            hosts = None
            if on_hosts(tb):
                on = tb
                hosts = meters.HostMeters(tb.host_cpu, tb.topo.ipsec_nodes,
                                          lambda: on.host_procs(backend.host_pids()))  # fmt: skip
            row = meters.measure(fn, tb.counters, backend.pids, flow.wire_end, self.soaker,
                                 hosts)  # fmt: skip
            if stages and s0 is not None:
                s1 = stages()
                row["stage_ns"] = {k: v - s0.get(k, 0) for k, v in s1.items()}
            row["label"] = label
            row["other_cpu_before"] = busy
            row["busy"] = busy > meters.BUSY_CPUS
            row.update(self.placement.record())
            row.update(mtu)
            aqm = getattr(backend, "aqm", None)  # ours: its queues' AQM; others have none
            if isinstance(aqm, bool):
                row["aqm"] = aqm
            tun_queue = getattr(backend, "tun_queue", None)  # ours: its TUN devices' queue
            if isinstance(tun_queue, int | str):
                row["tun_queue"] = tun_queue
            row["testbed_key"] = key
            row.update(self.set_up)
            meters.count_segments(row, outer)  # a GSO buffer counted as its segments
            return row

        timed = Meters(metered, backend.plane_clock, self._procs(tb, backend))
        kind = workloads.of(p.workload)
        ctx = Context(tb, flow, p.workload, timed, self.sc.warmup_s, self.sc.seed + k.repetition,
                      lambda field: self._searched(k, field), self.soak_minutes,
                      lambda dry: backend.rekey(tb, dry))  # fmt: skip
        try:
            # UDP without DF (a per-namespace default, set only while such a kind runs)
            if kind.without_df:
                tb.sysctl(flow.source, "net.ipv4.ip_no_pmtu_disc", "1")
            try:
                rows = kind.run(ctx)
            finally:
                if kind.without_df:
                    tb.sysctl(flow.source, "net.ipv4.ip_no_pmtu_disc", "0")
            dead = backend.died()
            if dead:  # whatever got through did not go through the IPsec under test
                raise LabError(f"{k.backend} went down during the run: {dead}")
        except Exception as e:  # any failure is this run's: stored, and the campaign goes on
            skip = isinstance(e, Unsupported)  # what only the run could tell (a rekey)
            reason = str(e) if skip else failure_reason(e, tb.logs_since(mark))
            self._store(p, "skipped" if skip else "failed", started, reason=reason,
                        version=version)  # fmt: skip
            return
        self._store(p, "done", started, version=version, rows=rows)

    def _procs(self, tb: Testbed, backend: backends.Backend) -> soak.Procs:
        """The IPsec processes' (CPU s, resident bytes) so far, summed over the nodes —
        on real hosts read there — or None when the backend runs none."""

        def read() -> tuple[float, int] | None:
            if on_hosts(tb):
                got = tb.host_procs(backend.host_pids())
                if not got:
                    return None
                return sum(c for c, _ in got.values()), sum(r for _, r in got.values())
            pids = backend.pids()
            if not pids:
                return None
            return meters.process_cpu_s(pids), meters.rss_bytes(pids)

        return read

    def _searched(self, k: RunKey, field: str) -> Lookup:
        """What this campaign's RFC 2544 searches found (`field`: pdr_mbps or ndr_mbps)
        for the run's backend, configuration, link and flow at a packet size (the median
        over its rfc2544 runs), for a latency workload's loads or a soak's rate; None
        when it has none."""

        def find(size: int) -> tuple[float, str] | None:
            import statistics

            found = [
                float(x[field])
                for r in self.store.runs(self.id)
                if r["status"] == "done"
                and (r["backend"], r["configuration"], r["link"], r["flow"])
                == (k.backend, k.configuration, k.link, k.flow)
                for x in r["results"]
                if x.get("search") and x.get("size") == size and x.get(field)
            ]
            if not found:
                return None
            return statistics.median(found), f"this campaign's rfc2544 ({len(found)} runs)"

        return find

    def _store(
        self,
        p: Planned,
        status: str,
        started: float,
        reason: str | None = None,
        version: str | None = None,
        rows: list[Row] | None = None,
    ) -> None:
        results = [(str(r["label"]), r) for r in rows or []]
        self.store.record(self.id, p.key, status, started, reason, version, results)
        if status == "failed":
            self.failed_keys.add(p.key)
            self.progress.failed += 1
        else:
            self.finished.add(p.key)
        if status == "skipped":
            self.progress.skipped += 1
        self.progress.done += 1
        k = p.key
        name = self.shown.get(k.backend, k.backend)
        what = f"{name} {k.configuration} | {k.link} | {k.workload} {k.flow} #{k.repetition}"
        self.progress.more = ""
        if status == "done":
            mbps = metrics.BY_KEY["mbps"]
            figs = ", ".join(
                f"{r['label']} {mbps.show(r['mbps'])}" for r in rows or [] if "mbps" in r
            )
            busy = max((float(r["other_cpu_before"]) for r in rows or [] if r.get("busy")),
                       default=0.0)  # fmt: skip
            if busy:
                other = metrics.BY_KEY["other_cpu_before"].show(busy)
                figs += f" [busy machine: other processes used {other}]"
            self.progress.last = f"done    {what}: {figs}"
        else:
            first, _, rest = (reason or "").partition("\n")
            self.progress.last = f"{status:7} {what}: {first}"
            self.progress.more = rest.strip("\n") if status == "failed" else ""
        self.on_progress(self.progress)


def _by_link(plan_: list[Planned]) -> Iterator[tuple[Link, list[Planned]]]:
    order: dict[str, list[Planned]] = {}
    links: dict[str, Link] = {}
    for p in plan_:
        order.setdefault(p.link.name, []).append(p)
        links[p.link.name] = p.link
    for name, ps in order.items():
        yield links[name], ps


def _by_backend(plan_: list[Planned]) -> Iterator[tuple[tuple[str, str, int], list[Planned]]]:
    """The runs of each start of a backend: per (backend, configuration, tunnels)."""
    order: dict[tuple[str, str, int], list[Planned]] = {}
    for p in plan_:
        order.setdefault((p.key.backend, p.key.configuration, p.flow.destinations), []).append(p)
    yield from order.items()


# --- the summary --------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]],
              earlier: ceiling.Lookup | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Median and min-max per (backend, configuration, link, flow, measurement) over the
    repetitions, with ratios to the `none` baseline of the same link/flow/measurement.
    A capacity is judged against the testbed's ceiling (`ceiling`): `none`'s figure in
    these runs, or where they have none, what `earlier` finds for the row's testbed key."""
    groups = group_results(runs)
    # Runs that measured nothing, by (backend, configuration, link, flow, workload): the
    # status and reason of each (a failed run's reason is its first line; the full one,
    # with the programs' log tails, is in the run's `reason`).
    unmeasured: dict[tuple[str, str, str, str, str], tuple[str, str]] = {}
    done_keys = {
        (r["backend"], r["configuration"], r["link"], r["flow"], r["workload"])
        for r in runs
        if r["status"] == "done"
    }
    for r in runs:
        k = (r["backend"], r["configuration"], r["link"], r["flow"], r["workload"])
        if r["status"] == "failed" or (r["status"] == "skipped" and k not in done_keys):
            unmeasured.setdefault(k, (r["status"], (r["reason"] or "").split("\n")[0]))
    # The variant a backend ran as (`strongswan (libipsec)`), from its runs' versions.
    shown = {r["backend"]: label(r["backend"], r.get("backend_version")) for r in runs}
    out: list[dict[str, Any]] = []
    capacity: set[int] = set()  # rows whose rate is a capacity
    for key, xs in groups.items():
        row: dict[str, Any] = {
            "backend": key[0], "backend_label": shown.get(key[0], key[0]),
            "configuration": key[1], "link": key[2], "flow": key[3],
            "measurement": key[4], "n": len(xs),
            **metrics.summarise_metrics(xs),
            "testbed_key": ceiling.row_key(xs),
        }  # fmt: skip
        # An application transfer (HTTP, SMTP) is judged by its time, not its rate.
        row["transfer"] = any("file_bytes" in x for x in xs)
        notes = sorted({str(x["cpu_note"]) for x in xs if x.get("cpu_note")})
        busy = [float(x["other_cpu_before"]) for x in xs if x.get("busy")]
        row["busy_runs"] = len(busy)
        if busy:
            notes.insert(0, meters.busy_note(max(busy), len(busy), len(xs)))
        # rows from before placement say nothing of it: unknown, not "not shared"
        shared = sum(1 for x in xs if x.get("dut_shared_cores"))
        known = any("dut_shared_cores" in x for x in xs)
        row["dut_shared_runs"] = shared if known else None
        if shared:
            why = next(str(x.get("shared_why")) for x in xs if x.get("dut_shared_cores"))
            notes.insert(0, f"SHARED CORES in {shared} of {len(xs)} runs: the IPsec under "
                         f"test could run on the traffic's CPUs ({why})")  # fmt: skip
        if counted := next((str(x["wire_counted"]) for x in xs if x.get("wire_counted")), ""):
            notes.append(f"wire counted as {counted}")
        if fragmenting := backends_mtu.fragmenting_note(xs):
            notes.insert(0, fragmenting)
        gens = sorted({str(x["generator"]) for x in xs if x.get("generator")})
        if (offered := row.get("offered_mbps_median")) is not None and row.get(
            "sent_mbps_median"
        ) is not None:
            # a fixed rate: what was asked, sent, delivered and lost, whoever bounded it
            show = metrics.BY_KEY["mbps"].show
            notes.insert(0, f"offered {show(offered)}, sent {show(row['sent_mbps_median'])}, "
                         f"delivered {show(row['mbps_median'])}, loss "
                         f"{metrics.pct(row['loss_pct_median'])}")  # fmt: skip
        if any(x.get("generator_bound") for x in xs):
            sent = max(float(x["mbps"]) for x in xs if x.get("generator_bound"))
            notes.insert(0, f"generator-bound: {'/'.join(gens)} sent at most "
                         f"{metrics.BY_KEY['mbps'].show(sent)} and the path lost none of it; "
                         "the path's own rate is above")  # fmt: skip
        if "held" in xs[0]:
            held = sum(1 for x in xs if x.get("held"))
            growth = row.get("rss_growth_bytes_per_hour_median")
            g = "" if growth is None else f", RSS {growth / 2**20:+.2f} MiB/h"
            late = [x.get("first_failed_interval") for x in xs if not x.get("held")]
            at = f" (first loss beyond it in interval {late[0]})" if late else ""
            notes.insert(0, f"soak held the loss tolerance in {held} of {len(xs)}{at}{g}")
        ts, one_way = row.get("t_s_us_median"), row.get("one_way_up_p50_us_median")
        if ts is not None and one_way is not None:
            notes.insert(0, f"t_S (the gateways' CPU per packet) {ts:.3g} µs beside a one-way "
                         f"delay of {one_way:.3g} µs (p50)")  # fmt: skip
        if gens:
            notes.append(f"generator {'/'.join(gens)}")
        if row["pdr_mbps_median"] is not None:
            ndr, pdr = metrics.BY_KEY["mbps"], metrics.BY_KEY["pdr_mbps"]
            notes.insert(0, f"NDR {ndr.show(row['mbps_median'])}, PDR (<= 0.5 % loss) "
                         f"{pdr.show(row['pdr_mbps_median'])}")  # fmt: skip
        if row["effort_median"] is None and not notes:
            notes = ["no CPU figure: the measurement metered none"]
        row["note"] = "; ".join(notes)
        # a rate the path was asked for its most of (a search, TCP bulk), not a load it
        # was given (fixed-rate UDP, latency's loads, a soak at its NDR)
        if any("ndr_mbps" in x or "retransmits" in x for x in xs) and not any(
            "load_pct" in x or "held" in x for x in xs
        ):
            capacity.add(len(out))
        out.append(row)
    base = {(r["link"], r["flow"], r["measurement"]): r for r in out if r["backend"] == "none"}
    metrics.add_ratios(out, lambda r: base.get((r["link"], r["flow"], r["measurement"])))
    for i, r in enumerate(out):
        if i not in capacity:
            ceiling.testbed_bound(r, None)
            continue
        none = base.get((r["link"], r["flow"], r["measurement"]))
        if none is not None and none.get("mbps_median"):
            ceiling.testbed_bound(r, ceiling.Ceiling(float(none["mbps_median"])))
        elif none is None and earlier and r["testbed_key"] and r["backend"] != "none":
            ceiling.testbed_bound(r, earlier(str(r["testbed_key"]), r["measurement"]))
        else:
            ceiling.testbed_bound(r, None)
    for (bk, cfg, link, flow, wl), (status, reason) in unmeasured.items():
        out.append(
            {"backend": bk, "backend_label": shown.get(bk, bk), "configuration": cfg,
             "link": link, "flow": flow, "measurement": wl, "n": 0, status: reason}
        )  # fmt: skip
    return out


def counts(runs: list[dict[str, Any]], planned: int | None = None) -> dict[str, int]:
    """planned / done / failed / skipped runs of a campaign (planned: the scenario's
    whole plan when given, else the runs stored)."""
    c = {s: sum(1 for r in runs if r["status"] == s) for s in ("done", "failed", "skipped")}
    return {"planned": planned if planned is not None else len(runs), **c}
