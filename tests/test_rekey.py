"""The rekey workload's parts that need no testbed: the rollover's three configs of each
gateway (checked by the real `ipsec-gw --check`, and against each other: a sender's new
SA is its peer's new inbound one, fresh SPI, fresh keys), the blocked-time arithmetic and
the scenario's keys. The rekey under load itself: tests/test_rekey_root.py."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ipsec_lab import scenario
from ipsec_lab.backends.ours import gateway_config, layers
from ipsec_lab.backends.ours_rekey import (
    MIN_SPI,
    Gateway,
    Rollover,
    add_inbound,
    drop_old_inbound,
    dumps,
    switch_outbound,
)
from ipsec_lab.backends.sa_plan import fresh_keys
from ipsec_lab.testbed import topology
from ipsec_lab.traffic import rekey
from ipsec_lab.traffic.workload import Workload

GW = Path(__file__).resolve().parents[1] / "target" / "release" / "ipsec-gw"


def _configs(configuration: str, more: int = 0) -> dict[str, str]:
    t = topology("line").tunnels[0]
    ls = layers(configuration)
    keys = fresh_keys(ls)
    extra = [(f"10.11.{j}.0/24", f"10.12.{j}.0/24", fresh_keys(ls)) for j in range(more)]
    return {n: gateway_config(n, t, ls, keys, Path(f"/run/{n}.sock"), more=extra)
            for n in ("gwA", "gwB")}  # fmt: skip


def _check(tmp: Path, name: str, text: str) -> None:
    conf = tmp / f"{name}.toml"
    conf.write_text(text)
    conf.chmod(0o600)
    p = subprocess.run([str(GW), "--config", str(conf), "--check"], capture_output=True,
                       text=True, timeout=30)  # fmt: skip
    assert p.returncode == 0 and "usable" in p.stdout + p.stderr, f"{name}:\n{text}\n{p.stderr}"
    assert "warning" not in p.stderr, p.stderr  # no SA left unused, none overlapping


def _by_spi(doc: dict[str, Any], direction: str) -> dict[int, tuple[str, str]]:
    return {int(s["spi"]): (s["enc_key"], s["integ_key"]) for s in doc["sa"]
            if s["direction"] == direction}  # fmt: skip


@pytest.mark.parametrize(("configuration", "more"),
                         [("esp:aes128gcm16", 0), ("esp:aes256-sha256", 0),
                          ("esp:aes128gcm16", 3)])  # fmt: skip
def test_each_step_of_a_rollover_is_a_config_the_gateway_takes(
    tmp_path: Path, configuration: str, more: int
) -> None:
    """Both gateways' configs after each of the three steps pass `ipsec-gw --check` with
    no warning; step 1 lets both SAs in; at the end each gateway's outbound SAs are its
    peer's inbound ones (SPI and keys), every one new — an SPI no earlier SA had, 256 or
    more, keys of the old lengths but not the old keys — and the TOML round-trips."""
    texts = _configs(configuration, more)
    docs = {n: tomllib.loads(t) for n, t in texts.items()}
    for n, d in docs.items():
        assert tomllib.loads(dumps(d)) == d, n
    old = {n: (_by_spi(d, "out"), _by_spi(d, "in")) for n, d in docs.items()}
    gws = [Gateway(n, tmp_path / f"{n}.toml", lambda s: None, dict, len, tmp_path / "log")
           for n in docs]  # fmt: skip
    for gw in gws:
        gw.config.write_text(texts[gw.key])
    roll = Rollover([(gws[0], gws[1])])
    new = roll.successors(docs["gwA"], docs["gwB"])
    assert len(new) == 2 * (1 + more)
    for step in (1, 2, 3):
        for n, d in docs.items():
            if step == 1:
                add_inbound(d, new, 1)
                ins = [p for p in d["policy"] if p["direction"] == "in"]
                assert all(isinstance(p["sa"], list) and len(p["sa"]) == 2 for p in ins)
            elif step == 2:
                switch_outbound(d, new, 1)
            else:
                drop_old_inbound(d)
            _check(tmp_path, f"{n}-step{step}", dumps(d))
    a, b = docs["gwA"], docs["gwB"]
    assert _by_spi(a, "out") == _by_spi(b, "in") and _by_spi(b, "out") == _by_spi(a, "in")
    before = set(old["gwA"][0]) | set(old["gwA"][1])
    for n, d in docs.items():
        for direction, was in zip(("out", "in"), old[n], strict=True):
            now = _by_spi(d, direction)
            assert len(now) == len(was) and not set(now) & before, (n, direction)
            assert all(spi >= MIN_SPI for spi in now)
            assert {len(e) for e, _ in now.values()} == {len(e) for e, _ in was.values()}
            assert not {e for e, _ in now.values()} & {e for e, _ in was.values()}
        assert all("@1" in s["name"] for s in d["sa"])


def test_a_rollover_refuses_bundles() -> None:
    from ipsec_lab.backends.base import Unsupported

    texts = _configs("esp:aes128gcm16+ipcomp")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        gws = []
        for n, t in texts.items():
            (Path(d) / n).write_text(t)
            gws.append(Gateway(n, Path(d) / n, lambda s: None, dict, len, Path(d) / "log"))
        with pytest.raises(Unsupported, match="no bundles"):
            Rollover([(gws[0], gws[1])]).rekey()


def test_blocked_time_is_the_streams_loss_at_the_offered_packet_rate() -> None:
    """1,000 packets/s, 4 rekeys, the rekey stream 100 packets short: 25 ms blocked a
    rekey; the control lost 10 of 3,000, so the rekey stream's 8,000 would have lost
    26.7 anyway — the excess 73.3 packets, 18.3 ms a rekey."""
    series = [{"index": i, "rekey_seconds": 0.2 + i / 10} for i in range(4)]
    stream = {"sent_packets": 8000, "lost_packets": 100, "seconds": 8.0, "mbps": 4.0}
    control = {"sent_packets": 3000, "lost_packets": 10, "seconds": 3.0}
    w = Workload("rekey", size=512, rekey_s=2.0)
    r = rekey.row(w, series, 4.096, "rate_mbit", 1000, stream, control)
    assert r["rekeys"] == 4 and r["lost_packets"] == 100 and r["control_lost_packets"] == 10
    assert r["blocked_ms_per_rekey"] == pytest.approx(25.0)
    assert r["blocked_ms_per_rekey_excess"] == pytest.approx((100 - 10 * 8000 / 3000) / 4)
    assert r["blocked_resolution_ms"] == pytest.approx(1.0)
    assert r["rekey_seconds_median"] == pytest.approx(0.35)
    assert r["received_packets"] == 7900 and r["loss_pct"] == pytest.approx(1.25)


def test_a_config_value_the_lab_does_not_write_is_refused_by_name() -> None:
    from ipsec_lab.testbed.build import LabError

    doc = {"gateway": {"tun": "ipsec0"}, "sa": [{"name": "in\u00e9"}]}
    with pytest.raises(LabError, match=r"sa\[0\]\.name"):
        dumps(doc)
    with pytest.raises(LabError, match=r"gateway\.mtu"):
        dumps({"gateway": {"mtu": 1.5}})


def test_the_scenario_keys_of_a_rekey() -> None:
    def one(extra: str) -> Workload:
        sc = scenario.parse(f'[[workloads]]\nkind = "rekey"\n{extra}', "r.toml")
        return sc.workloads[0]

    w = one("")
    assert (w.minutes, w.rekey_s, w.load_pct) == (1.0, 5.0, 50.0)
    assert one("rate_mbit = 20").load_pct is None
    for extra, key in (("rekey_s = 61", "rekey_s"), ("rate_mbit = 5\nload_pct = 10", "load_pct"),
                       ("rekey_s = 0.5", "rekey_s"), ("interval = 3", "interval")):  # fmt: skip
        with pytest.raises(scenario.ScenarioError, match=key):
            one(extra)
