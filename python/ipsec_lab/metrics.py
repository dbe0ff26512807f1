"""Every figure a lab run records, declared once: its key in a measurement's row, unit,
label, what it means, how it aggregates over repetitions, and how it prints.

The runner's summary (`runner.summarize`), the `results` table and the live summary
(`cli.output.summary_table`), the CSV export and the campaign report
(`campaign_report.analyse`) all loop over these declarations. A new metric is one
`Metric` here (and the meter that fills its row field); `docs/lab.md` lists them and a
test checks it agrees.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]

STATS = ("median", "min", "max", "cv")


def _cv(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    m = statistics.mean(xs)
    return statistics.stdev(xs) / m if m else None


_AGGREGATE: dict[str, Callable[[list[float]], float | None]] = {
    "median": statistics.median, "min": min, "max": max, "cv": _cv,
}  # fmt: skip


def _field(key: str, *, zero_is_none: bool = False) -> Callable[[Row], float | None]:
    def get(x: Row) -> float | None:
        v = x.get(key)
        if v is None or (zero_is_none and not v):
            return None
        return float(v)

    return get


def _wire_pct(x: Row) -> float | None:
    """Wire bytes (both ways, on the measured wire end) per payload byte, in %."""
    if not x.get("payload_bytes") or x.get("wire_up_bytes") is None:
        return None
    wire = float(x.get("wire_up_bytes") or 0) + float(x.get("wire_down_bytes") or 0)
    return 100 * wire / float(x["payload_bytes"])


# --- how a figure prints -----------------------------------------------------------------


def rate(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def num(v: float | None, spec: str = ".3g") -> str:
    return "—" if v is None else format(v, spec)


def secs(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"


def pct(v: float | None, scale: float = 1.0) -> str:
    return "—" if v is None else f"{scale * v:.1f} %"


@dataclass(frozen=True)
class Metric:
    """One figure of a measurement."""

    key: str  # the field of a measurement's row (what meters and workloads write)
    unit: str
    doc: str
    # The summary's keys, by statistic over the repetitions ("median", "min", "max",
    # "cv"); none: the metric is recorded, not summarised.
    summary: dict[str, str] = field(default_factory=dict)
    # The summary's key of the median's ratio to backend `none`'s on the same link, flow
    # and measurement; None: no ratio.
    vs_none: str | None = None
    csv: bool = True  # a column of `results --csv`
    # How to read it from a row (default: the field, None when absent).
    value: Callable[[Row], float | None] | None = None
    # How one value prints without its unit (default: 3 significant digits).
    number: Callable[[float | None], str] = num

    def read(self, x: Row) -> float | None:
        return (self.value or _field(self.key))(x)

    def show(self, v: float | None) -> str:
        """One value with its unit, as the live progress line and notes print it."""
        return f"{self.number(v)} {self.unit}" if v is not None else self.number(v)

    def aggregate(self, xs: list[Row], into: Row) -> None:
        """Set this metric's summary keys in `into` from the repetitions `xs`."""
        if not self.summary:
            return  # recorded, not summarised (and not always a number: wire_counted)
        vals = [v for v in (self.read(x) for x in xs) if v is not None]
        for stat, key in self.summary.items():
            into[key] = _AGGREGATE[stat](vals) if vals else None


def _keys(prefix: str, *stats: str) -> dict[str, str]:
    return {s: f"{prefix}_{s}" for s in stats}


