"""The workload registry: every kind of traffic a scenario can name, once.

Each kind is a `traffic.workload.Kind` beside its code (`traffic/iperf.py`'s `TCP`, …):
its keys, its `run(ctx)`, the tools it needs at the traffic's ends, whether a UDP
generator sends it, and how long a run takes. The scenario's validation, the runner,
`check`'s estimate and `hosts check` read it from here. A new kind of workload is its
code, its `Kind` and one line here (docs/development.md, "Adding things").
"""

from __future__ import annotations

from ipsec_lab.traffic import apps, iperf, latency, rekey, rfc2544, soak, udp
from ipsec_lab.traffic.workload import Kind, Workload

REGISTRY: tuple[Kind, ...] = (
    iperf.TCP,
    udp.UDP,
    rfc2544.RFC2544,
    udp.IMIX,
    apps.HTTP,
    apps.SMTP,
    latency.LATENCY,
    soak.SOAK,
    rekey.REKEY,
)
BY_KIND: dict[str, Kind] = {k.name: k for k in REGISTRY}
KINDS: tuple[str, ...] = tuple(BY_KIND)
# every key some kind reads (besides `kind` and `label`)
KEYS: frozenset[str] = frozenset().union(*(k.keys for k in REGISTRY))


def of(w: Workload) -> Kind:
    """The kind of `w` (a parsed scenario's workloads name only registered kinds)."""
    return BY_KIND[w.kind]


def markdown() -> str:
    """The table of kinds in docs/scenarios.md (`python -m ipsec_lab.workloads` prints it)."""
    lines = ["| kind | what it sends | keys |", "|---|---|---|"]
    for k in REGISTRY:
        keys = ", ".join(f"`{x}`" for x in sorted(k.keys))
        lines.append(f"| `{k.name}` | {k.what} | {keys} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
