"""`ipsec-lab bench`: the engine benchmark, with derived units and the raw-crypto ratio."""

from __future__ import annotations

from typing import Any

from ipsec_lab import _native
from ipsec_lab.algorithms import PER_BYTE_STAGES

KB = 1024  # CPU effort is µs per kB with kB = 1024 bytes, as netperf's service demand


def derive(row: dict[str, Any]) -> dict[str, Any]:
    """Add the units a user reads to one raw result: Mpps, Gbit/s, µs/kB, ratio to raw."""
    ns = float(row["ns_per_packet"])
    raw = float(row["raw_ns_per_packet"])
    size = int(row["size"])
    out = {
        "suite": row["suite"],
        "mode": row["mode"],
        "op": row["op"],
        "size": size,
        "ns_per_packet": ns,
        "mpps": 1e3 / ns,
        "gbps": size * 8 / ns,
        "us_per_kb": ns / size * KB / 1e3,
        "raw_ns_per_packet": raw,
        "ratio_to_raw": raw / ns,
        "l_alg": int(row["l_alg"]),
    }
    return _with_stages(row, out)


def _with_stages(row: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """Carry a raw row's per-stage split (when timed) into its derived row."""
    if "stages" in row:
        out["stages"] = {str(k): float(v) for k, v in row["stages"].items()}
        out["stage_points"] = float(row["stage_points"])
    return out


def with_stage_split(
    off: list[dict[str, Any]], on: list[dict[str, Any]], off_point_ns: float
) -> list[dict[str, Any]]:
    """Rows measured with stage timing off, each given the split measured with it on and
    what timing costs: ``stage_timing_cost`` = ns with timing / ns without - 1 (on), and
    ``stage_timing_off_cost`` = the timing points' cost with no clock (``off_point_ns``
    each, measured in this run) / ns per packet (off)."""
    out = []
    for a, b in zip(off, on):
        stages = b.get("stages", {})
        row = dict(a)
        row["stages"] = stages
        row["ns_per_packet_timed"] = b["ns_per_packet"]
        row["stage_timing_cost"] = b["ns_per_packet"] / a["ns_per_packet"] - 1
        row["stage_timing_off_cost"] = off_point_ns * b["stage_points"] / a["ns_per_packet"]
        out.append(add_model_terms(row))
    return out


def add_model_terms(row: dict[str, Any]) -> dict[str, Any]:
    """Sum a row's stages into the model's terms: ``t_fix_ns`` (per packet) and
    ``per_byte_ns`` (cipher, MAC, compression)."""
    stages = row["stages"]
    row["t_fix_ns"] = sum(v for k, v in stages.items() if k not in PER_BYTE_STAGES)
    row["per_byte_ns"] = sum(v for k, v in stages.items() if k in PER_BYTE_STAGES)
    return row


# The identity of a benchmark case, in engine rows (suite, mode) and configuration rows.
CASE_KEYS = ("suite", "mode", "config", "payload", "op", "size")
RATIO_NOISE = 1.0  # ours faster than the raw crypto of the same bytes cannot be


def repeated(measure: Any, repeat: int) -> tuple[list[dict[str, Any]], float]:
    """Run `measure()` (raw engine rows) `repeat` times; per case the median repetition's
    row with ``ns_min``/``ns_max`` over the repetitions (and ``raw_ns_min``/``_max``), and
    the CPUs' worth other processes used meanwhile (`meters.OtherCpu`)."""
    from ipsec_lab.meters import OtherCpu

    reps: list[list[dict[str, Any]]] = []
    with OtherCpu() as other:
        for _ in range(repeat):
            reps.append(measure())
    out = []
    for rows in zip(*reps, strict=True):
        keyed = sorted(rows, key=lambda r: float(r["ns_per_packet"]))
        mid = dict(keyed[len(keyed) // 2])
        ns = [float(r["ns_per_packet"]) for r in rows]
        mid.update(ns_min=min(ns), ns_max=max(ns), repetitions=len(rows))
        if "raw_ns_per_packet" in mid:
            raw = sorted(float(r["raw_ns_per_packet"]) for r in rows)
            mid.update(raw_ns_per_packet=raw[len(raw) // 2], raw_ns_min=raw[0], raw_ns_max=raw[-1])
        out.append(mid)
    return out, other.cpus


def _spread(row: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """Carry the repetitions' spread; flag a ratio to raw crypto above 1 as noise."""
    for k in ("ns_min", "ns_max", "repetitions", "raw_ns_min", "raw_ns_max"):
        if k in row:
            out[k] = float(row[k]) if k != "repetitions" else int(row[k])
    if "ratio_to_raw" in out:
        out["ratio_is_noise"] = out["ratio_to_raw"] > RATIO_NOISE
    return out


def run(
    suites: list[str] | None,
    sizes: list[int] | None,
    modes: list[str] | None,
    ops: list[str] | None,
    budget_ms: int,
    trials: int,
    progress: Any = None,
    stages: bool = False,
    repeat: int = 1,
) -> tuple[list[dict[str, Any]], float]:
    """The engine benchmark, `repeat` times: its rows (each case's median repetition, with
    the spread) and the CPUs' worth other processes used meanwhile."""
    rep = [0]

    def tick(done: int, total: int) -> None:
        if progress:
            progress(rep[0] * total + done, total * repeat)

    def once() -> list[dict[str, Any]]:
        rows = _native.bench(
            suites=suites,
            sizes=sizes,
            modes=modes,
            ops=ops,
            budget_ms=budget_ms,
            trials=trials,
            progress=tick,
            stages=stages,
        )
        rep[0] += 1
        return rows

    rows, other = repeated(once, repeat)
    return [_spread(r, derive(r)) for r in rows], other


def derive_config(row: dict[str, Any]) -> dict[str, Any]:
    """Units for one configuration result: Mbit/s and µs/kB of inner packet, wire bytes."""
    ns = float(row["ns_per_packet"])
    size = int(row["size"])
    out: dict[str, Any] = {
        "config": row["config"],
        "payload": row["payload"],
        "op": row["op"],
        "size": size,
        "ns_per_packet": ns,
        "mpps": 1e3 / ns,
        "mbps": size * 8e3 / ns,
        "us_per_kb": ns / size * KB / 1e3,
        "wire_len": int(row["wire_len"]),
    }
    return _with_stages(row, out)


def run_configs(
    configs: list[str],
    sizes: list[int],
    ops: list[str],
    payloads: list[str],
    budget_ms: int,
    trials: int,
    progress: Any = None,
    stages: bool = False,
    repeat: int = 1,
) -> tuple[list[dict[str, Any]], float]:
    def once() -> list[dict[str, Any]]:
        return list(
            _native.bench_configs(
                configs,
                sizes,
                ops,
                payloads,
                budget_ms=budget_ms,
                trials=trials,
                stages=stages,
                progress=progress,
            )
        )

    rows, other = repeated(once, repeat)
    return [_spread(r, derive_config(r)) for r in rows], other


def study1(budget_ms: int, trials: int, size: int = 1420, progress: Any = None) -> dict[str, Any]:
    """Study 1's configurations sealed here at ``size`` bytes, each one's CPU effort
    relative to enc + SHA-1 beside the published ratio."""
    from ipsec_lab.studies import ferrante2005 as F

    rows = []
    runs = [(label, cfg, payload) for label, cfg, payload in F.CONFIGURATIONS if cfg]
    for i, (label, cfg, payload) in enumerate(runs):
        (r,), _other = run_configs([cfg], [size], ["seal"], [payload], budget_ms, trials)
        rows.append({"name": label, **r})
        if progress:
            progress(i + 1, len(runs))
    base = next(r for r in rows if r["name"] == F.BASELINE)["us_per_kb"]
    for r in rows:
        r["effort_vs_enc_sha1"] = r["us_per_kb"] / base
        r["published_effort_vs_enc_sha1"] = F.PUBLISHED_EFFORT_VS_ENC_SHA1[r["name"]]
    return {"size": size, "baseline": F.BASELINE, "rows": rows}
