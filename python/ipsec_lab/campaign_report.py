"""The report of any lab campaign (one that `ipsec-lab run` made from the user's own
scenario): the same plain-data `Analysis` the studies produce, so `report` draws it the
same way — throughput and CPU effort per backend x configuration x link with min-max
bars, each as a ratio to `none`, wire bytes per payload byte, CPU load over time, and the
summary table with failed and skipped runs and their reasons."""

from __future__ import annotations

import math
import shlex
import statistics
from pathlib import Path
from typing import Any

from ipsec_lab import backends, ceiling, metrics, runner
from ipsec_lab.studies import Analysis, Plot, Table, fmt

TERMS = (
    "x none: the figure divided by plain forwarding's (backend none) on the same link, flow "
    "and measurement. Effort: the whole machine's busy CPU time per kB (1024 B) of payload "
    "delivered, in µs — traffic ends, kernel forwarding and IPsec together. IPsec µs/kB: "
    "the IPsec processes' own CPU time per kB (user-space backends: ours, strongSwan with "
    "libipsec; none for the kernel's ESP). Medians over repetitions; min-max bars."
)


def _label(r: dict[str, Any]) -> str:
    b = r.get("backend_label") or r["backend"]
    return b if r["backend"] == "none" else f"{b} {r['configuration']}"


def footnoted(rows: list[list[Any]]) -> tuple[list[list[Any]], list[str]]:
    """Rows whose last cell (the note, parts joined by "; ") is replaced by the numbers of
    its parts, and the distinct parts in order: a note shared by many rows (BUSY) is
    written once under the table instead of making each row tall."""
    notes: list[str] = []
    out = []
    for row in rows:
        text = str(row[-1] or "")
        if text.startswith(("FAILED: ", "skipped: ")):
            out.append(row)  # the reason is the row's content
            continue
        refs = []
        for part in (x.strip() for x in text.split("; ") if x.strip()):
            if part not in notes:
                notes.append(part)
            refs.append(f"[{notes.index(part) + 1}]")
        out.append([*row[:-1], " ".join(refs)])
    return out, notes


