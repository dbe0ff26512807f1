"""A scenario: one experiment as a TOML file, validated with errors that name the key.

    name = "study-1 at two link speeds"
    topology = "line"                 # pair | line | clients
    backends = ["none", "strongswan"] # any of ipsec_lab.backends.NAMES (`ipsec-lab check`)
    configurations = ["esp:aes128gcm16", "esp:aes128-sha1"]   # or "@ferrante2005"
    repetitions = 3
    warmup_s = 1.0
    seed = 1

    [[links]]                         # swept: every run of every link profile
    preset = "ethernet-10"
    [[links]]
    name = "lossy-100"
    rate_mbit = 100
    delay_ms = 1
    loss_pct = 0.5

    [[workloads]]
    kind = "tcp"                      # tcp | udp | rfc2544 | imix | http | smtp | latency | soak
    seconds = 5
    data = "text"                     # tcp: iperf (default) | text | random

    [gateway]
    cpu_quota = 0.5                   # share of one CPU for the IPsec processes
    cpus = [1]                        # pin them

Building the testbed is elsewhere (`testbed`); this module only reads and checks.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipsec_lab import backends, units, workloads
from ipsec_lab.backends.charon_files import IKE_SAS
from ipsec_lab.testbed import LINK_PRESETS, Link
from ipsec_lab.testbed.placement import MODES as PLACEMENTS
from ipsec_lab.traffic.workload import Workload

TOPOLOGIES = ("pair", "line", "clients")
BACKENDS = backends.NAMES  # the registry's (ipsec_lab.backends.REGISTRY)
WORKLOAD_KINDS = workloads.KINDS  # the registry's (ipsec_lab.workloads.REGISTRY)
LATENCY_BACKGROUNDS = ("udp", "tcp")
GENERATORS = ("auto", "udp-gso", "trafgen", "iperf3")  # traffic.generator's
TCP_DATA = ("iperf", "text", "random")


class ScenarioError(ValueError):
    """A scenario that cannot run: `str()` names the file, the key and what is wrong."""

    def __init__(self, source: str, key: str, message: str) -> None:
        super().__init__(f"{source}: {key}: {message}")
        self.source = source
        self.key = key


@dataclass(frozen=True)
class Gateway:
    cpu_quota: float | None = None  # CPUs' worth (0.5 = half of one CPU)
    cpus: tuple[int, ...] = ()
    aqm: bool = False  # ours: CoDel on the gateways' outer receive queues (RFC 8289)
    # ours: its TUN devices' queue, packets or "auto" (None: the gateway's default, 500)
    tun_queue: int | str | None = None
    # the IKE daemons' N tunnels (strongSwan): N CHILD_SAs under "one" IKE_SA, or an IKE_SA
    # each ("per-tunnel"); a count of 1 is one of each either way
    ike_sas: str = "one"


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    text: str
    topology: str
    backends: tuple[str, ...]
    configurations: tuple[str, ...]
    links: tuple[Link, ...]
    workloads: tuple[Workload, ...]
    repetitions: int = 1
    warmup_s: float = 1.0
    seed: int = 1
    gateway: Gateway = field(default_factory=Gateway)
    soaker: bool = False
    stage_timing: bool = False  # ours: per-stage ns of the gateways in every row
    generator: str = "auto"  # the UDP workloads' generator unless a workload names one
    hosts: str | None = None  # a hosts file: run on real hosts (relative to the scenario)
    # on one machine: "auto" puts traffic and the IPsec under test on CPUs of their own
    # (testbed.placement), "off" leaves every role on every CPU
    placement: str = "auto"
    # tunnel counts between the line testbed's gateways, each a run of its own for the
    # backends and workloads that can (testbed/tunnels.py); (1,): the testbed as it was
    tunnels: tuple[int, ...] = (1,)


_TOP_KEYS = {
    "name", "topology", "backends", "configurations", "links", "workloads",
    "repetitions", "warmup_s", "seed", "gateway", "soaker", "stage_timing", "hosts",
    "generator", "placement", "tunnels",
}  # fmt: skip
_LINK_KEYS = {
    "name", "preset", "rate_mbit", "delay_ms", "jitter_ms", "loss_pct", "reorder_pct",
    "duplicate_pct", "mtu",
}  # fmt: skip
# Each kind of workload reads its own keys (ipsec_lab.workloads' registry) besides `kind`
# and `label`: any other is refused, never accepted and ignored.
_WORKLOAD_KEYS = {"kind", "label"} | workloads.KEYS


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> ScenarioError:
        return ScenarioError(self.source, key, message)

    def unknown(self, table: dict[str, Any], allowed: set[str], where: str) -> None:
        import difflib

        for k in table:
            if k not in allowed:
                near = ", ".join(sorted(allowed))
                close = difflib.get_close_matches(k, sorted(allowed), n=1, cutoff=0.7)
                hint = f" — did you mean {close[0]}?" if close else ""
                raise self.fail(f"{where}{k}", f"unknown key{hint} (known: {near})")

    def rate(
        self, table: dict[str, Any], key: str, where: str, default: Any, lo: float, hi: float
    ) -> Any:
        """A rate in Mbit/s: a number, or a string in the grammar of `ipsec_lab.units`
        ("10M", "1.5G", "500kbps"; a byte rate is refused)."""
        if key not in table:
            return default
        v = table[key]
        try:
            mbit = units.rate_mbit(v)
        except units.UnitError as e:
            raise self.fail(f"{where}{key}", str(e)) from None
        if not lo <= mbit <= hi:
            raise self.fail(f"{where}{key}", f"{v} is outside {lo:g}..{hi:g} Mbit/s")
        return mbit

    def number(
        self,
        table: dict[str, Any],
        key: str,
        where: str,
        default: float | None,
        lo: float,
        hi: float,
        integer: bool = False,
    ) -> Any:
        if key not in table:
            return default
        v = table[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(f"{where}{key}", f"must be a number, not {v!r}")
        if integer and not isinstance(v, int):
            raise self.fail(f"{where}{key}", f"must be a whole number, not {v!r}")
        if not lo <= v <= hi:
            raise self.fail(f"{where}{key}", f"{v} is outside {lo:g}..{hi:g}")
        return v

    def strings(self, table: dict[str, Any], key: str, default: list[str]) -> list[str]:
        v = table.get(key, default)
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not v or not all(isinstance(s, str) for s in v):
            raise self.fail(key, f"must be a string or a non-empty list of strings, not {v!r}")
        return list(v)


def _link(r: _Reader, t: Any, where: str) -> Link:
    if isinstance(t, str):
        t = {"preset": t}
    if not isinstance(t, dict):
        raise r.fail(where.rstrip("."), "must be a table or a preset name")
    r.unknown(t, _LINK_KEYS, where)
    base = Link("custom")
    if "preset" in t:
        preset = t["preset"]
        if preset not in LINK_PRESETS:
            raise r.fail(
                f"{where}preset", f"unknown preset {preset!r} (known: {', '.join(LINK_PRESETS)})"
            )
        base = LINK_PRESETS[preset]
    name = t.get("name", base.name if "preset" in t else None)
    if not isinstance(name, str) or not name:
        raise r.fail(f"{where}name", "a link without a preset needs a name")
    rate = r.rate(t, "rate_mbit", where, base.rate_mbit, 0.01, 100_000)
    return Link(
        name=name,
        rate_mbit=rate,
        delay_ms=r.number(t, "delay_ms", where, base.delay_ms, 0, 10_000),
        jitter_ms=r.number(t, "jitter_ms", where, base.jitter_ms, 0, 10_000),
        loss_pct=r.number(t, "loss_pct", where, base.loss_pct, 0, 100),
        reorder_pct=r.number(t, "reorder_pct", where, base.reorder_pct, 0, 100),
        duplicate_pct=r.number(t, "duplicate_pct", where, base.duplicate_pct, 0, 100),
        # IPv6's minimum to a jumbo frame
        mtu=r.number(t, "mtu", where, base.mtu, 1280, 9000, integer=True),
    )


def _size(r: _Reader, v: Any, key: str) -> int:
    """A byte count: an integer or a string in the grammar of `ipsec_lab.units` (1024,
    '10K', '1.5MiB', '1G'; binary prefixes)."""
    try:
        return units.size_bytes(v, positive=True)
    except units.UnitError as e:
        raise r.fail(key, str(e)) from None


def _generator(r: _Reader, t: dict[str, Any], key: str, default: str, topology: str) -> str:
    """A UDP generator's name; the paced ones (udp-gso, trafgen) only where the traffic's
    source does no IPsec of its own (trafgen writes frames below the source's IP stack;
    both are paced on the source's test interface)."""
    v = t.get(key.rsplit(".", 1)[-1], default)
    if v not in GENERATORS:
        raise r.fail(key, f"must be one of {', '.join(GENERATORS)}, not {v!r}")
    if v == "trafgen" and topology != "line":
        raise r.fail(key, f"trafgen cannot drive the {topology} topology: its sources do "
                     "their own (host-to-host) IPsec, which frames written below their IP "
                     "stack would bypass; use iperf3 or auto")  # fmt: skip
    if v == "udp-gso" and topology != "line":
        raise r.fail(key, f"udp-gso cannot drive the {topology} topology: its sources do "
                     "their own (host-to-host) IPsec, and the lab paces udp-gso on the "
                     "source's test interface; use iperf3 or auto")  # fmt: skip
    return str(v)


def _loads(
    r: _Reader, t: dict[str, Any], key: str, default: tuple[float, ...]
) -> tuple[float, ...]:
    """Loads in % of the PDR: a non-empty list of numbers 0..100, each once."""
    if "loads" not in t:
        return default
    v = t["loads"]
    if not isinstance(v, list) or not v:
        raise r.fail(key, "must be a non-empty list of loads in % of the PDR (e.g. [0, 50, 90])")
    out = tuple(float(r.number({"loads": x}, "loads", key.rsplit(".", 1)[0] + ".", 0, 0, 100))
                for x in v)  # fmt: skip
    if len(set(out)) != len(out):
        raise r.fail(key, f"lists a load twice: {v}")
    return out


def _one_of(r: _Reader, t: dict[str, Any], key: str, where: str, default: str,
            known: tuple[str, ...]) -> str:  # fmt: skip
    v = t.get(key, default)
    if v not in known:
        raise r.fail(f"{where}{key}", f"must be one of {', '.join(known)}, not {v!r}")
    return str(v)


def _workload(r: _Reader, t: Any, where: str, generator: str = "auto",
              topology: str = "line") -> Workload:  # fmt: skip
    if not isinstance(t, dict):
        raise r.fail(where.rstrip("."), "must be a table")
    r.unknown(t, _WORKLOAD_KEYS, where)
    kind = t.get("kind")
    if kind not in WORKLOAD_KINDS:
        raise r.fail(f"{where}kind", f"must be one of {', '.join(WORKLOAD_KINDS)}, not {kind!r}")
    own = workloads.BY_KIND[kind]
    for k in t:
        if k not in own.keys and k not in ("kind", "label"):
            takers = [x for x in workloads.REGISTRY if k in x.keys]
            names = " or ".join(x.name for x in takers)
            raise r.fail(
                f"{where}{k}",
                f"only {takers[0].article} {names} workload uses {k}; "
                f"{own.said()} takes {', '.join(sorted(own.keys))}",
            )
    d = Workload(kind)
    n = r.number
    files = d.files
    if "files" in t:
        if not isinstance(t["files"], list) or not t["files"]:
            raise r.fail(f"{where}files", "must be a non-empty list of sizes")
        files = tuple(_size(r, f, f"{where}files") for f in t["files"])
    sizes: tuple[int, ...] = ()
    if "sizes" in t:  # an rfc2544 workload's
        if "size" in t:
            raise r.fail(f"{where}sizes", "give `size` or `sizes`, not both")
        v = t["sizes"]
        if not isinstance(v, list) or not v:
            raise r.fail(f"{where}sizes", "must be a non-empty list of packet sizes")
        sizes = tuple(n({"sizes": x}, "sizes", where, d.size, 64, 9000, integer=True) for x in v)
        if len(set(sizes)) != len(sizes):
            raise r.fail(f"{where}sizes", f"lists a size twice: {list(sizes)}")
    label = t.get("label", "")
    if not isinstance(label, str):
        raise r.fail(f"{where}label", "must be a string")
    data = t.get("data", d.data)
    if data not in TCP_DATA:
        raise r.fail(f"{where}data", f"must be one of {', '.join(TCP_DATA)}, not {data!r}")
    w = Workload(
        kind=kind,
        seconds=n(t, "seconds", where, d.seconds, 0.5, 3600),
        bytes=_size(r, t["bytes"], f"{where}bytes") if "bytes" in t else None,
        streams=n(t, "streams", where, d.streams, 1, 128, integer=True),
        size=n(t, "size", where, d.size, 64 if kind != "udp" else 29, 9000, integer=True),
        rate_mbit=r.rate(t, "rate_mbit", where, d.rate_mbit, 0.01, 100_000),
        trial_s=n(t, "trial_s", where, d.trial_s, 0.5, 600),
        loss_tolerance_pct=n(t, "loss_tolerance_pct", where, d.loss_tolerance_pct, 0, 50),
        resolution_mbit=r.rate(t, "resolution_mbit", where, d.resolution_mbit, 0.001, 10_000),
        max_rate_mbit=r.rate(t, "max_rate_mbit", where, d.max_rate_mbit, 0.01, 100_000),
        max_trials=n(t, "max_trials", where, d.max_trials, 1, 100, integer=True),
        overload_trials=n(t, "overload_trials", where, d.overload_trials, 0, 50, integer=True),
        sizes=sizes,
        files=files,
        label=label,
        data=data,
        generator=_generator(r, t, f"{where}generator", generator, topology),
        flows=n(t, "flows", where, d.flows, 1, 1024, integer=True),
        loads=_loads(r, t, f"{where}loads", d.loads),
        background=_one_of(r, t, "background", where, d.background, LATENCY_BACKGROUNDS),
        # a soak's probes every 10 ms unless given (its intervals run for minutes)
        probe_interval_ms=n(
            t,
            "probe_interval_ms",
            where,
            10.0 if kind == "soak" else d.probe_interval_ms,
            0.1,
            10_000,
        ),
        minutes=n(t, "minutes", where, 1.0 if kind == "rekey" else d.minutes, 0.05, 10_080),
        load_pct=None if "rate_mbit" in t else n(t, "load_pct", where, d.load_pct, 0.1, 100),
        interval_s=n(t, "interval_s", where, d.interval_s, 1, 3600),
        rekey_s=n(t, "rekey_s", where, d.rekey_s, 1, 3600),
        probe_bytes=n(t, "probe_bytes", where, d.probe_bytes, 0, 1472, integer=True),
    )
    if kind in ("soak", "rekey") and "rate_mbit" in t and "load_pct" in t:
        raise r.fail(f"{where}load_pct", "give `load_pct` (of the NDR) or `rate_mbit`, not both")
    if kind == "soak" and w.interval_s > w.minutes * 60:
        raise r.fail(f"{where}interval_s", f"{w.interval_s:g} s is longer than the soak "
                     f"({w.minutes:g} min)")  # fmt: skip
    if kind == "rekey" and w.rekey_s > w.minutes * 60:
        raise r.fail(f"{where}rekey_s", f"{w.rekey_s:g} s leaves no rekey in {w.minutes:g} min")
    if w.data != "iperf" and (w.streams != 1 or w.bytes is not None):
        raise r.fail(f"{where}data", f"a {w.data} transfer is one stream sent for `seconds`")
    if kind == "rfc2544" and w.resolution_mbit >= w.max_rate_mbit:
        raise r.fail(f"{where}resolution_mbit", "must be below max_rate_mbit")
    return w


def configuration_presets() -> dict[str, tuple[str, ...]]:
    """The studies' configuration matrices, as `@name` in a scenario's `configurations`."""
    from ipsec_lab.studies import ferrante2005, hadjichristofi2003, tisovsky2013

    return {
        "ferrante2005": tuple(dict.fromkeys(c for _, c, _ in ferrante2005.CONFIGURATIONS if c)),
        "tisovsky2013": tuple(tisovsky2013.CONFIGURATION.values()),
        "hadjichristofi2003": hadjichristofi2003.CONFIGURATIONS,
    }


def _configurations(r: _Reader, names: list[str]) -> tuple[str, ...]:
    from ipsec_lab.model.transforms import parse_configuration

    presets = configuration_presets()

    out: list[str] = []
    for name in names:
        if name.startswith("@"):
            try:
                out.extend(presets[name[1:]])
            except KeyError:
                known = ", ".join("@" + k for k in presets)
                msg = f"unknown preset {name!r} (known: {known})"
                raise r.fail("configurations", msg) from None
            continue
        try:
            cfg = parse_configuration(name)
        except ValueError as e:
            said = str(e)  # the parser's message names the text already, or not
            raise r.fail("configurations", said if said.startswith(repr(name)) else
                         f"{name!r}: {said}") from None  # fmt: skip
        out.append(cfg.text)  # one spelling: a bare suite becomes esp:SUITE
    return tuple(dict.fromkeys(out))


def _key_at(text: str, message: str) -> tuple[str, str]:
    """The key on the line a TOML error points at (`rate_mbit = 10M` → `rate_mbit`), with
    the table it is in, or "(syntax)" when the line holds no key; and a hint when the
    value is a number with a unit left unquoted."""
    import re

    m = re.search(r"line (\d+)", message)
    lines = text.splitlines()
    if not m or not 1 <= int(m.group(1)) <= len(lines):
        return "(syntax)", ""
    n = int(m.group(1))
    key = re.match(r"\s*([A-Za-z0-9_.-]+)\s*=\s*(.*?)\s*(#.*)?$", lines[n - 1])
    if not key:
        return "(syntax)", ""
    hint = ""
    if re.fullmatch(r"-?[0-9.]+\s*[A-Za-z/]+", key.group(2)):
        hint = f'; a value with a unit is a string: {key.group(1)} = "{key.group(2)}"'
    table = ""
    for line in reversed(lines[: n - 1]):
        h = re.match(r"\s*\[\[?\s*([A-Za-z0-9_.-]+)\s*\]\]?", line)
        if h:
            table = h.group(1) + "."
            break
    return f"{table}{key.group(1)} (line {n})", hint


def parse(text: str, source: str = "<scenario>") -> Scenario:
    r = _Reader(source)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        key, hint = _key_at(text, str(e))
        raise r.fail(key, str(e) + hint) from None
    r.unknown(doc, _TOP_KEYS, "")
    topology = doc.get("topology", "line")
    if topology not in TOPOLOGIES:
        raise r.fail("topology", f"must be one of {', '.join(TOPOLOGIES)}, not {topology!r}")
    backends = r.strings(doc, "backends", ["none"])
    for b in backends:
        if b not in BACKENDS:
            raise r.fail("backends", f"unknown backend {b!r} (known: {', '.join(BACKENDS)})")
    configurations = _configurations(r, r.strings(doc, "configurations", ["esp:aes128gcm16"]))
    links_raw = doc.get("links", ["unshaped"])
    if not isinstance(links_raw, list) or not links_raw:
        raise r.fail("links", "must be a non-empty list of link tables or preset names")
    links = tuple(_link(r, t, f"links[{i}].") for i, t in enumerate(links_raw))
    if len({link.name for link in links}) != len(links):
        raise r.fail("links", "two link profiles have the same name; give each a `name`")
    wl_raw = doc.get("workloads", [{"kind": "tcp"}])
    if not isinstance(wl_raw, list) or not wl_raw:
        raise r.fail("workloads", "must be a non-empty list of workload tables")
    generator = _generator(r, doc, "generator", "auto", topology)
    workloads = tuple(_workload(r, t, f"workloads[{i}].", generator, topology)
                      for i, t in enumerate(wl_raw))  # fmt: skip
    if len({w.name for w in workloads}) != len(workloads):
        raise r.fail("workloads", "two workloads have the same name; give each a `label`")
    tunnels = _tunnels(r, doc, topology, workloads)
    gw = doc.get("gateway", {})
    if not isinstance(gw, dict):
        raise r.fail("gateway", "must be a table")
    r.unknown(gw, {"cpu_quota", "cpus", "aqm", "ike_sas", "tun_queue"}, "gateway.")
    aqm = gw.get("aqm", False)
    if not isinstance(aqm, bool):
        raise r.fail("gateway.aqm", f"must be true or false, not {aqm!r}")
    tun_queue = gw.get("tun_queue")
    if isinstance(tun_queue, str) and tun_queue != "auto":
        raise r.fail("gateway.tun_queue", f'must be "auto" or a number of packets from 1 to '
                     f"10000, not {tun_queue!r}")  # fmt: skip
    if tun_queue != "auto":
        tun_queue = r.number(gw, "tun_queue", "gateway.", None, 1, 10_000, integer=True)
    ike_sas = gw.get("ike_sas", "one")
    if ike_sas not in IKE_SAS:
        raise r.fail("gateway.ike_sas", f"must be one of {', '.join(map(repr, IKE_SAS))} "
                     f"(the IKE daemons' N tunnels: CHILD_SAs under one IKE_SA, or an IKE_SA "
                     f"each), not {ike_sas!r}")  # fmt: skip
    import os

    ncpu = os.cpu_count() or 1
    cpus = gw.get("cpus", [])
    if not isinstance(cpus, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 0 <= c < ncpu for c in cpus
    ):
        raise r.fail("gateway.cpus", f"must be a list of CPU numbers 0..{ncpu - 1}, not {cpus!r}")
    soaker = doc.get("soaker", False)
    if not isinstance(soaker, bool):
        raise r.fail("soaker", f"must be true or false, not {soaker!r}")
    placement = doc.get("placement", "auto")
    if placement not in PLACEMENTS:
        raise r.fail("placement", f"must be one of {', '.join(map(repr, PLACEMENTS))} (traffic "
                     "and the IPsec on CPUs of their own, or every role on every CPU), not "
                     f"{placement!r}")  # fmt: skip
    stage_timing = doc.get("stage_timing", False)
    if not isinstance(stage_timing, bool):
        raise r.fail("stage_timing", f"must be true or false, not {stage_timing!r}")
    name = doc.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise r.fail("name", "must be a non-empty string")
    hosts = doc.get("hosts")
    if hosts is not None:
        if not isinstance(hosts, str) or not hosts:
            raise r.fail("hosts", "must be the path of a hosts file (docs/hosts.md)")
        if not Path(hosts).is_absolute() and source and not source.startswith("<"):
            hosts = str(Path(source).resolve().parent / hosts)
    return Scenario(
        name=name,
        source=source,
        text=text,
        topology=topology,
        backends=tuple(dict.fromkeys(backends)),
        configurations=configurations,
        links=links,
        workloads=workloads,
        repetitions=r.number(doc, "repetitions", "", 1, 1, 1000, integer=True),
        warmup_s=r.number(doc, "warmup_s", "", 1.0, 0, 600),
        seed=r.number(doc, "seed", "", 1, 0, 2**63 - 1, integer=True),
        gateway=Gateway(
            cpu_quota=r.number(gw, "cpu_quota", "gateway.", None, 0.01, ncpu),
            cpus=tuple(cpus),
            aqm=aqm,
            tun_queue=tun_queue,
            ike_sas=ike_sas,
        ),
        soaker=soaker,
        stage_timing=stage_timing,
        hosts=hosts,
        generator=generator,
        placement=placement,
        tunnels=tunnels,
    )


def _tunnels(r: _Reader, doc: dict[str, Any], topology: str,
             wls: tuple[Workload, ...]) -> tuple[int, ...]:  # fmt: skip
    """`tunnels`: a count or a list of counts, each from 1 to MOST_TUNNELS, on `line`;
    a workload that names a generator sending to one address cannot go past 1."""
    from ipsec_lab.testbed.tunnels import MOST_TUNNELS

    v = doc.get("tunnels", [1])
    v = [v] if isinstance(v, int) and not isinstance(v, bool) else v
    if (not isinstance(v, list) or not v
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in v)):  # fmt: skip
        raise r.fail("tunnels", f"must be a tunnel count or a list of them, not {v!r}")
    bad = [n for n in v if not 1 <= n <= MOST_TUNNELS]
    if bad:
        raise r.fail("tunnels", f"each count must be from 1 to {MOST_TUNNELS:,}, not {bad[0]}")
    if max(v) > 1 and topology != "line":
        raise r.fail("tunnels", f"more than one tunnel needs topology \"line\" (its gateways "
                     f"carry them), not {topology!r}")  # fmt: skip
    if max(v) > 1:
        for i, w in enumerate(wls):
            if workloads.of(w).spreads and w.generator in ("trafgen", "iperf3"):
                raise r.fail(
                    f"workloads[{i}].generator",
                    f"{w.generator} (the workload's or the scenario's `generator`) sends "
                    "to one address: over more than one tunnel only udp-gso (or auto) "
                    "spreads the traffic",
                )
    return tuple(dict.fromkeys(v))


def load(path: str | Path) -> Scenario:
    p = Path(path)
    if p.is_dir():
        raise ScenarioError(str(p), "(file)", "is a directory; give a scenario file (TOML)")
    try:
        text = p.read_text()
    except OSError as e:
        raise ScenarioError(str(p), "(file)", e.strerror or str(e)) from None
    except UnicodeDecodeError:
        raise ScenarioError(str(p), "(file)", "not text: a scenario is a TOML file") from None
    return parse(text, str(p))
