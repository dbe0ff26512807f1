"""The results store and what reads it: finished runs kept and the campaign resumed, the
summary's medians and ratios, and `ipsec-lab results` as table, JSON and CSV."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import cli
from ipsec_lab import runner
from ipsec_lab.store import RunKey, Store


def _row(mbps: float, effort: float) -> dict[str, object]:
    return {
        "mbps": mbps, "seconds": 1.0, "payload_bytes": 1000, "effort_us_per_kb": effort,
        "trials": [{"offered_mbps": 10.0, "loss_pct": 0.0, "passed": True}],
        "cpu_series": [{"t": 0.5, "user": 0.1, "system": 0.2, "softirq": 0.0, "idle": 0.7}],
    }  # fmt: skip


def test_store_keeps_finished_runs_and_resumes_the_unfinished_campaign(tmp_path: Path) -> None:
    db = tmp_path / "lab" / "results.sqlite"
    s = Store(db)
    c = s.new_campaign("t", "t.toml", "text-1", {"cpu": "x"})
    k1 = RunKey("none", "none", "l", "tcp", "f", 1)
    k2 = RunKey("strongswan", "esp:aes128gcm16", "l", "tcp", "f", 1)
    k3 = RunKey("strongswan", "ah:sha1", "l", "tcp", "f", 1)
    s.record(c, k1, "done", time.time(), results=[("tcp", _row(9.5, 5.0))])
    s.record(c, k2, "failed", time.time(), reason="charon died")
    s.record(c, k3, "skipped", time.time(), reason="no AH")
    s.close()

    s = Store(db)  # as a new process would
    assert s.resumable("text-1") == c
    assert s.resumable("other text") is None
    assert s.finished_keys(c) == {k1, k3}  # the failed run is to be retried
    s.record(c, k2, "done", time.time(), results=[("tcp", _row(9.0, 7.0))])
    runs = s.runs(c)
    assert [r["status"] for r in runs] == ["done", "skipped", "done"]  # failed one replaced
    assert runs[0]["results"][0]["mbps"] == 9.5
    assert s.trials(runs[0]["id"]) == [{"offered_mbps": 10.0, "loss_pct": 0.0, "passed": True}]
    n = s.db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    assert n == 2
    s.set_status(c, "finished")
    assert s.resumable("text-1") is None


def test_summary_medians_spread_and_ratios_to_none() -> None:
    def run(backend: str, cfg: str, rep: int, mbps: float, eff: float) -> dict[str, object]:
        return {
            "backend": backend, "configuration": cfg, "link": "l", "flow": "f",
            "workload": "tcp", "repetition": rep, "status": "done", "reason": None,
            "results": [{"label": "tcp", "mbps": mbps, "effort_us_per_kb": eff, "seconds": 1.0,
                         "retransmits": 0}],
        }  # fmt: skip

    runs = [
        run("none", "none", 1, 10.0, 2.0),
        run("none", "none", 2, 12.0, 2.0),
        run("none", "none", 3, 11.0, 2.0),
        run("strongswan", "esp:aes128gcm16", 1, 5.0, 8.0),
        run("strongswan", "esp:aes128gcm16", 2, 6.0, 10.0),
        run("strongswan", "esp:aes128gcm16", 3, 7.0, 12.0),
    ]
    runs.append(
        {"backend": "strongswan", "configuration": "ah:sha1", "link": "l", "flow": "f",
         "workload": "tcp", "status": "skipped", "reason": "no AH", "results": []}
    )  # fmt: skip
    rows = {r["configuration"]: r for r in runner.summarize(runs)}  # type: ignore[arg-type]
    none, ss = rows["none"], rows["esp:aes128gcm16"]
    assert none["mbps_median"] == 11.0 and none["n"] == 3
    assert (ss["mbps_min"], ss["mbps_median"], ss["mbps_max"]) == (5.0, 6.0, 7.0)
    assert ss["mbps_vs_none"] == pytest.approx(6 / 11)
    assert ss["effort_vs_none"] == pytest.approx(5.0)
    assert ss["mbps_cv"] == pytest.approx(1 / 6)
    assert rows["ah:sha1"]["skipped"] == "no AH"
    # 6 of 11 Mbit/s: far from plain forwarding's ceiling; none itself is not judged
    assert ss["testbed_bound"] is False and "testbed-bound" not in ss["note"]
    assert none["testbed_bound"] is None


@pytest.mark.parametrize(("mbps", "bound"), [(9.8, False), (9.9, True), (9.89, False),
                                             (12.0, True), (5.0, False)])  # fmt: skip
def test_a_rate_within_10_percent_of_plain_forwarding_is_testbed_bound(
    mbps: float, bound: bool
) -> None:
    """The same link, flow and workload in the same campaign: `none`'s 11 Mbit/s is the
    testbed's ceiling; a row at 9.9 or more (90 %) is the testbed's figure. Another
    link's `none` says nothing of this one's."""

    def run(backend: str, link: str, mbps: float, wl: str = "ndr",
            extra: dict[str, object] | None = None) -> dict[str, object]:  # fmt: skip
        x = {"label": wl, "mbps": mbps, "seconds": 1.0, "ndr_mbps": mbps, **(extra or {})}
        return {"backend": backend, "configuration": "c", "link": link, "flow": "f",
                "workload": wl, "repetition": 1, "status": "done", "reason": None,
                "results": [x]}  # fmt: skip

    runs = [run("none", "l", 11.0), run("ours", "l", mbps), run("ours", "other", mbps)]
    # loads the run was given, not capacities: a fixed-rate UDP row (no search), a
    # latency row at a share of its own PDR, a soak at its NDR
    given = {"udp": {"offered_mbps": 11.0}, "lat": {"load_pct": 50}, "soak": {"held": True}}
    for wl, keys in given.items():
        runs += [run("none", "l", 11.0, wl, keys), run("ours", "l", mbps, wl, keys)]
        if wl == "udp":  # no search: no NDR
            for r in runs[-2:]:
                del r["results"][0]["ndr_mbps"]  # type: ignore[index]
    rows = {(r["backend"], r["link"], r["measurement"]): r
            for r in runner.summarize(runs)}  # type: ignore[arg-type]  # fmt: skip
    assert rows[("ours", "l", "ndr")]["testbed_bound"] is bound
    assert ("testbed-bound" in rows[("ours", "l", "ndr")]["note"]) is bound
    assert rows[("ours", "other", "ndr")]["testbed_bound"] is None  # no ceiling measured there
    for wl in given:
        assert rows[("ours", "l", wl)]["testbed_bound"] is None, wl


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=60, env=env)


def test_results_without_a_lab_says_so(tmp_path: Path) -> None:
    p = _cli("results", "--lab", str(tmp_path / "nolab"))
    assert p.returncode == 2 and "no results in" in p.stderr


def test_results_lists_and_exports_a_campaign(tmp_path: Path) -> None:
    s = Store(tmp_path / "results.sqlite")
    c = s.new_campaign("demo", "d.toml", "x", {"cpu": "y"})
    s.record(c, RunKey("none", "none", "l", "tcp", "f", 1), "done", time.time(),
             results=[("tcp", _row(9.5, 5.0))])  # fmt: skip
    s.close()
    p = _cli("results", "--lab", str(tmp_path), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)[0]["name"] == "demo"
    p = _cli("results", str(c), "--lab", str(tmp_path), "--csv")
    assert p.returncode == 0
    header, row = p.stdout.strip().splitlines()
    assert header.startswith("campaign_id,run_id,backend") and ",9.5," in row
    p = _cli("results", "99", "--lab", str(tmp_path))
    assert p.returncode == 2 and "no campaign 99" in p.stderr