def analyse(
    cid: int, name: str, runs: list[dict[str, Any]], scenario_path: str = "",
    lab_dir: Path | None = None, earlier: ceiling.Lookup | None = None,
    environment: dict[str, Any] | None = None,
) -> Analysis:  # fmt: skip
    """One campaign's analysis: tables and plots, no findings (there is no paper)."""
    an = Analysis(f"campaign-{cid}", f"Campaign {cid} — {name}", f"ipsec-lab run campaign {cid}")
    an.campaigns = {"campaign": cid}
    an.terms = TERMS
    where = f" --lab {shlex.quote(str(lab_dir))}" if lab_dir else ""
    if scenario_path:
        an.rerun = f"ipsec-lab run {shlex.quote(scenario_path)} --resume{where}"
    summary = runner.summarize(runs, earlier)
    measured = [r for r in summary if r.get("n")]
    c = runner.counts(runs)
    rows: list[list[Any]] = []
    for r in summary:
        head = [r.get("backend_label") or r["backend"], r["configuration"], r["link"],
                r["flow"], r["measurement"]]  # fmt: skip
        if not r.get("n"):
            why = r.get("failed") or r.get("skipped") or ""
            rows.append([*head, 0, *[""] * len(metrics.COLUMNS),
                         "FAILED: " + why if r.get("failed") else "skipped: " + why])  # fmt: skip
            continue
        rows.append([*head, r["n"], *metrics.cells(r), r.get("note", "")])
    rows, notes = footnoted(rows)
    an.tables.append(Table(
        f"Campaign {cid}: {c['done']} runs done, {c['failed']} failed, {c['skipped']} skipped",
        ["backend", "configuration", "link", "flow", "measurement", "n",
         *(col.header for col in metrics.COLUMNS), "note"],
        rows,
        note=metrics.SUMMARY_CAPTION + "; a BUSY note: other processes used the CPU just "
        "before those runs, so their CPU figures include that work"
        + (". Notes: " + " ".join(f"[{i}] {n}." for i, n in enumerate(notes, 1)) if notes
           else ""),
    ))  # fmt: skip
    for r in runs:
        if r["status"] == "failed":
            an.failures.append(
                f"campaign {cid}: {r['backend']} {r['configuration']} on {r['link']} "
                f"{r['workload']} #{r['repetition']} failed — {(r['reason'] or '').splitlines()[0]}"
            )
    an.tables += peers(summary, runs, environment or {})
    # latency and soak rows have plots of their own (below): their rate is a background's
    probed = {r["measurement"] for r in measured if r.get("rtt_p50_us_median") is not None}
    _tunnel_axis(an, measured, cid)
    one = [r for r in measured if (r.get("tunnels") or 1) == 1]  # the axis has its own
    for meas in sorted({r["measurement"] for r in one} - probed):
        of = [r for r in one if r["measurement"] == meas]
        links = sorted({r["link"] for r in of})
        series = sorted({_label(r) for r in of}, key=lambda s: (s != "none", s))
        for key, what, unit, log in (
            ("mbps", "Throughput", "payload Mbit/s (median; bars: min-max)", True),
            ("effort", "CPU effort", "µs per kB of payload (median)", True),
        ):
            vals: dict[str, list[float | None]] = {s: [] for s in series}
            errs: dict[str, list[tuple[float, float] | None]] = {s: [] for s in series}
            for link in links:
                for s in series:
                    hit = [r for r in of if r["link"] == link and _label(r) == s]
                    v = hit[0][f"{key}_median"] if hit else None
                    vals[s].append(v)
                    errs[s].append(
                        (hit[0]["mbps_min"], hit[0]["mbps_max"]) if hit and key == "mbps" else None
                    )
            present = [float(v) for vs in vals.values() for v in vs if v is not None]
            if not present:
                continue
            # Figures 10x apart (13,077 and 9.6 Mbit/s on two links) on one linear axis
            # leave the small ones no visible bar: a log axis, labelled, shows them all.
            log = log and min(present) > 0 and max(present) / min(present) > 10
            an.plots.append(Plot(
                "bars", f"{what}, {meas}: backends and configurations per link", "link",
                unit + (" — log scale" if log else ""),
                links, vals, logy=log, errors=errs if key == "mbps" else {},
                note=f"campaign {cid}"
                + ("; log scale: each labelled gridline 10x the one below" if log else "")
                + "; a missing bar: not measured (see the table)",
            ))  # fmt: skip
        wire: dict[str, list[float | None]] = {
            s: [next((r["wire_pct_of_payload"] for r in of
                      if r["link"] == link and _label(r) == s), None) for link in links]
            for s in series
        }  # fmt: skip
        if any(v is not None for vs in wire.values() for v in vs):
            an.plots.append(Plot(
                "bars", f"Wire bytes per payload byte, {meas}", "link", "% of payload",
                links, wire, hlines={"payload (100 %)": 100.0},
                note="both directions on the measured wire, headers included",
            ))  # fmt: skip
    # CPU load over time: the first repetition of each (backend, configuration) on the
    # first link, first measurement.
    done = [r for r in runs if r["status"] == "done" and r["results"]]
    seen: set[str] = set()
    for r in done:
        lab = _label(r)
        series_ = r["results"][0].get("cpu_series") or []
        if lab in seen or len(series_) < 2:
            continue
        seen.add(lab)
        an.plots.append(Plot(
            "area", f"CPU load over time, {lab} ({r['link']}, {r['results'][0]['label']})",
            "time into the measurement (s)", "share of all CPUs' time (%)",
            lines={k: ([x["t"] for x in series_], [x[k] for x in series_])
                   for k in ("user", "system", "softirq")},
            note=f"{len(series_)} samples of /proc/stat, the whole machine",
        ))  # fmt: skip
    _latency_plots(an, runs, cid)
    _soak_plots(an, runs, cid)
    ipsec = [r for r in measured if r.get("ipsec_effort_median")]
    if ipsec:
        # plan --campaign needs one (backend, configuration): name the first one's, so the
        # command runs as given (the others alike, with their names).
        pairs = sorted({(r["backend"], r["configuration"]) for r in ipsec})
        b, cfg = pairs[0]
        more = " (and likewise for the others)" if len(pairs) > 1 else ""
        an.cause = (
            "The IPsec processes spent a median "
            f"{fmt(statistics.median(r['ipsec_effort_median'] for r in ipsec))} µs per kB of "
            f"payload over this campaign's configurations; `ipsec-lab plan --campaign {cid} "
            f"--backend {b} --configuration {cfg}{where}` turns that into cores per link "
            f"rate{more}."
        )
    return an


