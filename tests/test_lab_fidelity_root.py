"""The lab's figures are the IPsec's, for real (needs root). Placement: in a testbed placed
traffic on CPU 0 and the IPsec on CPU 1, each process's allowed CPUs (/proc/PID/status)
and each wire end's RPS mask are its role's; a campaign records where it ran in every row,
and a run with placement off is flagged SHARED CORES in its row, its summary and
`results --csv`. Testbed ceiling: on a link slower than the gateway, its figure is marked
testbed-bound beside plain forwarding's."""

from __future__ import annotations

import csv
import io
import json
import os
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
from ipsec_lab.traffic.paced import Trafgen, UdpGso
from netutil import running

# The lab tests' own check: no namespace, cgroup or process of a test left behind.

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placement needs 2 CPUs"),
]


def _cpus_allowed(status: str) -> set[int]:
    """The CPUs in a /proc/PID/status text's Cpus_allowed_list (`0-1,4`)."""
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            out: set[int] = set()
            for part in line.split(":", 1)[1].strip().split(","):
                lo, _, hi = part.partition("-")
                out |= set(range(int(lo), int(hi or lo) + 1))
            return out
    raise AssertionError(f"no Cpus_allowed_list in {status[:200]!r}")


def _udpsend() -> list[int]:
    """The PIDs of udp-gso's senders running now: an argument of theirs is the script
    itself (a pytest given tests/test_udpsend.py is not one)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                args = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(Path(a.decode(errors="replace")).name == "udpsend.py" for a in args):
                out.append(int(d.name))
    return out


def _allowed(pid: int) -> set[int]:
    """The CPUs `pid` may run on, as the kernel says."""
    return _cpus_allowed(Path(f"/proc/{pid}/status").read_text())


def test_each_role_runs_on_its_cpus_and_the_kernel_receives_there(tmp_path: Path) -> None:
    placement = choose("auto")
    traffic, dut = set(placement.traffic), set(placement.dut)
    assert placement.placed and not traffic & dut
    ours = Ours()
    with Testbed(topology("line"), tmp_path / "run", placement=placement) as tb:
        # every wire end's receive queue: a gateway's on the IPsec's CPUs, the ends' on
        # the traffic's (the mask sysfs shows is the one written, in hexadecimal)
        for w in tb.topo.wires:
            for node, ifname in ((w.a, w.a_if), (w.b, w.b_if)):
                want = placement.dut if node in tb.topo.ipsec_nodes else placement.traffic
                got = tb.run(node, ["cat", f"/sys/class/net/{ifname}/queues/rx-0/rps_cpus"])
                assert int(got.strip().replace(",", ""), 16) == sum(1 << c for c in want), (
                    node, ifname, got)  # fmt: skip
        ours.start(tb, "esp:aes128gcm16")
        try:
            gateways = ours.pids()
            assert len(gateways) == 2
            for pid in gateways:  # the gateway process and every thread it started
                for task in Path(f"/proc/{pid}/task").iterdir():
                    assert _allowed(int(task.name)) == dut, (pid, task.name)
            # each paced generator while it sends, seen from outside: trafgen by its
            # name, udp-gso's sender (a Python) by its script on its command line
            for gen, mine in ((Trafgen, lambda: running("trafgen")), (UdpGso, _udpsend)):
                seen: dict[int, set[int]] = {}
                stop = threading.Event()

                def watch(find: Any = mine, seen: dict[int, set[int]] = seen,
                          stop: threading.Event = stop) -> None:  # fmt: skip
                    while not stop.is_set():
                        for pid in find():
                            try:
                                seen[pid] = _allowed(pid)
                            except (OSError, AssertionError):
                                pass
                        time.sleep(0.02)

                th = threading.Thread(target=watch)
                th.start()
                tg = gen(tb, tb.topo.flows[0], flows=2)
                try:
                    row = tg.trial(64, 5.0, 1.0)
                finally:
                    stop.set()
                    th.join()
                    tg.close()
                assert row["sender_packets"] > 0 and row["lost_packets"] == 0, (gen, row)
                assert seen and all(cpus <= traffic for cpus in seen.values()), (gen, seen)
            # a program the lab runs in a node (not the IPsec's): the traffic's CPUs
            mine = tb.run("client", ["sh", "-c", "cat /proc/self/status"])
            assert _cpus_allowed(mine) == traffic
            # ... and one of the IPsec's: the IPsec's CPUs
            theirs = tb.run("gwA", ["sh", "-c", "cat /proc/self/status"], ipsec=True)
            assert _cpus_allowed(theirs) == dut
        finally:
            ours.stop(tb)


def test_host_to_host_ipsec_processes_are_the_ipsecs_whatever_their_node(tmp_path: Path) -> None:
    """In `clients` only the slow client is CPU-limited, but every node does IPsec: the
    gateways of the server and of both clients run on the IPsec's CPUs."""
    placement = choose("auto")
    ours = Ours()
    with Testbed(topology("clients"), tmp_path / "run", placement=placement) as tb:
        ours.start(tb, "esp:aes128gcm16")
        try:
            pids = ours.pids()
            assert len(pids) == 4  # the server runs one per tunnel
            assert all(_allowed(pid) == set(placement.dut) for pid in pids)
        finally:
            ours.stop(tb)