METRICS: tuple[Metric, ...] = (
    Metric("mbps", "Mbit/s", "payload delivered per second (an RFC 2544 search: its NDR)",
           summary=_keys("mbps", *STATS), vs_none="mbps_vs_none", number=rate),
    Metric("seconds", "s", "how long the measurement ran (an HTTP/SMTP transfer: its time)",
           summary=_keys("seconds", "median"), vs_none="seconds_vs_none"),
    Metric("payload_bytes", "B", "payload bytes delivered"),
    Metric("effort_us_per_kb", "µs/kB",
           "busy CPU time of the whole machine per kB (1024 B) of payload delivered "
           "(netperf's service demand)",
           summary={"median": "effort_median", "cv": "effort_cv"}, vs_none="effort_vs_none"),
    Metric("ipsec_effort_us_per_kb", "µs/kB",
           "CPU time of the IPsec processes alone per kB of payload",
           summary={"median": "ipsec_effort_median"},
           value=_field("ipsec_effort_us_per_kb", zero_is_none=True)),
    Metric("ipsec_cpu_wait_s", "s",
           "time the IPsec processes' threads were runnable but waiting for a CPU (the "
           "scheduler's run delay, summed over threads): a packet for a thread waits too, "
           "so a large figure says the latency is the CPU's, not the queues'"),
    Metric("cpu_load", "share", "busy share of all CPUs over the measurement"),
    Metric("loss_pct", "%", "packets lost (UDP and RFC 2544 workloads)",
           summary={"median": "loss_pct_median"}),
    Metric("offered_mbps", "Mbit/s", "fixed-rate UDP and IMIX: the rate asked of the generator",
           summary={"median": "offered_mbps_median"}, number=rate),
    Metric("sent_mbps", "Mbit/s", "fixed-rate UDP and IMIX: the rate the generator sent",
           summary={"median": "sent_mbps_median"}, number=rate),
    Metric("generator_bound", "",
           "the generator sent less than asked and the path lost none of it: the figure is "
           "the generator's, the path's own rate is above"),
    *(Metric(f"wire_{way}_{what}", unit,
             f"{what} on the flow's outer link, {'source → sink' if way == 'up' else 'back'}",
             summary=_keys(f"wire_{way}_{what}", "median"))
      for way in ("up", "down") for what, unit in (("bytes", "B"), ("packets", "packets"))),
    Metric("wire_counted", "",
           "how the wire was counted where its counters saw GSO buffers (over the link's "
           "frame): as the segments they leave as (TCP, an estimate), or only marked"),
    Metric("wire_pct_of_payload", "%", "wire bytes (both ways) per payload byte",
           summary={"median": "wire_pct_of_payload"}, csv=False, value=_wire_pct),
    Metric("retransmits", "segments", "TCP retransmissions (iperf3's count)",
           summary=_keys("retransmits", "median"), csv=False),
    Metric("pdr_mbps", "Mbit/s", "RFC 2544 search: the partial drop rate (<= 0.5 % loss)",
           summary=_keys("pdr_mbps", "median"), csv=False, number=rate),
    Metric("other_cpu_before", "CPUs",
           "CPUs' worth other processes used just before the run (a busy machine)",
           number=lambda v: num(v, ".2f")),
    Metric("busy", "", "whether that was more than the busy threshold (0.25 CPUs)"),
    Metric("dut_shared_cores", "",
           "whether the IPsec under test could run on the traffic's CPUs (placement off "
           "or overlapping; the row's placement, traffic_cpus and dut_cpus say where)"),
    Metric("aqm", "", "ours: whether its gateways ran CoDel on their receive queues "
           "(`[gateway] aqm`)"),
    Metric("tun_queue", "packets", "ours: its gateways' TUN device queue: 500 packets by default, "
           "a fixed count, or `auto` (16 packets while TCP super-packets bring most bytes, "
           "else 500) (`[gateway] tun_queue`)"),
    Metric("link_mtu", "B", "the MTU of the flow's outer link, as the run found it"),
    Metric("inner_mtu", "B", "the inner MTU the tunnel offers its hosts (ours: its TUN's)"),
    Metric("largest_whole_inner", "B",
           "the largest inner packet whose protected form fits the link whole (larger: "
           "fragmented, or refused with DF)"),
    Metric("testbed_key", "",
           "what sets plain forwarding's figure here, hashed (machine or hosts, topology, "
           "link, flow, workload, generator, placement, outer MTU): a `none` run of the same "
           "key is this row's testbed ceiling, in a later campaign too"),
    # latency under load and soak (irtt probes; µs)
    Metric("load_pct", "%", "latency: the background load, in % of the PDR"),
    *(Metric(f"rtt_{p}_us", "µs", f"probe round-trip time, {what} (latency, soak)",
             summary={"median": f"rtt_{p}_us_median"}, vs_none=f"rtt_{p}_us_vs_none")
      for p, what in (("p50", "median"), ("p99", "99th percentile"),
                      ("p99_9", "99.9th percentile"))),
    Metric("rtt_max_us", "µs", "probe round-trip time, the largest",
           summary={"median": "rtt_max_us_median"}),
    Metric("one_way_up_p50_us", "µs", "one-way delay source → sink, median (one clock only)",
           summary={"median": "one_way_up_p50_us_median"}),
    Metric("one_way_down_p50_us", "µs", "one-way delay sink → source, median (one clock only)",
           summary={"median": "one_way_down_p50_us_median"}),
    Metric("jitter_us", "µs", "mean change of RTT between successive probes",
           summary={"median": "jitter_us_median"}),
    Metric("t_s_us", "µs",
           "latency (ours): the gateways' CPU time per packet while probed — the model's "
           "t_S at that load, beside the one-way delay", summary={"median": "t_s_us_median"}),
    Metric("probe_loss_pct", "%", "probes that got no answer",
           summary={"median": "probe_loss_pct_median"}),
    Metric("held", "", "soak: loss within the tolerance in every interval"),
    Metric("first_failed_interval", "", "soak: the first interval whose loss was beyond it"),
    Metric("rss_growth_bytes_per_hour", "B/h",
           "soak: the IPsec processes' resident memory growth (least squares over intervals)",
           summary={"median": "rss_growth_bytes_per_hour_median"}),
    Metric("rekeys", "", "rekey: the rollovers of every SA during the run, one an interval"),
    Metric("blocked_ms_per_rekey", "ms",
           "rekey: the packets the rekey stream lost (exact) / the offered packet rate "
           "(FD.io CSIT's effective blocked time) / the rekeys; resolved to one packet's "
           "time (blocked_resolution_ms)", summary={"median": "blocked_ms_per_rekey_median"}),
    Metric("blocked_ms_per_rekey_excess", "ms", "rekey: the same beyond the loss of a control "
           "stream with no rekey (at its loss rate): the rekeys' own",
           summary={"median": "blocked_ms_per_rekey_excess_median"}),
    Metric("rekey_seconds_median", "s", "rekey: one rollover, from its first reload to every "
           "gateway's workers holding its last step, median",
           summary={"median": "rekey_seconds_median"}),
    Metric("tunnels", "", "tunnels between the gateways, the flow spread over them "
           "(the scenario's `tunnels`)", summary={"median": "tunnels"}),
    Metric("setup_s", "s", "the backend's start with its tunnels, to its own 'up' (the "
           "lab's writing of its configs included)",
           summary={"median": "setup_s_median"}),
    Metric("ipsec_rss_bytes_at_start", "B",
           "the IPsec processes' resident memory once up, its tunnels set up",
           summary={"median": "ipsec_rss_at_start_median"}),
    Metric("ike_sas", "", "an IKE daemon's N tunnels: CHILD_SAs under `one` IKE_SA or an "
           "IKE_SA each (`per-tunnel`; the scenario's `[gateway] ike_sas`)"),
    Metric("ike_setup_s", "s", "an IKE daemon's N tunnels (N > 1): from loading the "
           "initiator's configuration to every CHILD_SA established on both gateways",
           summary={"median": "ike_setup_s_median"}),
    Metric("tunnels_per_s", "/s", "an IKE daemon's set-up rate: N tunnels / ike_setup_s",
           summary={"median": "tunnels_per_s_median"}),
    Metric("ike_retransmits", "", "IKE requests the daemons retransmitted while setting "
           "the N tunnels up (their logs)", summary={"max": "ike_retransmits_max"}),
    Metric("ike_cpu_s", "s", "the IKE daemons' CPU time over the N tunnels' set-up, both "
           "gateways", summary={"median": "ike_cpu_s_median"}),
)  # fmt: skip

BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}

# The identity of a result in `results --csv`, then each metric's field.
CSV_IDENTITY = (
    "campaign_id", "run_id", "backend", "backend_version", "configuration", "link",
    "workload", "flow", "repetition", "status", "reason", "label", "generator",
)  # fmt: skip
CSV_FIELDS: tuple[str, ...] = CSV_IDENTITY + tuple(m.key for m in METRICS if m.csv)


def summarise_metrics(xs: list[Row]) -> Row:
    """Every metric's summary keys over the repetitions `xs`."""
    out: Row = {}
    for m in METRICS:
        m.aggregate(xs, out)
    return out


def add_ratios(rows: list[Row], base_of: Callable[[Row], Row | None]) -> None:
    """Each metric's ratio to backend `none`'s median (`base_of(row)`: none's row on the
    same link, flow and measurement, or None)."""
    for r in rows:
        b = base_of(r)
        for m in METRICS:
            if m.vs_none is None:
                continue
            med = m.summary["median"]
            ok = b is not None and b.get(med) and r.get(med) is not None
            r[m.vs_none] = r[med] / b[med] if ok and b is not None else None


# --- how the summary prints ---------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A column of the summary (the `results` table and the campaign report)."""

    header: str
    cell: Callable[[Row], str]


def _main(r: Row) -> str:
    if r.get("transfer"):
        return secs(r["seconds_median"])
    return BY_KEY["mbps"].show(r["mbps_median"])


