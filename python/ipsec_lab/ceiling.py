"""The testbed's own ceiling: what plain forwarding (`none`) carries on the same machine,
links, flow, workload and placement — the most the lab can show there, whatever the
IPsec. A capacity (a search's NDR, TCP bulk) within 10 % of it is *testbed-bound*: the
figure is the link's, the generator's or the machine's forwarding, not the IPsec's.

Where the campaign ran `none` itself, that is the ceiling. Where it did not (a campaign
of `ours` alone), the ceiling is taken from the newest earlier campaign in the same lab
directory that ran `none` under the same *testbed key*: a hash of everything that sets
plain forwarding's figure — the machine (its name, CPU model and count, kernel, VM) or
the real hosts (their ssh destinations), the topology, the link's shaping and MTU, the
flow, the workload's every parameter, the scenario's generator, the placement of traffic
and IPsec on CPUs, and the outer MTU the run found. Every row records its key; a row
judged against an earlier campaign's ceiling says which campaign in its note.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ipsec_lab import metrics

# a rate within 10 % of plain forwarding's on the same testbed is the testbed's
TESTBED_BOUND = 0.9


@dataclass(frozen=True)
class Ceiling:
    """Plain forwarding's rate where a row was measured; `campaign` None: this one's."""

    mbps: float
    campaign: int | None = None


def testbed_key(
    where: dict[str, Any],
    topology: str,
    link: Any,
    flow: str,
    workload: Any,
    generator: str,
    placement: dict[str, Any],
    outer_mtu: int | None,
) -> str:
    """The key of the testbed a run measured on (see the module's docstring): `where`
    is `environment.identity()` or the real hosts; `link` and `workload` are the scenario's
    dataclasses, their names left out (two scenarios may name one thing differently)."""
    parts = {
        "where": where, "topology": topology, "flow": flow, "generator": generator,
        "link": {k: v for k, v in dataclasses.asdict(link).items() if k != "name"},
        "workload": {k: v for k, v in dataclasses.asdict(workload).items() if k != "label"},
        "placement": {k: placement.get(k) for k in ("placement", "traffic_cpus", "dut_cpus")},
        "outer_mtu": outer_mtu,
    }  # fmt: skip
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def row_key(xs: list[dict[str, Any]]) -> str | None:
    """The testbed key the measurements of a summary row share (None: they have none,
    or not one)."""
    keys = {x.get("testbed_key") for x in xs}
    if len(keys) != 1:
        return None
    (k,) = keys
    return str(k) if k else None


def testbed_bound(row: dict[str, Any], ceiling: Ceiling | None) -> None:
    """Mark a capacity row testbed-bound when its rate is within 10 % of `ceiling`;
    `testbed_bound` None where nothing says (no ceiling known, a load the run was given,
    a transfer judged by its time, `none` itself). The ceiling is recorded with the row
    (`testbed_ceiling_mbps`, and `testbed_ceiling_campaign` when it is another
    campaign's)."""
    mine = row.get("mbps_median")
    if row["backend"] == "none" or row.get("transfer") or not mine or not ceiling:
        row["testbed_bound"] = None
        return
    row["testbed_ceiling_mbps"] = ceiling.mbps
    if ceiling.campaign is not None:
        row["testbed_ceiling_campaign"] = ceiling.campaign
    row["testbed_bound"] = mine >= TESTBED_BOUND * ceiling.mbps
    if row["testbed_bound"]:
        shown = metrics.BY_KEY["mbps"].show(ceiling.mbps)
        within = 100 - 100 * TESTBED_BOUND
        where = "here" if ceiling.campaign is None else (
            f"on the same testbed in campaign {ceiling.campaign}")  # fmt: skip
        note = (f"testbed-bound: within {within:.0f} % of plain forwarding's {shown} "
                f"{where} — the figure is the testbed's, not the IPsec's")  # fmt: skip
        row["note"] = "; ".join(x for x in (note, row.get("note")) if x)


Lookup = Callable[[str, str], "Ceiling | None"]


def earlier(store: Any, campaign: int) -> Lookup:
    """A lookup of the ceiling for (testbed key, measurement) from the newest campaign
    started before `campaign` in `store` whose done `none` runs measured it there: the
    median of their rates, as that campaign's summary has it; each campaign read once."""
    camp = store.campaign(campaign)
    before = float(camp["started"]) if camp else float("inf")
    read: dict[int, list[dict[str, Any]]] = {}

    def lookup(key: str, measurement: str) -> Ceiling | None:
        for cid in store.campaigns_with_none(key, before, campaign):
            if cid not in read:
                read[cid] = [x for r in store.runs(cid)
                             if r["backend"] == "none" and r["status"] == "done"
                             for x in r["results"]]  # fmt: skip
            xs = [x for x in read[cid]
                  if x.get("testbed_key") == key and x.get("label") == measurement]  # fmt: skip
            mbps = metrics.summarise_metrics(xs).get("mbps_median") if xs else None
            if mbps:
                return Ceiling(float(mbps), cid)
        return None

    return lookup
