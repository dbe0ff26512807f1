"""A workload: what traffic a run sends (`Workload`, as a scenario states it) and what
each kind of workload is to the lab (`Kind`: its keys, how it runs, what it needs, how
long it takes). Every kind is one `Kind` beside its code in this package, listed once in
`ipsec_lab.workloads.REGISTRY`; the scenario's validation, the runner, `check`'s
estimate and `hosts check` read it from there.

A kind's `run` has one signature, `run(ctx) -> rows`: `Context` carries everything a
run may use — the testbed, the flow, the workload, the meters, the warm-up, the run's
seed and the rates this campaign's RFC 2544 searches found. Each row comes from
`ctx.meters(label, measure)`, and what `measure()` returns must say at least the bytes
of payload it carried (`payload_bytes`: the meters' effort is CPU per kB of it) and its
rate (`mbps`); anything else it measured goes beside them (docs/lab.md's metrics).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipsec_lab.traffic import Meters, Row

if TYPE_CHECKING:
    from ipsec_lab.testbed import Flow
    from ipsec_lab.testbed.interface import Testbed

# A rate this campaign's searches found at a packet size: (Mbit/s, where it came from),
# or None where none searched that size.
Lookup = Callable[[int], tuple[float, str] | None]


def _none(size: int) -> tuple[float, str] | None:
    return None


@dataclass(frozen=True)
class Context:
    """What one run of a workload has to go on."""

    tb: Testbed
    flow: Flow
    workload: Workload
    meters: Meters
    warmup_s: float = 0.0
    seed: int = 1  # the scenario's seed plus the repetition: files and mails drawn from it
    # the campaign's RFC 2544 results for this backend, configuration, link and flow:
    # searched("pdr_mbps") or searched("ndr_mbps") gives the lookup by size
    searched: Callable[[str], Lookup] = lambda field: _none
    soak_minutes: float | None = None  # `run --quick`: soaks last this long instead
    # the backend's rollover of every SA to fresh keys (the rekey workload's; True: only
    # refuse, with Unsupported, where it has none), or None
    rekey: Callable[[bool], Row] | None = None


def _no_tools(w: Workload) -> tuple[str, ...]:
    return ()


def _never(w: Workload) -> bool:
    return False


@dataclass(frozen=True)
class Kind:
    """One kind of workload, as the registry lists it."""

    name: str  # what a scenario's `kind` says
    what: str  # one line for the docs and `--help`
    keys: frozenset[str]  # the keys it reads besides `kind` and `label`
    run: Callable[[Context], list[Row]]
    # seconds of traffic one run sends, given the link's rate in Mbit/s (`check`'s estimate;
    # the warm-up and the run's set-up are added to it)
    seconds: Callable[[Workload, float], float]
    # the programs it needs at the traffic's ends, besides iperf3 (`hosts check`)
    tools: Callable[[Workload], tuple[str, ...]] = _no_tools
    # whether a UDP generator (udp-gso, trafgen or iperf3) sends it: the scenario's
    # `generator` applies, trafgen's pinning is placed, and `hosts check` looks for the
    # paced generators' tools and nft
    generated: Callable[[Workload], bool] = _never
    # its UDP goes without DF (the source's ip_no_pmtu_disc for the run): a datagram
    # larger than a tunnel's inner MTU is fragmented by the gateway, as a DF-less one is
    # in the field, instead of refused at the sender after "fragmentation needed"
    without_df: bool = False
    # its traffic can be spread over the scenario's `tunnels` (testbed/tunnels.py): all of
    # it from a paced generator, which sends to each tunnel's destination in turn
    spreads: bool = False
    article: str = "a"  # "a tcp workload", "an smtp workload"

    def said(self) -> str:
        return f"{self.article} {self.name} workload"


@dataclass(frozen=True)
class Workload:
    """What traffic a run sends. Sizes are bytes of the inner IP packet."""

    kind: str
    seconds: float = 5.0  # tcp/udp/imix duration; rfc2544 trial length is trial_s
    bytes: int | None = None  # tcp: send this many bytes instead of for `seconds`
    streams: int = 1
    size: int = 1420  # udp / rfc2544
    rate_mbit: float = 100.0  # udp / imix offered rate
    trial_s: float = 2.0  # rfc2544
    loss_tolerance_pct: float = 0.0
    resolution_mbit: float = 1.0
    max_rate_mbit: float = 1000.0
    max_trials: int = 20
    # rfc2544: after the search, this many trials at 1.25 x its loss-free rate measure the
    # forwarding rate at overload (RFC 2285's MFR) on their own (0: from the search's)
    overload_trials: int = 0
    # rfc2544: several sizes in one run instead of `size` — each searched in turn, then
    # their overload trials interleaved in rounds (see rfc2544.overload_rounds); the
    # ceiling and resolution are those of the largest size, scaled to the same packet
    # rate for the smaller ones
    sizes: tuple[int, ...] = ()
    files: tuple[int, ...] = (1024, 10 * 1024, 1024 * 1024, 10 * 1024 * 1024)  # http/smtp
    label: str = ""
    # tcp: "iperf" (iperf3's own random payload), or a plain sender of "text" (English
    # prose: DEFLATE shrinks it by about half, as study 1's compressible data) or "random"
    # (urandom: incompressible); the two are sent alike, so only the bytes differ.
    data: str = "iperf"
    # udp / imix / rfc2544: the UDP generator — "auto" (udp-gso, else trafgen, where a
    # paced one can go, else iperf3), "udp-gso", "trafgen" or "iperf3" (the scenario's
    # `generator` unless the workload's)
    generator: str = "auto"
    flows: int = 1  # udp-gso, trafgen: UDP flows (source ports) the packets go round
    # latency: the background at these % of the PDR (udp), or bulk TCP (tcp); the probes
    # every `probe_interval_ms`, `probe_bytes` long (0: irtt's smallest, its header)
    loads: tuple[float, ...] = (0.0, 10.0, 50.0, 90.0)
    background: str = "udp"
    probe_interval_ms: float = 1.0
    probe_bytes: int = 0
    # soak: `minutes` at `load_pct` of the NDR (None: at `rate_mbit`), read every
    # `interval_s`; loss judged against `loss_tolerance_pct` in every interval
    minutes: float = 30.0
    load_pct: float | None = 50.0
    interval_s: float = 10.0
    # rekey: every SA rolled over every `rekey_s` for `minutes` (1 unless given) at
    # `load_pct` of the NDR or `rate_mbit`
    rekey_s: float = 5.0

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.kind == "tcp":
            extra = f"{self.bytes}B" if self.bytes else f"{self.seconds:g}s"
            data = "" if self.data == "iperf" else f"-{self.data}"
            return f"tcp-{self.streams}x-{extra}{data}"
        if self.kind in ("udp", "rfc2544"):
            return f"{self.kind}-{'-'.join(map(str, self.all_sizes))}"
        return self.kind

    @property
    def all_sizes(self) -> tuple[int, ...]:
        return self.sizes or (self.size,)

    def size_label(self, size: int) -> str:
        """The label of one size's row in a several-size rfc2544 workload."""
        return f"{self.label or self.kind}-{size}"

    def max_rate_for(self, size: int) -> float:
        """The search's ceiling for `size`: `max_rate_mbit` at the largest size, the
        same packet rate at a smaller one."""
        return self.max_rate_mbit * size / max(self.all_sizes)

    def resolution_for(self, size: int) -> float:
        return self.resolution_mbit * size / max(self.all_sizes)