def _rtt(r: Row) -> str:
    """A latency or soak row's probes: RTT median / 99th percentile."""
    p50, p99 = r.get("rtt_p50_us_median"), r.get("rtt_p99_us_median")
    if p50 is None:
        return "—"
    return f"{num(p50)} / {num(p99)}"


def _range(r: Row) -> str:
    span = f"{rate(r['mbps_min'])}-{rate(r['mbps_max'])}"
    return span + " Mbit/s" if r.get("transfer") else span


def _vs(r: Row) -> str:
    return num(r["seconds_vs_none"] if r.get("transfer") else r["mbps_vs_none"], ".2f")


# What the summary shows of each measured row, in order (the identity columns and the
# note go around them). Rate and time share a column: an HTTP/SMTP transfer is judged
# by its time, a stream by its rate.
COLUMNS: tuple[Column, ...] = (
    Column("rate / time", _main),
    Column("min-max", _range),
    Column("CV", lambda r: pct(r.get("mbps_cv"), 100)),
    Column("rate x none", _vs),
    Column("loss", lambda r: pct(r.get("loss_pct_median"))),
    Column("effort µs/kB", lambda r: num(r["effort_median"])),
    Column("effort x none", lambda r: num(r["effort_vs_none"], ".2f")),
    Column("IPsec µs/kB", lambda r: num(r["ipsec_effort_median"])),
    Column("wire %", lambda r: pct(r.get("wire_pct_of_payload"))),
    Column("retrans", lambda r: num(r.get("retransmits_median"), ".0f")),
    Column("RTT µs p50/p99", _rtt),
)
SUMMARY_CAPTION = (
    "rate: Mbit/s of payload, or transfer time for HTTP/SMTP; CV: over repetitions; "
    "x none: ratio to no IPsec; loss: packets lost (UDP), median; effort: machine-wide "
    "CPU µs per kB of payload; IPsec "
    "µs/kB: the IPsec processes' alone; wire %: wire bytes (both ways) per payload byte; "
    "RTT: latency probes, median / 99th percentile"
)


def cells(r: Row) -> list[str]:
    """The COLUMNS' cells of one summary row."""
    return [c.cell(r) for c in COLUMNS]


def markdown() -> str:
    """The metric table of docs/lab.md (`python -m ipsec_lab.metrics` prints it)."""
    lines = ["| field | unit | what it is | summary |", "|---|---|---|---|"]
    for m in METRICS:
        summ = ", ".join(f"`{k}`" for k in m.summary.values())
        if m.vs_none:
            summ += f", `{m.vs_none}`"
        lines.append(f"| `{m.key}` | {m.unit} | {m.doc} | {summ} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
