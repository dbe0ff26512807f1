"""The testbed's ceiling across campaigns: every field that sets plain forwarding's figure
is in the testbed key (and the names are not), and a campaign without `none` is judged
against the newest earlier campaign's `none` under the same key — never a later one,
another key's, or another measurement's — in the summary and in `ipsec-lab results`."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import cli
from ipsec_lab import ceiling, runner
from ipsec_lab.store import RunKey, Store
from ipsec_lab.testbed import Link
from ipsec_lab.traffic.workload import Workload

WHERE = {"node": "lab", "cpu": "x", "cpus": 2, "kernel": "6.1", "vm": None}
PLACED = {"placement": "auto", "traffic_cpus": [0], "dut_cpus": [1], "dut_shared_cores": False}


def _key(**change: Any) -> str:
    args: dict[str, Any] = {
        "where": WHERE, "topology": "line", "link": Link("l", rate_mbit=100.0),
        "flow": "f", "workload": Workload("rfc2544", size=64), "generator": "auto",
        "placement": PLACED, "outer_mtu": 1500,
    }  # fmt: skip
    args.update(change)
    return ceiling.testbed_key(**args)


def _other(value: Any) -> Any:
    """A value of the same kind as `value`, not equal to it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return (*value, 7)
    if value is None:
        return 3
    raise AssertionError(f"no other value for {value!r}")


def test_every_field_that_sets_the_ceiling_is_in_the_key_and_the_names_are_not() -> None:
    base = _key()
    assert base == _key()  # the same testbed: the same key
    link, wl = Link("l", rate_mbit=100.0), Workload("rfc2544", size=64)
    for f in dataclasses.fields(Link):
        changed = dataclasses.replace(link, **{f.name: _other(getattr(link, f.name))})
        assert (_key(link=changed) == base) is (f.name == "name"), f"link.{f.name}"
    for f in dataclasses.fields(Workload):
        other_wl = dataclasses.replace(wl, **{f.name: _other(getattr(wl, f.name))})
        assert (_key(workload=other_wl) == base) is (f.name == "label"), f"workload.{f.name}"
    for name in WHERE:
        assert _key(where={**WHERE, name: _other(WHERE[name])}) != base, f"where.{name}"
    for name in ("placement", "traffic_cpus", "dut_cpus"):
        v = PLACED[name]
        other = [*v, 5] if isinstance(v, list) else _other(v)
        assert _key(placement={**PLACED, name: other}) != base, f"placement.{name}"
    # whether the IPsec shared a core is the row's flag, not plain forwarding's ceiling
    assert _key(placement={**PLACED, "dut_shared_cores": True}) == base
    for name, value in (("topology", "clients"), ("flow", "g"), ("generator", "iperf3"),
                        ("outer_mtu", 1600)):  # fmt: skip
        assert _key(**{name: value}) != base, name
    assert _key(where={"hosts": {"gwA": "gw-a"}}) != base


def _record(s: Store, cid: int, backend: str, mbps: float, key: str, rep: int = 1,
            label: str = "ndr") -> None:  # fmt: skip
    x = {"mbps": mbps, "ndr_mbps": mbps, "seconds": 1.0, "testbed_key": key}
    cfg = "none" if backend == "none" else "esp:aes128gcm16"
    s.record(cid, RunKey(backend, cfg, "l", label, "f", rep), "done", time.time(),
             results=[(label, x)])  # fmt: skip


def _camp(s: Store, name: str) -> int:
    cid = s.new_campaign(name, f"{name}.toml", name, {"cpu": "x"})
    time.sleep(0.01)  # campaigns started apart, as runs of the lab are
    return cid


def _ours(s: Store, cid: int) -> dict[str, Any]:
    rows = runner.summarize(s.runs(cid), ceiling.earlier(s, cid))
    return next(r for r in rows if r["backend"] == "ours")