def _tunnel_axis(an: Analysis, measured: list[dict[str, Any]], cid: int) -> None:
    """A campaign of several tunnel counts (the scenario's `tunnels`): per measurement,
    each backend's rate against the count (bars), and a table of the rate, its ratio to
    the backend's own at one tunnel, the set-up time and the memory per tunnel."""
    counts = sorted({int(r.get("tunnels") or 1) for r in measured})
    if len(counts) < 2:
        return
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in measured:
        base = str(r["flow"]).split(" over ", 1)[0]
        k = (r["measurement"], f"{_label(r)} ({r['link']}, {base})")
        by.setdefault(k, {})[int(r.get("tunnels") or 1)] = r
    rows: list[list[Any]] = []
    for meas in sorted({k[0] for k in by}):
        series: dict[str, list[float | None]] = {}
        for (m, name), at in sorted(by.items()):
            if m != meas:
                continue
            series[name] = [at[n]["mbps_median"] if n in at else None for n in counts]
            one = at.get(1)
            for n in sorted(at):
                r = at[n]
                ratio = (r["mbps_median"] / one["mbps_median"]
                         if one and one.get("mbps_median") and r.get("mbps_median") is not None
                         else None)  # fmt: skip
                rss, rss1 = (
                    r.get("ipsec_rss_at_start_median"),
                    (one or {}).get("ipsec_rss_at_start_median"),
                )
                per = (rss - rss1) / (n - 1) if rss and rss1 and n > 1 else None
                rows.append([meas, name, n, fmt(r.get("mbps_median")), fmt(ratio),
                             fmt(r.get("setup_s_median")),
                             fmt(r.get("tunnels_per_s_median")),
                             fmt(r.get("ike_retransmits_max")),
                             fmt(rss / 2**20) if rss else "—",
                             fmt(per / 1024) if per is not None else "—",
                             r.get("note", "")])  # fmt: skip
        if any(v is not None for vs in series.values() for v in vs):
            an.plots.append(Plot(
                "bars", f"Rate against tunnel count, {meas}", "tunnels",
                "payload Mbit/s (median)", [str(n) for n in counts], series,
                note=f"campaign {cid}; the flow spread over all the tunnels; a missing bar: "
                "not measured (see the table)",
            ))  # fmt: skip
    an.tables.append(Table(
        f"Campaign {cid}: the rate against the tunnel count",
        ["measurement", "backend (link, flow)", "tunnels", "Mbit/s", "x 1 tunnel",
         "set-up s", "IKE tunnels/s", "IKE retransmits", "IPsec MiB", "KiB per tunnel",
         "note"],
        rows,
        note="Mbit/s: the measurement's rate (an RFC 2544 search: its NDR), median; x 1 "
        "tunnel: over the same backend's at one tunnel; set-up: the backend's start with "
        "its tunnels, to its own 'up'; IKE tunnels/s: an IKE daemon's N tunnels over the "
        "time from loading the initiator's configuration to all established (`ike_sas` "
        "says how), with the retransmits its logs counted (most of the repetitions); "
        "IPsec MiB: its processes' resident memory once up "
        "(both gateways); KiB per tunnel: that memory's growth over one tunnel's, per "
        "tunnel added",
    ))  # fmt: skip


NINES = (50.0, 90.0, 99.0, 99.9, 99.99)


