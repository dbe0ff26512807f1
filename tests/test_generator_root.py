"""The fast generator, latency under load and soak, for real: trafgen into namespaces,
the sink's nftables counter, irtt probes, a gateway stopped mid-soak. Needs root (CI
runs as root); each test leaves no namespace, qdisc or nftables table behind."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import cli
from ipsec_lab.backends.ours import Ours
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.testbed.placement import choose
from ipsec_lab.traffic import Meters, soak
from ipsec_lab.traffic.paced import (
    ETHERNET,
    GSO_ABOVE_PPS,
    NFT_TABLE,
    Paced,
    Trafgen,
    UdpGso,
)
from ipsec_lab.traffic.workload import Workload

pytestmark = pytest.mark.root


def _plain(label: str, fn: Any) -> dict[str, Any]:
    return fn()  # type: ignore[no-any-return]


def _qdisc(tb: Testbed, node: str, dev: str) -> dict[str, Any]:
    return json.loads(tb.run(node, ["tc", "-s", "-j", "qdisc", "show", "dev", dev, "root"]))[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("gen", "size", "rate"),
    [(Trafgen, 64, 20.0), (UdpGso, 64, 20.0), (UdpGso, 1000, 2400.0)],
    ids=["trafgen", "udp-gso", "udp-gso-gso"],
)
def test_what_a_paced_generator_sends_is_what_the_row_says_and_the_sink_counts(
    tmp_path: Path, gen: type[Paced], size: int, rate: float
) -> None:
    """Plain forwarding (no gateway): every packet the generator sent reaches the sink's
    counter (within 0.1 %), the count is the rate x the time asked, the pacing bucket's
    rate is the offered rate in frames, and closing removes the counter and the bucket.
    The sink's interface counts one buffer per packet: at 300 k packets/s, where udp-gso
    sends UDP GSO messages, none of them crossed the links whole (the bucket cut each
    into its datagrams); at 39 k/s it sends a datagram a message."""
    with Testbed(topology("line"), tmp_path / "run") as tb:
        flow = tb.topo.flows[0]
        rx0 = json.loads(tb.run("server", ["ip", "-s", "-j", "link", "show", "eth0"]))[0]
        tg = gen(tb, flow, flows=4)
        try:
            row = tg.trial(size, rate, 1.5)
            bucket = tg.bucket()
        finally:
            tg.close()
        rx1 = json.loads(tb.run("server", ["ip", "-s", "-j", "link", "show", "eth0"]))[0]
        pps = round(rate * 1e6 / (8 * size))
        if isinstance(tg, UdpGso):
            assert tg.gso is (pps > GSO_ABOVE_PPS), (pps, tg.gso)
        assert row["sender_packets"] == round(pps * 1.5), row
        got = row["sender_packets"] - row["lost_packets"] + row["extra_packets"]
        assert abs(got - row["sender_packets"]) <= 0.001 * row["sender_packets"], row
        # the sink's own interface saw each of them as a buffer of its own (a GSO buffer
        # that crossed whole would count once for many), and perhaps an ARP or two
        seen = rx1["stats64"]["rx"]["packets"] - rx0["stats64"]["rx"]["packets"]
        assert got <= seen <= row["sender_packets"] + 10, (got, seen, row)
        assert row["generator"] == gen.name and row["offered_mbps"] == rate
        # the bucket paced the frames (IP + Ethernet header) at the offered packet rate
        assert bucket["kind"] == "tbf"
        assert bucket["options"]["rate"] == pytest.approx(pps * (size + ETHERNET), rel=0.01)
        # ... and counted the flow's packets alone (an ARP or ping goes by another band)
        assert bucket["packets"] == row["sender_packets"] and bucket["drops"] == 0
        # nothing of the generator's is left on the nodes
        assert NFT_TABLE not in tb.run("server", ["nft", "list", "tables"])
        assert _qdisc(tb, "client", "eth0")["kind"] == "noqueue"


@pytest.mark.parametrize("generator", ["udp-gso", "trafgen", "iperf3"])
def test_a_search_finds_the_rate_of_a_shaped_link(tmp_path: Path, generator: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text(f"""
topology = "line"
backends = ["none"]
warmup_s = 0
generator = "{generator}"
[[links]]
name = "twenty"
rate_mbit = 20
[[workloads]]
kind = "rfc2544"
size = 1000
max_rate_mbit = 40
resolution_mbit = 1
trial_s = 2
""")
    p = cli("run", str(f), "--lab", str(tmp_path / "lab"), "--json", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (x,) = [x for r in json.loads(p.stdout)["runs"] for x in r["results"]]
    assert x["converged"] and x["generator"] == generator and not x["generator_bound"]
    assert "trials" not in x  # they live in their own table
    db = sqlite3.connect(tmp_path / "lab" / "results.sqlite")
    rows = db.execute("SELECT offered_mbps, loss_pct, passed FROM trials").fetchall()
    assert rows[0][0] == 40 and not rows[0][2]  # the top rate lost packets
    assert any(p for _, _, p in rows) and len(rows) <= 20
    # tbf counts Ethernet frames: 20 Mbit/s of 1014-byte frames is 19.72 of 1000-byte
    # packets. Its queue (50 ms at the rate + a 15,140-byte bucket) hides an excess of at
    # most queue / trial without a loss, so a 2 s trial may pass up to 0.56 Mbit/s above.
    capacity = 20 * 1000 / 1014
    queue_bits = (20e6 / 8 * 0.050 + 15_140) * 8
    assert capacity - 2.0 <= x["mbps"] <= capacity + queue_bits / 2 / 1e6, x


def test_latency_under_load_per_load_through_the_runner(tmp_path: Path) -> None:
    f = tmp_path / "l.toml"
    f.write_text("""
