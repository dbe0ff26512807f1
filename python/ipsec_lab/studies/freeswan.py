"""Study 3: the FreeS/WAN project's performance notes (~2002).

NAI's measurement in Pentium II cycles per byte — the IP stack alone 5, IPsec without
crypto 11, with HMAC-SHA-1 24, with 3DES + authentication ~140 (3DES adds ~116) — and the
rule of thumb drawn from it: MHz needed ~ 25 x link Mbit/s. Here: the same rows measured
through our gateways, cycles from CPU time x this CPU's clock, and the MHz table redone.
"""

from __future__ import annotations

from typing import Any

from ipsec_lab.model.plan import FREESWAN_CYCLES_PER_BYTE, FREESWAN_MHZ_PER_MBPS, LINKS
from ipsec_lab.store import group_results
from ipsec_lab.studies import (
    Analysis,
    Finding,
    Plot,
    Table,
    backends_toml,
    claim_verdict,
    fmt,
    median,
    ratio_verdict,
)  # fmt: skip

NAME = "freeswan"
TITLE = "Study 3 — FreeS/WAN performance notes: cycles per byte and the MHz rule (~2002)"
SOURCE = (
    "FreeS/WAN documentation, 'Performance of FreeS/WAN' (~2002): NAI's Pentium II "
    "cycles-per-byte figures and the rule 'MHz needed ~ 25 x link Mbit/s'"
)

# Published cycles per byte (Pentium II) and the rule: with the planner's (model.plan).
CYCLES_PER_BYTE = FREESWAN_CYCLES_PER_BYTE
RULE_MHZ_PER_MBPS = FREESWAN_MHZ_PER_MBPS
FWD = CYCLES_PER_BYTE["Linux IP stack alone"]
# What each row runs here. "Without crypto" is not a configuration (RFC 4303 §3.2 forbids
# ESP with neither encryption nor integrity): it is HMAC-SHA-1's row with the time of the
# engine's cipher and MAC stages (its per-stage counters) taken out.
AUTH = "esp:null-sha1"
TDES = "esp:3des-sha1"
MODERN = "esp:aes128gcm16"
CONFIGS = (AUTH, TDES, MODERN)


def roles(quick: bool, backends: tuple[str, ...]) -> list[str]:
    return ["cycles"]


def scenario(
    role: str, quick: bool, backends: tuple[str, ...], done: dict[str, list[dict[str, Any]]]
) -> str:
    cfgs = ", ".join(f'"{c}"' for c in CONFIGS)
    return (
        f'name = "{NAME}:cycles{":quick" if quick else ""}"\ntopology = "line"\n'
        f"backends = {backends_toml(backends)}\nconfigurations = [{cfgs}]\n"
        f"repetitions = {1 if quick else 3}\nwarmup_s = 0.5\nstage_timing = true\n\n"
        f'[[links]]\npreset = "unshaped"\n\n'
        f'[[workloads]]\nkind = "tcp"\nseconds = {2 if quick else 5}\n'
    )