CAMPAIGN = """
name = "placed"
topology = "line"
backends = ["none"]
warmup_s = 0
{extra}
[[workloads]]
kind = "udp"
size = 1000
rate_mbit = 20
seconds = 1
"""


def test_every_row_says_where_it_ran_and_a_run_placed_off_is_flagged(tmp_path: Path) -> None:
    placement = choose("auto")
    for extra, shared in (("", False), ('placement = "off"', True)):
        lab = tmp_path / ("off" if shared else "auto")
        f = tmp_path / "s.toml"
        f.write_text(CAMPAIGN.format(extra=extra))
        p = cli("run", str(f), "--lab", str(lab), "--json", timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        doc = json.loads(p.stdout)
        (x,) = [x for r in doc["runs"] for x in r["results"]]
        assert x["dut_shared_cores"] is shared
        if shared:
            assert (x["placement"], x["traffic_cpus"], x["dut_cpus"]) == ("off", [], [])
            assert doc["summary"][0]["dut_shared_runs"] == 1
            assert "SHARED CORES in 1 of 1 runs" in doc["summary"][0]["note"]
            assert "placement off" in doc["summary"][0]["note"]
        else:
            assert x["placement"] == "auto"
            assert (x["traffic_cpus"], x["dut_cpus"]) == (list(placement.traffic),
                                                          list(placement.dut))  # fmt: skip
            assert doc["summary"][0]["dut_shared_runs"] == 0
            assert "SHARED CORES" not in doc["summary"][0]["note"]
        # what ran was placed so: the generator on the traffic's CPUs (the testbed's log
        # writes it as the `taskset` command with the same effect)
        log = next(lab.rglob("commands.log")).read_text()
        # (auto's generator here: udp-gso, its sender the script udpsend.py)
        sends = [ln for ln in log.splitlines() if "udpsend.py" in ln]
        assert sends, log[-2000:]
        tasksets = [ln for ln in sends if "taskset" in ln]
        traffic = ",".join(map(str, placement.traffic))
        assert bool(tasksets) is not shared, log[-2000:]
        assert all(f"taskset -c {traffic} " in ln for ln in tasksets)
        out = cli("results", "1", "--lab", str(lab), "--csv")
        assert out.returncode == 0, out.stderr
        (rec,) = list(csv.DictReader(io.StringIO(out.stdout)))
        assert rec["dut_shared_cores"] == str(shared)


def test_a_gateway_on_a_link_slower_than_it_is_marked_testbed_bound(tmp_path: Path) -> None:
    """A 10 Mbit/s link carries what `ours` easily seals: its TCP rate is the link's,
    within 10 % of plain forwarding's on the same link — testbed-bound; on the unshaped
    link beside it ours is far below plain forwarding, and not marked."""
    f = tmp_path / "s.toml"
    f.write_text("""
name = "ceiling"
topology = "line"
backends = ["none", "ours"]
warmup_s = 0.5
links = ["ethernet-10", "unshaped"]
[[workloads]]
kind = "tcp"
seconds = 3
""")
    p = cli("run", str(f), "--lab", str(tmp_path / "lab"), "--json", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {(r["backend"], r["link"]): r for r in json.loads(p.stdout)["summary"]}
    slow, fast = rows[("ours", "ethernet-10")], rows[("ours", "unshaped")]
    none_slow = rows[("none", "ethernet-10")]["mbps_median"]
    assert slow["mbps_median"] >= 0.9 * none_slow, (slow, none_slow)
    assert slow["testbed_bound"] is True and slow["note"].startswith("testbed-bound")
    # ours through veths is a fraction of the kernel's plain forwarding (0.37 x measured)
    assert fast["mbps_median"] < 0.9 * rows[("none", "unshaped")]["mbps_median"]
    assert fast["testbed_bound"] is False and "testbed-bound" not in fast["note"]
    assert rows[("none", "unshaped")]["testbed_bound"] is None
    # one testbed key for both backends on a link, another for the other link
    assert slow["testbed_key"] == rows[("none", "ethernet-10")]["testbed_key"]
    assert slow["testbed_key"] != fast["testbed_key"] and slow["testbed_key"]
    # a later campaign of ours alone, under another name, on the slow link: judged by
    # the first campaign's plain forwarding there (the same machine, link and workload)
    f.write_text(f.read_text().replace('"ceiling"', '"ours-alone"')
                 .replace('["none", "ours"]', '["ours"]')
                 .replace('["ethernet-10", "unshaped"]', '["ethernet-10"]'))  # fmt: skip
    p = cli("run", str(f), "--lab", str(tmp_path / "lab"), "--json", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (alone,) = json.loads(p.stdout)["summary"]
    assert alone["backend"] == "ours" and alone["testbed_key"] == slow["testbed_key"]
    assert alone["testbed_ceiling_campaign"] == 1
    assert alone["testbed_ceiling_mbps"] == none_slow
    assert alone["testbed_bound"] is True and "in campaign 1" in alone["note"], alone["note"]


def test_a_links_mtu_is_applied_recorded_alike_and_a_fragmenting_tunnel_named(
    tmp_path: Path,
) -> None:
    """A link with `mtu = 1600` and one of the default 1500 (a real link's): every
    backend's rows record the MTU the gateways' link has (read from the interface);
    ours-udp's TUN (`mtu = "auto"`) offers what fits whole — 1538 B on the first, 1438 on
    the second, as the model works it out — and no summary says FRAGMENTING."""
    f = tmp_path / "s.toml"
    f.write_text("""
name = "mtu"
topology = "line"
backends = ["none", "ours-udp"]
warmup_s = 0
[[links]]
name = "roomy"
mtu = 1600
[[links]]
preset = "unshaped"
[[workloads]]
kind = "udp"
size = 1000
rate_mbit = 10
seconds = 1
""")
    p = cli("run", str(f), "--lab", str(tmp_path / "lab"), "--json", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    rows = {(r["backend"], r["link"]): r for r in doc["summary"]}
    for run in doc["runs"]:
        for x in run["results"]:
            assert x["link_mtu"] == (1600 if run["link"] == "roomy" else 1500), (run, x)
    got = {(r["backend"], r["link"], x["largest_whole_inner"], x.get("inner_mtu"))
           for r in doc["runs"] for x in r["results"]}  # fmt: skip
    assert got == {
        ("none", "roomy", 1600, None),
        ("none", "unshaped", 1500, None),
        ("ours-udp", "roomy", 1538, 1538),
        ("ours-udp", "unshaped", 1438, 1438),
    }
    for r in rows.values():
        assert "FRAGMENTING" not in r["note"], r
