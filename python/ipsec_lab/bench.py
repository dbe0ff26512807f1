"""`ipsec-lab bench`: the engine benchmark, with derived units and the raw-crypto ratio."""

from __future__ import annotations

from typing import Any

from ipsec_lab import _native

KB = 1024  # CPU effort is µs per kB with kB = 1024 bytes, as netperf's service demand


def derive(row: dict[str, Any]) -> dict[str, Any]:
    """Add the units a user reads to one raw result: Mpps, Gbit/s, µs/kB, ratio to raw."""
    ns = float(row["ns_per_packet"])
    raw = float(row["raw_ns_per_packet"])
    size = int(row["size"])
    return {
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


def run(
    suites: list[str] | None,
    sizes: list[int] | None,
    modes: list[str] | None,
    ops: list[str] | None,
    budget_ms: int,
    trials: int,
    progress: Any = None,
) -> list[dict[str, Any]]:
    rows = _native.bench(
        suites=suites,
        sizes=sizes,
        modes=modes,
        ops=ops,
        budget_ms=budget_ms,
        trials=trials,
        progress=progress,
    )
    return [derive(r) for r in rows]