topology = "line"
backends = ["none"]
warmup_s = 0
[[links]]
name = "forty"
rate_mbit = 40
[[workloads]]
kind = "rfc2544"
size = 512
max_rate_mbit = 60
resolution_mbit = 2
trial_s = 1
[[workloads]]
kind = "latency"
size = 512
loads = [0, 50]
seconds = 2
""")
    p = cli("run", str(f), "--lab", str(tmp_path / "lab"), "--json", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)
    rows = {x["label"]: x for r in data["runs"] for x in r["results"]}
    search, idle, half = rows["rfc2544-512"], rows["latency-0%"], rows["latency-50%"]
    for x in (idle, half):
        assert x["probes_sent"] > 500 and x["probe_loss_pct"] < 5, x
        answered = x["probes_sent"] - x["probes_lost"]
        assert sum(c for _, c in x["histogram"]) == answered
        ps = [x[k] for k in ("rtt_min_us", "rtt_p50_us", "rtt_p90_us", "rtt_p99_us",
                             "rtt_p99_9_us", "rtt_max_us")]  # fmt: skip
        assert ps == sorted(ps)
        assert x["one_way_up_p50_us"] > 0 and x["one_way_clock"] == "one clock"
    # the loads are shares of the PDR this campaign's search found
    assert half["load_of_pdr_mbps"] == pytest.approx(search["pdr_mbps"])
    assert half["pdr_source"].startswith("this campaign's rfc2544")
    assert half["background_offered_mbps"] == pytest.approx(search["pdr_mbps"] / 2)
    assert half["background_mbps"] == pytest.approx(search["pdr_mbps"] / 2, rel=0.1)
    assert idle.get("background_mbps") is None and half["generator"] == "udp-gso"
    summary = {s["measurement"]: s for s in data["summary"]}
    assert summary["latency-50%"]["rtt_p99_us_median"] == half["rtt_p99_us"]
    # the report draws RTT against load and the distribution at the highest load
    p = cli("report", str(data["campaign"]), "--lab", str(tmp_path / "lab"), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    html = (tmp_path / "lab" / "report" / "report.html").read_text()
    assert "Latency under load, latency (forty): RTT against load" in html
    assert "RTT distribution at 50 % load" in html


def test_a_soak_reports_the_interval_its_gateway_stopped_in(tmp_path: Path) -> None:
    """ours soaked for 6 intervals of 2 s; at the start of interval 3 its gwA is stopped
    (SIGSTOP) for 1 s: that interval — and none before it — loses packets, the soak has
    not held, and every interval carries the gateways' memory. Placed as a campaign is
    (the gateways off trafgen's CPU): unplaced, trafgen's pacing on the gateways' core
    once lost packets in interval 1 in CI."""
    with Testbed(topology("line"), tmp_path / "run", placement=choose("auto")) as tb:
        gw = Ours()
        gw.start(tb, "esp:aes128gcm16")
        try:
            pid = gw._procs["gwA"].pid
            calls = {"n": 0}

            def stop_for_a_second() -> None:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(1.0)
                os.kill(pid, signal.SIGCONT)

            from ipsec_lab import meters

            def procs() -> tuple[float, int]:
                # read at the soak's start and at each interval's end: the 4th read is
                # the end of interval 2, the start of interval 3
                calls["n"] += 1
                if calls["n"] == 4:
                    threading.Thread(target=stop_for_a_second, daemon=True).start()
                return meters.process_cpu_s(gw.pids()), meters.rss_bytes(gw.pids())

            w = Workload("soak", size=1024, rate_mbit=20.0, load_pct=None, minutes=0.2,
                         interval_s=2.0, probe_interval_ms=10.0)  # fmt: skip
            (row,) = soak.soak(tb, tb.topo.flows[0], w, Meters(_plain, None, procs), 0)
        finally:
            os.kill(pid, signal.SIGCONT)
            gw.stop(tb)
    series = row["series"]
    assert len(series) == 6 and row["intervals"] == 6
    assert not row["held"] and row["first_failed_interval"] == 3, series
    assert all(s["loss_pct"] == 0 for s in series[:3]), series
    # a second's traffic at 20 Mbit/s of 1024 B is ~2400 packets: the TUN queue holds 500
    assert series[3]["sent_packets"] - series[3]["received_packets"] > 1000
    assert all(s["ipsec_rss_bytes"] > 0 for s in series)
    assert row["rss_growth_bytes_per_hour"] is not None and row["generator"] == "udp-gso"


def _nice(pid: int) -> int:
    """Process `pid`'s nice value (field 19 of /proc/PID/stat, after its name)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def _loads_and_probes() -> dict[str, dict[int, int]]:
    """Now: the nice values of the lab's load senders and of irtt, by PID and kind
    (`udpsend`: udp-gso's sender by its script among its arguments; `trafgen`, `iperf3`,
    `irtt` by name)."""
    out: dict[str, dict[int, int]] = {"udpsend": {}, "trafgen": {}, "iperf3": {}, "irtt": {}}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            args = (d / "cmdline").read_bytes().split(b"\0")
            if any(Path(a.decode(errors="replace")).name == "udpsend.py" for a in args):
                out["udpsend"][int(d.name)] = _nice(int(d.name))
            elif comm in out:
                out[comm][int(d.name)] = _nice(int(d.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return out


def _watched(fn: Any) -> tuple[Any, dict[str, dict[int, int]]]:
    """`fn()`'s result and every load sender and probe seen while it ran (every 20 ms)."""
    seen: dict[str, dict[int, int]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for kind, pids in _loads_and_probes().items():
                seen.setdefault(kind, {}).update(pids)
            time.sleep(0.02)

    th = threading.Thread(target=watch)
    th.start()
    try:
        return fn(), seen
    finally:
        stop.set()
        th.join()


@pytest.mark.parametrize("generator", ["udp-gso", "trafgen", "tcp"])
def test_a_load_beside_latency_probes_runs_at_the_lowest_priority(
    tmp_path: Path, generator: str
) -> None:
    """Beside irtt's probes (latency, and a soak's), the load's senders run at nice 19 and
    the probes at the default: on the traffic CPU a woken probe does not wait for the
    load's process (this kernel let it wait for the sender's tick: p99 4 ms beside 30
    Mbit/s of 64-B packets through plain forwarding, against 0.5-1 ms so). The same
    generator measuring alone (a trial) runs at the default priority."""
    from ipsec_lab import backends
    from ipsec_lab.traffic import latency
    from ipsec_lab.traffic.generator import make

    with Testbed(topology("line"), tmp_path / "run", placement=choose("auto")) as tb:
        none = backends.make("none")
        none.start(tb, "none")
        flow = tb.topo.flows[0]
        try:
            if generator == "tcp":
                w = Workload("latency", background="tcp", seconds=1.0)
            else:
                w = Workload("latency", size=256, loads=(20,), seconds=1.0,
                             generator=generator)  # fmt: skip
            rows, seen = _watched(lambda: latency.latency(
                tb, flow, w, _plain, 0, lambda size: (10.0, "given")))  # fmt: skip
            assert rows and all(r["probes_sent"] > 500 for r in rows), rows
            senders = seen["iperf3"] if generator == "tcp" else seen[generator.replace(
                "udp-gso", "udpsend")]  # fmt: skip
            # (iperf3: the client, and the server the load's own: both ends of each stream)
            assert len(senders) >= (2 if generator == "tcp" else 1), seen
            assert set(senders.values()) == {19}, seen
            assert seen["irtt"] and set(seen["irtt"].values()) == {0}, seen
            if generator != "tcp":
                # a soak's load beside its probes too
                s = Workload("soak", size=256, rate_mbit=5.0, load_pct=None, minutes=0.05,
                             interval_s=1.0, probe_interval_ms=10.0,
                             generator=generator)  # fmt: skip
                (row,), seen = _watched(lambda: soak.soak(tb, flow, s, _plain, 0))
                assert row["intervals"] >= 2 and row["series"], row
                mine = seen[generator.replace("udp-gso", "udpsend")]
                assert mine and set(mine.values()) == {19}, seen
                # and alone, measuring: the default
                gen = make(tb, flow, generator, 1)
                try:
                    trial, seen = _watched(lambda: gen.trial(256, 5.0, 1.0))
                finally:
                    gen.close()
                assert trial["sender_packets"] > 0, trial
                mine = seen[generator.replace("udp-gso", "udpsend")]
                assert mine and set(mine.values()) == {0}, seen
        finally:
            none.stop(tb)
