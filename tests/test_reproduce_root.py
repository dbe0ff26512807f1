"""`ipsec-lab reproduce all --quick` for real (namespaces, our gateway, iperf3, nginx,
aiosmtpd), then the report it wrote, opened in headless Chromium. Needs root (CI runs as
root). The checks are of structure and plausibility — what must be true of any honest
run on any machine — not of tuned numbers.

The screenshot of the report is kept in `artifacts/report.png` (or
$IPSEC_LAB_ARTIFACTS), an artifact of the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipsec_lab import reproduce, runner
from ipsec_lab.store import Store
from ipsec_lab.testbed.build import leftovers

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    if os.geteuid() != 0:
        pytest.fail("the reproduction tests need root (as CI runs them)")
    before = set(leftovers()[0])
    # The main job's own command (`make run`), run as a newcomer would: from a working
    # directory of its own with a *relative* lab directory (a relative path once reached
    # nginx, which resolved it against its prefix: study 4 failed from a fresh clone).
    # Under `make test`, into `make run`'s own lab ($IPSEC_LAB_REPRODUCE_LAB): the main job
    # after it (`--if-changed`) then finds this build's campaigns and measures nothing twice.
    shared = os.environ.get("IPSEC_LAB_REPRODUCE_LAB")
    d = Path(shared).resolve() if shared else tmp_path_factory.mktemp("reproduce") / "lab"
    d.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(
        [sys.executable, "-m", "ipsec_lab.cli", "reproduce", "all", "--quick", "--lab", d.name,
         "--json"],
        capture_output=True, text=True, timeout=900, cwd=d.parent,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    out: dict[str, Any] = json.loads(p.stdout)
    yield d, out
    names, groups = leftovers()
    assert set(names) <= before, f"namespaces left: {set(names) - before}"
    assert not groups, f"cgroups left: {groups}"


def _summary(lab: Path, study: str, role: str) -> list[dict[str, Any]]:
    store = Store(lab / "results.sqlite")
    try:
        cid = reproduce.latest_campaigns(store)[study][role]
        return runner.summarize(store.runs(cid))
    finally:
        store.close()


def _row(rows: list[dict[str, Any]], **want: Any) -> dict[str, Any]:
    found = [r for r in rows if all(r.get(k) == v for k, v in want.items()) and "skipped" not in r]
    assert len(found) == 1, (want, found)
    return found[0]


def _per_payload(r: dict[str, Any]) -> float:
    """Wire bytes (source -> sink) per payload byte of a summary row."""
    payload_bytes = r["mbps_median"] * 1e6 / 8 * r["seconds_median"]
    return float(r["wire_up_bytes_median"]) / payload_bytes


def _report(lab: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((lab / "report" / "report.json").read_text())
    return data


def test_every_study_ran_its_campaigns_and_said_how_long(lab: tuple[Path, dict[str, Any]]) -> None:
    _, out = lab
    studies = {s["study"]: s for s in out["studies"]}
    assert set(studies) == {"ferrante2005", "tisovsky2013", "freeswan", "hadjichristofi2003"}
    assert set(studies["ferrante2005"]["campaigns"]) == {"today", "calibrate-ours", "limited-ours"}
    for s in studies.values():
        assert s["seconds"] > 0 and not s["skipped"]
        assert not s["failed"], s
    assert out["report"] and Path(out["report"]).exists()


def test_every_campaign_finished_with_no_failed_run(lab: tuple[Path, dict[str, Any]]) -> None:
    d, out = lab
    assert out["lab"] == str(d)  # the relative --lab, made absolute
    store = Store(d / "results.sqlite")
    try:
        # this run's campaigns (make run's lab may hold earlier ones), every one measured
        mine = {i for s in out["studies"] for i in s["campaigns"].values()}
        assert all(s["reused"] == [] for s in out["studies"]), out["studies"]
        camps = [c for c in store.campaigns() if c["id"] in mine]
        assert len(camps) == len(mine) == sum(len(s["campaigns"]) for s in out["studies"])
        for c in camps:
            assert c["status"] == "finished" and c["n_failed"] == 0, dict(c)
            # every planned run has an outcome stored (done, or skipped with the reason)
            assert c["n_runs"] == c["n_done"] + c["n_skipped"] > 0, dict(c)
            assert c["n_done"] > 0, dict(c)
    finally:
        store.close()


def test_study1_shapes_hold_on_a_100_mbit_link(lab: tuple[Path, dict[str, Any]]) -> None:
    d, _ = lab
    rows = _summary(d, "ferrante2005", "today")
    text = [r for r in rows if str(r["measurement"]).endswith("text")]
    none = _row(text, backend="none")
    # Plain TCP over a 100 Mbit/s tbf link: close to the link, never above it.
    assert 50 < none["mbps_median"] <= 100
    for cfg in ("esp:null-sha1", "esp:aes128-sha1", "ah:sha1+esp:aes128"):
        r = _row(text, backend="ours", configuration=cfg)
        # IPsec adds bytes on a link-bound path: never above the link, nor above plain
        # TCP's best run beyond that run's own spread (a 2-s run of plain TCP through the
        # tbf varies by 5 %: 91.2-95.8 Mbit/s measured, so the best of two may be the low
        # end — CI had it at 91.1 beside ours' 93.9, and at 91.2 beside ours' 94.1 with a
        # 2 % margin). The bytes IPsec adds are asserted below, per payload byte.
        assert 0 < r["mbps_median"] <= min(100.0, none["mbps_max"] * 95.8 / 91.2)
        assert r["ipsec_effort_median"] > 0  # the gateway did the work
        # ESP/AH overhead: more wire bytes per payload byte than plain forwarding
        assert _per_payload(r) > _per_payload(none)
    comp = _row(text, backend="ours", configuration="ipcomp+esp:aes128-sha1")
    rand = [r for r in rows if str(r["measurement"]).endswith("random")]
    incomp = _row(rand, backend="ours", configuration="ipcomp+esp:aes128-sha1")
    plain = _row(text, backend="ours", configuration="esp:aes128-sha1")
    # DEFLATE on English text: fewer bytes on the wire than ESP alone sends for the same
    # payload; on random bytes: none saved (each packet goes uncompressed).
    assert _per_payload(comp) < 0.8 * _per_payload(plain)
    assert _per_payload(incomp) >= 0.98 * _per_payload(plain)
    lim = _summary(d, "ferrante2005", "limited-ours")
    lim_es1 = _row(lim, backend="ours", configuration="esp:aes128-sha1")
    # The CPU quota bites: enc + SHA-1 slower than on the whole CPU.
    assert lim_es1["mbps_median"] < plain["mbps_median"]


def test_study2_fits_a_model_with_positive_terms(lab: tuple[Path, dict[str, Any]]) -> None:
    d, _ = lab
    # The forwarding rate at overload (RFC 2285 MFR, the median of repeated trials) and
    # the CPU time per packet the study fits. The loss-free rate beside them can be held
    # down by one dropped packet in one trial on a busy 2-core machine (seen: AES-128 at
    # 128 B, 6.4 instead of ~11 Mbit/s), which is why the study does not fit it.
    store = Store(d / "results.sqlite")
    try:
        cid = reproduce.latest_campaigns(store)["tisovsky2013"]["loss-free"]
        rows = [(r, x) for r in reproduce.load_runs(store, cid) for x in r["results"]]
    finally:
        store.close()
    mfr = {(r["configuration"], x["size"]): x["mfr_mbps"] for r, x in rows}
    ns = {(r["configuration"], x["size"]): x["plane_ns_per_packet"] for r, x in rows}
    for cfg in ("esp:aes128", "esp:3des"):
        assert mfr[(cfg, 128)] and mfr[(cfg, 1280)], mfr
        assert ns[(cfg, 1280)] > 0 and ns[(cfg, 128)] > 0, ns
    # By the gateways' own clocks, a 1280-byte 3DES packet costs more CPU than a 128-byte
    # one (~6.5 x: its per-byte term dominates). AES-128's per-packet term dominates: its
    # 1280 B / 128 B cost is 0.97-1.19 x (seen; 0.97 in a CI run), within one quick trial's
    # spread, so its sign is no property a run can show — that each byte costs it far less
    # than 3DES's, against 3DES in the same run, is.
    assert ns[("esp:3des", 1280)] > ns[("esp:3des", 128)], ns
    aes = ns[("esp:aes128", 1280)] / ns[("esp:aes128", 128)]
    assert aes < 0.5 * ns[("esp:3des", 1280)] / ns[("esp:3des", 128)], ns
    assert mfr[("esp:3des", 1280)] / 1280 < mfr[("esp:3des", 128)] / 128  # packets/s falls
    # ...and bit/s grows: 7-8 x with AES-128; 3DES's costs so much per byte that its
    # 1280 B capacity is only ~15 % above its 128 B one, about one quick trial's noise
    # (seen crossed: 2.51 and 2.36 Mbit/s), so the report must say when its fit is not
    # physical rather than this test assert that it never is
    assert mfr[("esp:aes128", 1280)] > 2 * mfr[("esp:aes128", 128)] > 0
    # The CPU one packet costs both gateways while saturated, from their own clocks and
    # counters: the quota over it is the rate a saturated pair can forward, so it lands
    # near what the overload trials delivered (a gateway left out of the sum, or its
    # packets counted twice, would be 2 x off).
    for r, x in rows:
        ns = x["plane_ns_per_packet"]
        assert ns and ns > 0, x
        cap = r["cpu_quota"] * 8 * x["size"] * 1e3 / ns
        assert 0.67 < cap / x["mfr_mbps"] < 1.5, (r["configuration"], x["size"], cap, x)
    an = next(s for s in _report(d)["studies"] if s["study"] == "tisovsky2013")
    params = an["tables"][0]["rows"]
    assert {r[0] for r in params} == {"ESP-aes128", "ESP-3des"}
    for r in params:
        # AES-128's 7-8 x growth must always fit; 3DES's may fail only with its reason
        assert r[3] != "—" or (r[0] == "ESP-3des" and r[7]), (r, an["tables"][0]["note"])
        if r[3] == "—":
            continue
        t_fix, r_alg = float(r[3]), float(r[4])
        flagged = f"{r[0]}: t_fix" in an["tables"][0]["note"]
        assert (t_fix > 0 and r_alg > 0) != flagged, (r, an["tables"][0]["note"])
        assert r[0] != "ESP-aes128" or not flagged, r
    # the estimator fitted: the gateways' CPU time per packet (ours has the clock)
    assert {r[10] for r in an["tables"][1]["rows"]} == {"CPU time"}
    assert an["plots"] and an["plots"][0]["lines"]


def test_study3_cycles_per_byte_rank_3des_above_authentication(
    lab: tuple[Path, dict[str, Any]],
) -> None:
    d, _ = lab
    an = next(s for s in _report(d)["studies"] if s["study"] == "freeswan")
    rows = {r[0]: r for r in an["tables"][0]["rows"]}
    sha1 = float(rows["IPsec + HMAC-SHA-1 (added per gateway)"][2])
    tdes = float(rows["IPsec + 3DES + HMAC (added per gateway)"][2])
    assert 0 < sha1 < tdes
    mhz = an["tables"][1]["rows"]
    # The MHz table scales with the link rate.
    assert [r[1] for r in mhz] == sorted(r[1] for r in mhz)
    assert float(mhz[-1][5]) > float(mhz[0][5])


def test_study4_ipsec_adds_load_and_time_for_both_clients(
    lab: tuple[Path, dict[str, Any]],
) -> None:
    d, _ = lab
    rows = _summary(d, "hadjichristofi2003", "transfers")
    for flow in ("fast-server", "slow-server"):
        for app in ("http", "smtp"):
            base = _row(
                rows, backend="none", flow=flow, measurement=f"{app}-1KB", link="ethernet-10"
            )
            sec = _row(rows, backend="ours", configuration="esp:3des-sha1", flow=flow,
                       measurement=f"{app}-1KB", link="ethernet-10")  # fmt: skip
            up = sec["wire_up_bytes_median"] + sec["wire_down_bytes_median"]
            b = base["wire_up_bytes_median"] + base["wire_down_bytes_median"]
            assert up > b  # ESP headers, padding and ICVs are bytes on the wire
    an = next(s for s in _report(d)["studies"] if s["study"] == "hadjichristofi2003")
    titles = " ".join(t["title"] for t in an["tables"])
    for what in ("network load", "transactions", "transfer time"):
        assert what in titles


def test_the_report_renders_in_chromium_with_every_plot_and_no_error(
    lab: tuple[Path, dict[str, Any]],
) -> None:
    d, _ = lab
    page = d / "report" / "report.html"
    html = page.read_text()
    # Self-contained: nothing fetched from elsewhere.
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)
    assert html.count("<figure class=plot") >= 8
    assert list((d / "report" / "tables").glob("*.csv"))
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed (the Makefile installs it)"
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--enable-logging=stderr", "--v=0"]  # fmt: skip
    p = subprocess.run(
        [*flags, "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    body = re.search(r"<body[^>]*>", p.stdout)
    assert body, p.stderr[-2000:]
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(0)))
    assert int(attrs["plots-total"]) == html.count("<figure class=plot")
    assert attrs["plots-ok"] == attrs["plots-total"]
    assert attrs["errors"] == "0"
    console = [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln]
    assert not console, console
    artifacts = Path(os.environ.get("IPSEC_LAB_ARTIFACTS", ROOT / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "report.png"
    shot.unlink(missing_ok=True)
    subprocess.run(
        [*flags, "--window-size=1280,4000", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert shot.stat().st_size > 50_000  # a page of text and plots, not a blank image
    print(f"report screenshot: {shot}")


def test_report_command_rewrites_the_report_from_chosen_campaigns(
    lab: tuple[Path, dict[str, Any]],
    tmp_path: Path,
) -> None:
    d, out = lab
    ids = [str(c) for c in next(s for s in out["studies"] if s["study"] == "freeswan")[
        "campaigns"].values()]  # fmt: skip
    p = subprocess.run(
        [sys.executable, "-m", "ipsec_lab.cli", "report", *ids, "--lab", str(d), "--out",
         str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [s["study"] for s in data["studies"]] == ["freeswan"]


def test_compare_puts_strongswan_beside_ours(tmp_path: Path) -> None:
    """`--compare ours,strongswan`: the same study on both, each with its own tables and
    plot, in one report."""
    before = set(leftovers()[0])
    lab = tmp_path / "lab"
    p = subprocess.run(
        [sys.executable, "-m", "ipsec_lab.cli", "reproduce", "freeswan", "--quick",
         "--compare", "ours,strongswan", "--lab", str(lab), "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    an = _report(lab)["studies"][0]
    titles = [t["title"] for t in an["tables"]]
    assert any("(ours)" in t for t in titles) and any("(strongswan)" in t for t in titles)
    by = {t["title"]: t for t in an["tables"]}
    for b in ("ours", "strongswan"):
        rows = {
            r[0]: r for r in by[f"Cycles per byte ({b}), beside NAI's Pentium II figures"]["rows"]
        }
        assert float(rows["IPsec + HMAC-SHA-1 (added per gateway)"][2]) > 0
    assert "ours:" in an["cause"] or "strongswan:" in an["cause"]
    assert set(leftovers()[0]) <= before
