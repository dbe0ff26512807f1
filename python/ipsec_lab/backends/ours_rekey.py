"""Rekeying ipsec-gw's SAs while traffic flows, made before it breaks (the `rekey`
workload, issue 44): every SA of every tunnel gets a fresh SPI and fresh keys in three
reloads (SIGHUP) of both gateways of each tunnel —

1. each gateway's new inbound SAs beside the old ones, its inbound policies naming both
   (`sa = ["in@1", "in"]`: the gateway lets either in, docs/gateway.md "Rekeying");
2. each gateway's new outbound SAs in place of the old, its outbound policies naming them;
3. the old inbound SAs gone, once what was sealed under them has arrived.

Each step waits until every gateway's workers hold what it asked — the SAs its stats
socket lists, by SPI, in each direction — before the next begins: a sender never seals
under an SA its peer's workers do not have yet. A reload the gateway refuses stops the
rollover with the gateway's reason. SPIs are drawn at random (RFC 4303 §2.1: 256 and up),
never one this run used before, so the wire tells each SA apart.
"""

from __future__ import annotations

import json
import secrets
import signal
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipsec_lab.backends.base import Unsupported, private_file
from ipsec_lab.testbed.build import LabError, tail
from ipsec_lab.traffic import steady

Doc = dict[str, Any]  # one gateway's config, as tomllib reads it
# old SPI -> (new SPI, new enc_key hex, new integ_key hex): one tunnel's SAs, both ways
Successors = dict[int, tuple[int, str, str]]
STEP_TIMEOUT_S = 10.0  # a step's reloads in every gateway's workers, at most
# between steps 2 and 3, until the old inbound SAs' counts have stood still this long
# (what was sealed under them has arrived: a link's delay, a queue), at most DRAIN_MAX_S
DRAIN_STILL_S, DRAIN_MAX_S = 0.25, 12.0
NO_BUNDLES = "rekey: one SA a tunnel (no bundles) so far"
POLL_S = 0.05  # how often a step's wait asks a gateway for its SA lists
MIN_SPI = 256  # RFC 4303 §2.1: 1-255 are reserved by IANA, 0 is never sent


def toml_value(v: object, key: str) -> str:
    """A value of the shapes the lab's configs hold: bool, int, printable ASCII str,
    list of them (anything else is refused, naming `key`)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str) and v.isascii() and v.isprintable():
        return json.dumps(v)  # a TOML basic string, for printable ASCII
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x, key) for x in v) + "]"
    raise LabError(f"rekey: the gateway config's {key} = {v!r}: not a value the lab writes")


def dumps(doc: Doc) -> str:
    """The config again as TOML: `[gateway]`, then each array of tables in its order."""
    out = []
    for table, value in doc.items():
        if isinstance(value, dict):
            out += [f"[{table}]", *(f"{k} = {toml_value(v, f'{table}.{k}')}"
                                    for k, v in value.items()), ""]  # fmt: skip
        elif isinstance(value, list) and all(isinstance(e, dict) for e in value):
            for i, e in enumerate(value):
                out += [f"[[{table}]]", *(f"{k} = {toml_value(v, f'{table}[{i}].{k}')}"
                                          for k, v in e.items()), ""]  # fmt: skip
        else:
            raise LabError(f"rekey: the gateway config's {table}: not a table the lab writes")
    return "\n".join(out)


def base_name(name: str) -> str:
    """An SA's name without its generation (`in@3` -> `in`)."""
    return name.split("@", 1)[0]


def add_inbound(doc: Doc, new: Successors, g: int) -> Doc:
    """Step 1: beside each inbound SA its successor; each inbound policy naming an old SA
    names its successor first, then it."""
    sas = doc["sa"]
    olds = {s["name"]: s for s in sas if s["direction"] == "in"}
    succ = {n: successor(s, new, g) for n, s in olds.items()}
    doc["sa"] = sas + list(succ.values())
    for p in doc["policy"]:
        if p["direction"] == "in" and isinstance(p.get("sa"), str) and p["sa"] in succ:
            p["sa"] = [succ[p["sa"]]["name"], p["sa"]]
    return doc


def switch_outbound(doc: Doc, new: Successors, g: int) -> Doc:
    """Step 2: each outbound SA replaced by its successor, its policies naming it."""
    renamed: dict[str, str] = {}
    sas = []
    for s in doc["sa"]:
        if s["direction"] == "out":
            t = successor(s, new, g)
            renamed[s["name"]] = t["name"]
            s = t
        sas.append(s)
    doc["sa"] = sas
    for p in doc["policy"]:
        if p["direction"] == "out" and p.get("sa") in renamed:
            p["sa"] = renamed[p["sa"]]
    return doc


def drop_old_inbound(doc: Doc) -> Doc:
    """Step 3: each inbound policy names its new SA alone; the old inbound SAs go."""
    gone: set[str] = set()
    for p in doc["policy"]:
        if p["direction"] == "in" and isinstance(p.get("sa"), list):
            gone.update(p["sa"][1:])
            p["sa"] = p["sa"][0]
    doc["sa"] = [s for s in doc["sa"] if not (s["direction"] == "in" and s["name"] in gone)]
    return doc


def successor(sa: Doc, new: Successors, g: int) -> Doc:
    """SA `sa` of generation `g`: its SPI and keys from `new`, all else as it was."""
    spi, enc, integ = new[int(sa["spi"])]
    return {**sa, "name": f"{base_name(sa['name'])}@{g}", "spi": spi, "enc_key": enc,
            "integ_key": integ}  # fmt: skip


def spis(doc: Doc, direction: str) -> set[int]:
    return {int(s["spi"]) for s in doc["sa"] if s["direction"] == direction}