def _latency_plots(an: Analysis, runs: list[dict[str, Any]], cid: int) -> None:
    """Latency against load per backend (p50 and p99 RTT; FD.io CSIT's latency plots),
    and the RTT distribution at the highest load, percentile by percentile (from each
    row's histogram), per link and latency workload."""
    from ipsec_lab.traffic.latency import histogram_percentile

    by: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    for r in runs:
        if r["status"] != "done":
            continue
        for x in r["results"]:
            if x.get("load_pct") is None or x.get("rtt_p99_us") is None:
                continue
            by.setdefault((r["link"], r["workload"]), {}).setdefault(_label(r), []).append(x)
    for (link, wl), series in sorted(by.items()):
        lines: dict[str, tuple[list[float], list[float]]] = {}
        for name, xs in sorted(series.items(), key=lambda kv: (kv[0] != "none", kv[0])):
            loads = sorted({float(x["load_pct"]) for x in xs})
            for p in ("p50", "p99"):
                ys = [statistics.median(float(x[f"rtt_{p}_us"]) for x in xs
                                        if float(x["load_pct"]) == ld) for ld in loads]  # fmt: skip
                lines[f"{name} {p}"] = (loads, ys)
        an.plots.append(Plot(
            "lines", f"Latency under load, {wl} ({link}): RTT against load", "load (% of PDR)",
            "probe RTT (µs)", lines=lines, logy=True,
            note=f"campaign {cid}; irtt probes beside the background, median over "
            "repetitions; log scale",
        ))  # fmt: skip
        dist: dict[str, tuple[list[float], list[float]]] = {}
        top = max(float(x["load_pct"]) for xs in series.values() for x in xs)
        for name, xs in series.items():
            hit = [x for x in xs if float(x["load_pct"]) == top and x.get("histogram")]
            if not hit:
                continue
            h = hit[0]["histogram"]
            nines = [-math.log10(1 - q / 100) for q in NINES]
            dist[name] = (nines, [histogram_percentile(h, q) / 1e3 for q in NINES])
        if dist:
            an.plots.append(Plot(
                "lines", f"RTT distribution at {top:g} % load, {wl} ({link})",
                "percentile (1 = p90, 2 = p99, 3 = p99.9, 4 = p99.99; 0.3 = p50)",
                "probe RTT (µs)", lines=dist, logy=True,
                note=f"campaign {cid}; from each backend's stored histogram (log buckets "
                "1 % wide), first repetition",
            ))  # fmt: skip


def _soak_plots(an: Analysis, runs: list[dict[str, Any]], cid: int) -> None:
    """Each soak's time series: delivered rate, loss per interval against the
    tolerance, and the IPsec processes' resident memory."""
    # a soak's row by its verdict's tolerance: a rekey row has a `series` of its own
    # (one entry a rekey, no delivered rate), which this plot crashed on
    soaks = [(r, x) for r in runs if r["status"] == "done" for x in r["results"]
             if x.get("series") and "loss_tolerance_pct" in x]  # fmt: skip
    if not soaks:
        return
    rate: dict[str, tuple[list[float], list[float]]] = {}
    loss: dict[str, tuple[list[float], list[float]]] = {}
    rss: dict[str, tuple[list[float], list[float]]] = {}
    tolerance, offered = 0.0, 0.0
    for r, x in soaks:
        offered = max(offered, float(x.get("offered_mbps") or 0))
        name = f"{_label(r)} ({r['link']}, #{r['repetition']})"
        t = [float(s["t_s"]) / 60 for s in x["series"]]
        rate[name] = (t, [float(s["mbps"]) for s in x["series"]])
        loss[name] = (t, [float(s["loss_pct"]) for s in x["series"]])
        mem = [(tt, float(s["ipsec_rss_bytes"]) / 2**20) for tt, s in zip(t, x["series"])
               if s.get("ipsec_rss_bytes") is not None]  # fmt: skip
        if mem:
            rss[name] = ([m[0] for m in mem], [m[1] for m in mem])
        tolerance = max(tolerance, float(x.get("loss_tolerance_pct") or 0))
    an.plots.append(Plot("lines", "Soak: delivered rate per interval", "time (min)",
                         "Mbit/s", lines=rate, hlines={f"offered ({offered:.4g})": offered},
                         note=f"campaign {cid}"))  # fmt: skip
    an.plots.append(Plot(
        "lines", "Soak: loss per interval", "time (min)", "% of the interval's packets",
        lines=loss, hlines={f"tolerance ({tolerance:g} %)": tolerance},
        note=f"campaign {cid}; traffic in flight across an interval's edge is not loss",
    ))  # fmt: skip
    if rss:
        an.plots.append(Plot(
            "lines", "Soak: the IPsec processes' resident memory", "time (min)", "MiB",
            lines=rss, note=f"campaign {cid}; a leak shows as a steady climb",
        ))  # fmt: skip


# a rate that is the lab's, not the tunnel's (the summary's notes say why)
BOUND = ("generator-bound", "testbed-bound")
GIB_PER_KB = 2**30 / 1024  # kB (1024 B) in a GiB: µs/kB x this / 1e6 = CPU s per GiB