@pytest.mark.parametrize(("mbps", "bound"), [(91.0, True), (89.0, False)])
def test_a_campaign_without_none_is_judged_by_an_earlier_one_on_the_same_testbed(
    tmp_path: Path, mbps: float, bound: bool
) -> None:
    s = Store(tmp_path / "results.sqlite")
    k = _key()
    old = _camp(s, "older")  # plain forwarding: 99 and 101 → median 100
    _record(s, old, "none", 99.0, k, 1)
    _record(s, old, "none", 101.0, k, 2)
    _record(s, old, "none", 20.0, k, 1, label="ndr-1420")  # another measurement's
    first = _camp(s, "first")
    _record(s, first, "none", 300.0, k)
    # an older campaign whose `none` is of another testbed, then the one judged
    _record(s, _camp(s, "elsewhere"), "none", 5.0, _key(outer_mtu=1600))
    mine = _camp(s, "mine")
    _record(s, mine, "ours", mbps, k)
    _record(s, _camp(s, "later"), "none", mbps, k)  # after it: not its ceiling
    row = _ours(s, mine)
    # the newest earlier campaign with that key is "first" (300): 91 and 89 are far below
    assert row["testbed_bound"] is False
    assert row["testbed_ceiling_mbps"] == 300.0 and row["testbed_ceiling_campaign"] == first
    s.db.execute("DELETE FROM runs WHERE campaign_id = ?", (first,))
    s.db.commit()
    row = _ours(s, mine)  # now "older", the median of its two runs of this measurement
    assert row["testbed_ceiling_mbps"] == 100.0 and row["testbed_ceiling_campaign"] == old
    assert row["testbed_bound"] is bound
    said = f"plain forwarding's 100 Mbit/s on the same testbed in campaign {old}"
    assert (said in row["note"]) is bound, row["note"]


def test_a_campaign_with_none_of_its_own_is_judged_by_it_alone(tmp_path: Path) -> None:
    s = Store(tmp_path / "results.sqlite")
    k = _key()
    _record(s, _camp(s, "older"), "none", 95.0, k)
    mine = _camp(s, "mine")
    _record(s, mine, "none", 200.0, k)
    _record(s, mine, "ours", 94.0, k)
    row = _ours(s, mine)
    assert row["testbed_bound"] is False and row["testbed_ceiling_mbps"] == 200.0
    assert "testbed_ceiling_campaign" not in row


def test_no_key_or_no_match_leaves_the_row_unjudged(tmp_path: Path) -> None:
    s = Store(tmp_path / "results.sqlite")
    _record(s, _camp(s, "older"), "none", 95.0, _key())
    mine = _camp(s, "mine")
    _record(s, mine, "ours", 94.0, _key(generator="iperf3"))
    row = _ours(s, mine)
    assert row["testbed_bound"] is None and "testbed_ceiling_mbps" not in row
    # runs recorded before keys existed carry none: nothing is looked up for them
    s.db.execute("UPDATE results SET metrics = json_remove(metrics, '$.testbed_key')")
    s.db.commit()
    assert _ours(s, mine)["testbed_bound"] is None


def test_results_says_which_campaign_set_the_ceiling(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    s = Store(lab / "results.sqlite")
    k = _key()
    old = _camp(s, "plain")
    _record(s, old, "none", 100.0, k)
    mine = _camp(s, "ours-alone")
    _record(s, mine, "ours", 95.0, k)
    s.close()
    r = cli("results", str(mine), "--json", "--lab", str(lab))
    assert r.returncode == 0, r.stderr
    (row,) = [x for x in json.loads(r.stdout)["summary"] if x["backend"] == "ours"]
    assert row["testbed_bound"] is True and row["testbed_ceiling_campaign"] == old
    r = cli("results", str(mine), "--lab", str(lab), columns=200)
    assert r.returncode == 0, r.stderr
    assert f"campaign {old}" in " ".join(r.stdout.split()), r.stdout