def analyse(done: dict[str, list[dict[str, Any]]]) -> Analysis:
    an = Analysis(NAME, TITLE, SOURCE)
    runs = done.get("cycles", [])
    if not runs:
        return an
    mhz = float(runs[0].get("cpu_mhz") or 0) or None
    by = group_results(runs)
    xs_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for (b, cfg, _, _, _), xs in by.items():
        xs_of.setdefault((b, cfg), []).extend(xs)

    def cpb(us_per_kb: float | None) -> float | None:
        return us_per_kb * mhz / 1024 if us_per_kb is not None and mhz else None

    base = cpb(median(xs_of.get(("none", "none"), []), "effort_us_per_kb"))
    # one chart, every backend beside FreeS/WAN's (with --compare, side by side)
    series: dict[str, list[float | None]] = {"FreeS/WAN (PII)": [6, 19, 135]}
    backends = sorted({b for b, _ in xs_of if b != "none"})
    for b in backends:
        added: dict[str, float | None] = {}
        crypto: dict[str, float | None] = {}
        share: dict[str, float | None] = {}
        for cfg in CONFIGS:
            xs = xs_of.get((b, cfg), [])
            total = cpb(median(xs, "effort_us_per_kb"))
            added[cfg] = (total - base) / 2 if total is not None and base is not None else None
            # The share of the crypto stages is taken against the engine's timed stages,
            # both read with one clock (CLOCK_MONOTONIC): stage times are wall time, and a
            # thread preempted mid-stage (two cores, four busy programs) counts the wait
            # too — set against the processes' CPU time they gave shares over 100 %.
            ns = [
                (sum(v for k, v in (x.get("stage_ns") or {}).items() if k in ("cipher", "mac")),
                 sum((x.get("stage_ns") or {}).values()), float(x["payload_bytes"]))
                for x in xs if x.get("stage_ns")
            ]  # fmt: skip
            if ns and mhz:
                c_ns = sum(n[0] for n in ns) / sum(n[2] for n in ns)
                crypto[cfg] = c_ns * mhz / 1000 / 2  # per gateway
                timed = sum(n[1] for n in ns)
                share[cfg] = sum(n[0] for n in ns) / timed if timed else None
            else:
                crypto[cfg] = share[cfg] = None
        a, t, m = added[AUTH], added[TDES], added[MODERN]
        ca = crypto[AUTH]
        without = a - ca if a is not None and ca is not None else None
        rows: list[list[Any]] = [
            ["IP forwarding alone", FWD, fmt(base),
             "whole path without IPsec (sender, two forwarding hops, receiver): an upper "
             "bound"],
            ["IPsec without crypto (added per gateway)",
             CYCLES_PER_BYTE["IPsec without crypto"] - FWD, fmt(without),
             f"{AUTH} minus its cipher and MAC stages"],
            ["IPsec + HMAC-SHA-1 (added per gateway)",
             CYCLES_PER_BYTE["IPsec, HMAC-SHA-1 only"] - FWD, fmt(a), AUTH],
            ["IPsec + 3DES + HMAC (added per gateway)",
             CYCLES_PER_BYTE["IPsec, 3DES + HMAC"] - FWD, fmt(t), TDES],
            ["IPsec + AES-128-GCM (added per gateway)", "—", fmt(m), f"{MODERN} (today's)"],
        ]  # fmt: skip
        an.tables.append(Table(
            f"Cycles per byte ({b}), beside NAI's Pentium II figures",
            ["what", "FreeS/WAN c/B", f"{b} c/B", "measured as"],
            rows,
            note=(f"Cycles = busy CPU time (all CPUs, /proc/stat) x {fmt(mhz)} MHz (this CPU's "
                  "clock), per byte of TCP payload delivered; 'added per gateway' is the rise "
                  "over plain forwarding through the same two gateways, halved."),
        ))  # fmt: skip
        fwd = base / 2 if base is not None else None
        mrow = []
        per_mbps: dict[str, float | None] = {}
        for cfg, v in (("auth", a), ("3des", t), ("gcm", m)):
            per_mbps[cfg] = (v + fwd) / 8 if v is not None and fwd is not None else None
        tdes_cpb = CYCLES_PER_BYTE["IPsec, 3DES + HMAC"]
        for link, r in LINKS:
            mrow.append([
                link, r, fmt(RULE_MHZ_PER_MBPS * r), fmt(tdes_cpb / 8 * r),
                *(fmt(per_mbps[k] * r) if per_mbps[k] is not None else "—"  # type: ignore[operator]
                  for k in ("auth", "3des", "gcm")),
            ])  # fmt: skip
        an.tables.append(Table(
            f"MHz needed per gateway by link rate ({b}), beside the rule of thumb",
            ["link", "Mbit/s", "FreeS/WAN rule (25 x)", "from 140 c/B", f"{b} HMAC-SHA-1 only",
             f"{b} 3DES + HMAC", f"{b} AES-128-GCM"],
            mrow,
            note="MHz = cycles per byte x link Mbit/s / 8. Ours: the IPsec added per gateway "
                 "plus half the whole no-IPsec path (an upper bound for one forwarding hop).",
        ))  # fmt: skip
        series[f"{b} (this CPU)"] = [without, a, t]
        s3 = share.get(TDES)
        found: list[Finding] = []
        found.append(Finding(
            "Per-packet crypto dominates IPsec's cost",
            "3DES adds ~116 of ~140 cycles per byte",
            f"cipher + MAC stages: {100 * s3:.0f} % of the engine's timed stages with "
            "3DES + HMAC-SHA-1 (the rest: lookups, headers, padding, IVs, copies)"
            if s3 is not None else f"not measured: {b} reports no per-stage times (only ours' "
            "engine times its cipher and MAC stages)",
            claim_verdict(None if s3 is None else s3 > 0.5),
        ))  # fmt: skip
        ratio = t / a if t and a and a > 0 else None
        found.append(Finding(
            "3DES is far costlier than authentication alone",
            "3DES + HMAC adds 135 c/B, HMAC-SHA-1 alone 19 (7.1 x)",
            f"{fmt(t)} vs {fmt(a)} c/B ({fmt(ratio)} x)" if ratio else "not measured",
            ratio_verdict(ratio, 135 / 19, 2.0),
        ))  # fmt: skip
        p3, pg = per_mbps.get("3des"), per_mbps.get("gcm")
        found.append(Finding(
            "MHz needed ~ 25 x link Mbit/s; 100 Mbit/s is 'not feasible in software'",
            "25 MHz per Mbit/s (3DES + HMAC); 100 Mbit/s -> 2500 MHz",
            (f"3DES + HMAC {fmt(p3)} MHz per Mbit/s; AES-128-GCM {fmt(pg)} — 100 Mbit/s of "
             f"AES-GCM needs ~{fmt(pg * 100 if pg else None)} MHz of a {fmt(mhz)} MHz core")
            if p3 else "not measured",
            ratio_verdict(p3, RULE_MHZ_PER_MBPS, 2.0),
        ))  # fmt: skip
        an.add_findings(b, found)
        if without is not None and a:
            an.add_cause(
                b,
                f"Per gateway, HMAC-SHA-1 IPsec adds {fmt(a)} cycles per byte of which "
                f"{fmt(without)} is outside the crypto stages (the model's t_fix spread over "
                "the bytes of a full-size packet: TUN and socket system calls, lookups, "
                "headers); FreeS/WAN's split was 6 of 19.",
            )
    if backends:
        an.plots.append(Plot(
            "bars", f"Cycles per byte added per gateway ({', '.join(backends)}) beside "
            "FreeS/WAN's", "", "cycles per byte (log)",
            ["without crypto", "HMAC-SHA-1", "3DES + HMAC"], series, logy=True,
            note="'without crypto' needs the engine's per-stage times: only ours has them "
            "(a missing bar)" if len(backends) > 1 else "",
        ))  # fmt: skip
    return an