def where_ran(env: dict[str, Any]) -> str:
    """Where a campaign's runs ran, for the peers view: real hosts (each one's kernel),
    this machine's kernel, or the micro-VM (whose figures under TCG are for correctness,
    not speed)."""
    hosts = env.get("hosts")
    if isinstance(hosts, dict) and hosts:
        kernels = {str(h.get("kernel", "?")) for h in hosts.values() if isinstance(h, dict)}
        return "real hosts, Linux " + ", ".join(sorted(kernels))
    vm = env.get("vm")
    if vm:
        emulated = str(vm).startswith("tcg")
        return f"VM ({vm})" + ("; emulated: not a speed figure" if emulated else "")
    return f"host, Linux {env.get('kernel') or '?'}"


def peers(
    summary: list[dict[str, Any]], runs: list[dict[str, Any]], env: dict[str, Any]
) -> list[Table]:
    """The peers view (issue: IPsec or WireGuard?): where a campaign measured two tunnels
    or more, each backend and configuration on one row — every measurement's figure side
    by side (a rate with its ratio to `none`; a latency row's RTT p50 / p99), the CPU
    seconds per GiB of payload the machine and the tunnel's own processes spent in the
    first bulk measurement, its version and where it ran. One table per link and flow."""
    measured = [r for r in summary if r.get("n")]
    if len({r["backend"] for r in measured if r["backend"] != "none"}) < 2:
        return []
    versions = {r["backend"]: r.get("backend_version") or "" for r in runs
                if r["status"] == "done"}  # fmt: skip
    place = where_ran(env)
    tables = []
    for link, flow in sorted({(r["link"], r["flow"]) for r in measured}):
        of = [r for r in measured if r["link"] == link and r["flow"] == flow]
        meas = list(dict.fromkeys(r["measurement"] for r in of))
        probed = {r["measurement"] for r in of if r.get("rtt_p50_us_median") is not None}
        bulk = next((m for m in meas if m not in probed), None)
        keys = list(dict.fromkeys((r["backend"], r["configuration"]) for r in of))
        keys.sort(key=lambda k: k[0] != "none")
        rows = []
        for b, cfg in keys:
            mine = {
                r["measurement"]: r for r in of if (r["backend"], r["configuration"]) == (b, cfg)
            }
            cells: list[Any] = [next(iter(mine.values())).get("backend_label") or b, cfg]
            for m in meas:
                r = mine.get(m)
                if r is None:
                    cells.append("—")
                elif m in probed:
                    cells.append(f"{metrics._rtt(r)} µs")
                else:
                    vs = metrics._vs(r)  # a transfer's time against none's time
                    bound = [b for b in BOUND if b in str(r.get("note") or "")]
                    cells.append(metrics._main(r) + (f" ({vs}x)" if vs != "—" else "")
                                 + "".join(f", {b}" for b in bound))  # fmt: skip
            r = mine.get(bulk or "")
            effort = r.get("effort_median") if r else None
            own = r.get("ipsec_effort_median") if r else None
            cells.append(fmt(effort * GIB_PER_KB / 1e6) if effort else "—")
            kernel = b in backends.BY_NAME and backends.BY_NAME[b].kernel_plane
            cells.append(fmt(own * GIB_PER_KB / 1e6) if own else
                         "the kernel's" if kernel else "—")  # fmt: skip
            cells += [versions.get(b) or "—", place]
            rows.append(cells)
        tables.append(Table(
            f"Peers side by side ({link}, {flow})",
            ["backend", "configuration", *meas,
             f"CPU s/GiB{f' ({bulk})' if bulk else ''}", "tunnel's own s/GiB", "version",
             "ran on"],
            rows,
            note="Each measurement's median: a rate (Mbit/s of payload, ratio to none; "
            "generator- or testbed-bound: the lab's ceiling, not the tunnel's), "
            "a latency row's probe RTT p50 / p99. CPU s/GiB: the whole machine's busy CPU "
            "seconds per GiB of payload in the first bulk measurement (traffic ends, "
            "forwarding and the tunnel); the tunnel's own: its processes' alone (the "
            "kernel's work — xfrm, the kernel's WireGuard — is not a process's: see the "
            "machine's). Figures from a VM under TCG are for correctness, not speed.",
        ))  # fmt: skip
    return tables