@dataclass
class Gateway:
    """One running gateway as the rollover sees it."""

    key: str
    config: Path
    signal: Callable[[int], None]  # send it a signal
    listed: Callable[[], dict[str, set[int]]]  # "outbound"/"inbound" -> SPIs its workers hold
    counts: Callable[[list[int]], int]  # packets its inbound SAs of these SPIs opened so far
    log: Path


class Rollover:
    """Make-before-break rekeys of the gateways of each tunnel, one generation at a time."""

    # the steps in the order they run (a test runs 2 before 1: break before make)
    order: tuple[int, ...] = (1, 2, 3)

    def __init__(self, pairs: Iterable[tuple[Gateway, Gateway]]) -> None:
        self.pairs = list(pairs)
        self.generation = 0
        self.used: set[int] = set()
        for a, b in self.pairs:
            for gw in (a, b):
                doc = load(gw.config)
                self.used |= spis(doc, "in") | spis(doc, "out")

    def fresh_spi(self) -> int:
        while True:
            spi = secrets.randbelow(2**32 - MIN_SPI) + MIN_SPI
            if spi not in self.used:
                self.used.add(spi)
                return spi

    def successors(self, a: Doc, b: Doc) -> Successors:
        """A new SPI and keys for every SA between `a` and `b` (their outbound SAs are
        each other's inbound), the keys as long as the old ones."""
        new: Successors = {}
        for doc in (a, b):
            for s in doc["sa"]:
                if s["direction"] == "out":
                    new[int(s["spi"])] = (
                        self.fresh_spi(),
                        secrets.token_hex(len(s.get("enc_key", "")) // 2),
                        secrets.token_hex(len(s.get("integ_key", "")) // 2),
                    )
        return new

    def rekey(self) -> dict[str, Any]:
        """One rollover of every SA; its figures: the generation, the time each step took
        (till every gateway's workers held it) and the new SPIs."""
        self.generation += 1
        g = self.generation
        docs: dict[str, Doc] = {}
        news: dict[str, Successors] = {}
        for a, b in self.pairs:
            da, db = load(a.config), load(b.config)
            if da.get("bundle") or db.get("bundle"):
                raise Unsupported(NO_BUNDLES)
            for gw, d in ((a, da), (b, db)):
                if any(isinstance(p.get("sa"), list) for p in d.get("policy", [])):
                    raise LabError(f"rekey: ipsec-gw {gw.key}'s config names two SAs in a "
                                   "policy: a rollover did not finish (see its log)")  # fmt: skip
            new = self.successors(da, db)
            docs[a.key], docs[b.key] = da, db
            news[a.key] = news[b.key] = new
        gws = [gw for pair in self.pairs for gw in pair]
        steps: list[float] = []
        t0 = time.monotonic()
        for step in self.order:
            want: dict[str, dict[str, set[int]]] = {}
            old: dict[str, set[int]] = {}  # step 3: the inbound SPIs it takes away
            for gw in gws:
                doc, new = docs[gw.key], news[gw.key]
                old[gw.key] = spis(doc, "in")
                if step == 1:
                    add_inbound(doc, new, g)
                elif step == 2:
                    switch_outbound(doc, new, g)
                else:
                    drop_old_inbound(doc)
                want[gw.key] = {"inbound": spis(doc, "in"), "outbound": spis(doc, "out")}
                old[gw.key] -= want[gw.key]["inbound"]
            if step == 3:  # what was sealed under the old SAs has arrived, at every gateway
                drained(gws, old)
            s0 = time.monotonic()
            for gw in gws:
                private_file(gw.config, dumps(docs[gw.key]))  # in place: the gateway's fd
                gw.signal(signal.SIGHUP)
            for gw in gws:
                held(gw, want[gw.key], s0 + STEP_TIMEOUT_S)
            steps.append(time.monotonic() - s0)
        new_spis = sorted({v[0] for n in news.values() for v in n.values()})
        return {"generation": g, "seconds": time.monotonic() - t0, "step_seconds": steps,
                "spis": new_spis}  # fmt: skip


def drained(gws: list[Gateway], old: dict[str, set[int]]) -> None:
    """Until the packets each gateway opened under its inbound SAs `old[key]` have stood
    still for DRAIN_STILL_S, all gateways read together (every 50 ms: their workers
    publish every 100 ms while busy), at most DRAIN_MAX_S."""
    steady(lambda: [gw.counts(sorted(old[gw.key])) for gw in gws], DRAIN_STILL_S, POLL_S,
           DRAIN_MAX_S)  # fmt: skip


def load(path: Path) -> Doc:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise LabError(f"rekey: cannot read {path}: {e}") from None


def held(gw: Gateway, want: dict[str, set[int]], deadline: float) -> None:
    """Until `gw`'s workers list exactly the SPIs `want` says, each direction; past the
    deadline an error with what its log says (a refused reload names its reason)."""
    got: dict[str, set[int]] = {}
    while time.monotonic() < deadline:
        got = gw.listed()
        if all(got.get(d) == s for d, s in want.items()):
            return
        # every 50 ms: the workers publish every 100 ms, and each answer is work for the
        # gateway on the DUT's CPU (polled every 10 ms, the lab's own reads stole from it)
        time.sleep(POLL_S)
    raise LabError(
        f"rekey: ipsec-gw {gw.key}'s workers did not take the new SAs within "
        f"{STEP_TIMEOUT_S:g} s (want {_hex(want)}, have {_hex(got)}):\n{tail(gw.log)}"
    )


def _hex(d: dict[str, set[int]]) -> str:
    return "; ".join(f"{k} {', '.join(f'0x{x:08x}' for x in sorted(v))}" for k, v in d.items())
