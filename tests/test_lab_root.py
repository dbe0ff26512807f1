"""The lab for real: namespaces, veth, tc, iperf3, strongSwan, nginx, aiosmtpd — through
`ipsec-lab run` itself. Needs root (CI runs as root). Each test checks, after it, that no
namespace, cgroup or process of the lab is left."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import cli
from ipsec_lab.testbed.build import leftovers
from netutil import poll_until, running

pytestmark = pytest.mark.root


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=timeout)


def _campaign(tmp_path: Path, text: str) -> dict[str, Any]:
    f = tmp_path / "scenario.toml"
    f.write_text(text)
    p = _cli("run", str(f), "--lab", str(tmp_path / "lab"), "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    data: dict[str, Any] = json.loads(p.stdout)
    return data


def _results(data: dict[str, Any], backend: str, configuration: str) -> list[dict[str, Any]]:
    return [
        x
        for r in data["runs"]
        if r["backend"] == backend and r["configuration"] == configuration
        for x in r["results"]
    ]


def test_a_campaign_on_a_10_mbit_link_none_and_strongswan(tmp_path: Path) -> None:
    data = _campaign(
        tmp_path,
        """
name = "ten"
soaker = true
topology = "line"
backends = ["none", "strongswan", "ours"]
configurations = ["esp:aes128gcm16", "ah:sha1"]
warmup_s = 0.5
links = ["ethernet-10"]
[[workloads]]
kind = "tcp"
seconds = 4
""",
    )
    plain = _results(data, "none", "none")
    esp = _results(data, "strongswan", "esp:aes128gcm16")
    ours = _results(data, "ours", "esp:aes128gcm16")
    assert len(plain) == 1 and len(esp) == 1 and len(ours) == 1
    # our gateway, on the same link: as plausible, and AH runs too
    assert 8.0 < ours[0]["mbps"] <= 10.0
    assert ours[0]["ipsec_effort_us_per_kb"] > 0 and ours[0]["ipsec_cpu_s"] > 0
    (ah,) = _results(data, "ours", "ah:sha1")
    assert 8.0 < ah["mbps"] <= 10.0
    for x in plain + esp:
        # a 10 Mbit/s link carries no more, and TCP fills most of it
        assert 8.0 < x["mbps"] <= 10.0, x["mbps"]
        assert x["payload_bytes"] > 0
    # IPsec costs CPU (strongSwan's user-space ESP, ours) and wire bytes (ESP in UDP).
    # The CPU shows in the IPsec processes' own time: with study 3's soaker filling every
    # idle cycle the whole machine is busy in every run (1705-1797 µs/kB here, none or
    # IPsec alike), so the machine-wide effort differs only by the payload rate and once
    # ranked ours 0.04 % below plain forwarding; it is checked to be saturated instead.
    assert esp[0]["ipsec_cpu_s"] > 0 and esp[0]["ipsec_effort_us_per_kb"] > 0
    for x in plain + esp + ours:
        assert x["cpu_load"] > 0.8, x["cpu_load"]
    assert plain[0]["ipsec_effort_us_per_kb"] is None
    # study 3's soaker ran beside (on a VM its reading moves with steal time, by more than
    # this 10 Mbit/s difference: only its range is checked here; the soaker's own test
    # checks that it sees a busy CPU)
    for x in plain + esp:
        assert 0 <= x["soaker_cpu_used"] <= len(x["soaker_per_cpu"])
        # its effort is the CPU it saw used over the run per kB of payload
        used_us = x["soaker_cpu_used"] * x["soaker_wall_s"] * 1e6
        assert x["soaker_effort_us_per_kb"] == pytest.approx(used_us / (x["payload_bytes"] / 1024))
    per_byte = [x["wire_up_bytes"] / x["payload_bytes"] for x in (plain[0], esp[0])]
    assert per_byte[1] > per_byte[0] > 1.0
    # the outer link carried only ESP in UDP (each data packet one outer packet)
    assert esp[0]["wire"]["gwA/wan"]["tx_packets"] > 0
    skipped = [r for r in data["runs"] if r["status"] == "skipped"]
    assert len(skipped) == 1 and "no AH" in skipped[0]["reason"]  # strongSwan's AH
    summary = {(r["backend"], r["configuration"]): r for r in data["summary"]}
    assert summary["strongswan", "esp:aes128gcm16"]["mbps_vs_none"] == pytest.approx(
        esp[0]["mbps"] / plain[0]["mbps"]
    )
    # CPU was sampled through the run (study 1's load-over-time)
    db = sqlite3.connect(tmp_path / "lab" / "results.sqlite")
    assert db.execute("SELECT COUNT(*) FROM samples").fetchone()[0] >= 4


def test_http_and_smtp_transfers(tmp_path: Path) -> None:
    data = _campaign(
        tmp_path,
        """
topology = "line"
backends = ["none"]
warmup_s = 0
[[workloads]]
kind = "http"
files = ["1K", "200K"]
[[workloads]]
kind = "smtp"
files = ["1K", "200K"]
""",
    )
    rows = {x["label"]: x for x in _results(data, "none", "none")}
    assert set(rows) == {"http-1KB", "http-200KB", "smtp-1KB", "smtp-200KB"}
    for label, x in rows.items():
        assert x["seconds"] > 0, label
    # HTTP: the file comes server -> client; SMTP: the mail goes client -> server
    assert rows["http-200KB"]["wire_down_bytes"] >= 200 * 1024
    assert rows["http-200KB"]["wire_up_bytes"] < 200 * 1024
    assert rows["smtp-200KB"]["wire_up_bytes"] >= 190 * 1024
    assert rows["smtp-200KB"]["wire_down_bytes"] < 100 * 1024


def test_the_cpu_quota_bounds_the_ipsec_processes(tmp_path: Path) -> None:
    data = _campaign(
        tmp_path,
        """
topology = "line"
backends = ["strongswan"]
configurations = ["esp:aes256-sha256"]
warmup_s = 0
[gateway]
cpu_quota = 0.1
[[workloads]]
kind = "tcp"
seconds = 3
""",
    )
    (x,) = _results(data, "strongswan", "esp:aes256-sha256")
    # both charons share one cgroup with a tenth of a CPU: their CPU time stays near it
    assert 0 < x["ipsec_cpu_s"] <= 0.1 * x["cpu_wall_s"] * 1.3 + 0.05, x


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "term", "hup"]
)
def test_ctrl_c_keeps_finished_runs_and_resume_repeats_none(tmp_path: Path, sig: int) -> None:
    """Ctrl-C — and SIGTERM or SIGHUP (a supervisor, a closed terminal) alike: the
    testbed comes down, finished runs are kept, the campaign is `interrupted`, and the
    exit status is 128 + the signal. Before, SIGTERM left the namespaces and the campaign
    `running`."""
    f = tmp_path / "scenario.toml"
    f.write_text(
        """
topology = "line"
backends = ["none"]
repetitions = 5
warmup_s = 0
[[workloads]]
kind = "tcp"
seconds = 1.5
"""
    )
    lab = tmp_path / "lab"
    db_path = lab / "results.sqlite"
    p = subprocess.Popen(
        [sys.executable, "-m", "ipsec_lab.cli", "run", str(f), "--lab", str(lab)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A job started in the background of a non-interactive shell inherits SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler: give the child
        # the default back, as a terminal would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        done = 0
        while time.monotonic() < deadline and done < 2:
            time.sleep(0.2)
            if db_path.exists():
                db = sqlite3.connect(db_path)
                try:
                    done = db.execute("SELECT COUNT(*) FROM runs WHERE status = 'done'").fetchone()[
                        0
                    ]
                except sqlite3.OperationalError:  # made, its tables not yet
                    pass
                finally:
                    db.close()
        assert done >= 2
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:  # a failed wait leaves no campaign running into the next test
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=60)
    assert p.returncode == 128 + sig, err
    assert "--resume" in err
    assert not [n for n in leftovers()[0] if n]  # the testbed came down on Ctrl-C
    db = sqlite3.connect(db_path)
    before = db.execute(
        "SELECT id, repetition, finished FROM runs WHERE status = 'done'"
    ).fetchall()
    assert db.execute("SELECT status FROM campaigns").fetchone()[0] == "interrupted"
    db.close()
    assert 2 <= len(before) < 5

    r = _cli("run", str(f), "--lab", str(lab), "--resume", "--json")
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(db_path)
    after = db.execute("SELECT id, repetition, finished FROM runs WHERE status = 'done'").fetchall()
    assert db.execute("SELECT COUNT(*) FROM campaigns").fetchone()[0] == 1
    assert db.execute("SELECT status FROM campaigns").fetchone()[0] == "finished"
    assert sorted(x[1] for x in after) == [1, 2, 3, 4, 5]
    assert set(before) <= set(after)  # nothing finished was redone


def test_clean_removes_what_a_killed_run_left(tmp_path: Path) -> None:
    f = tmp_path / "scenario.toml"
    f.write_text(
        'topology = "line"\nbackends = ["none"]\n[[workloads]]\nkind = "tcp"\nseconds = 30\n'
    )
    before = set(leftovers()[0])
    p = subprocess.Popen(
        [sys.executable, "-m", "ipsec_lab.cli", "run", str(f), "--lab", str(tmp_path / "lab")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    poll_until("the run's four namespaces", lambda: len(set(leftovers()[0]) - before) >= 4, 30)
    poll_until("the run's traffic", lambda: running("iperf3", "-c"), 30)
    p.kill()  # no chance to tear down
    p.wait(10)
    left = set(leftovers()[0]) - before
    assert len(left) == 4
    r = _cli("clean")
    assert r.returncode == 0
    for n in left:
        assert f"namespace {n}" in r.stdout
    assert not set(leftovers()[0]) - before


def test_udp_and_imix_and_strongswan_fragmenting_big_datagrams(tmp_path: Path) -> None:
    data = _campaign(
        tmp_path,
        """
topology = "line"
backends = ["none", "strongswan"]
configurations = ["esp:aes128gcm16"]
warmup_s = 0
[[workloads]]
kind = "udp"
size = 1420
rate_mbit = 40
seconds = 2
[[workloads]]
kind = "imix"
rate_mbit = 10
seconds = 2
[[workloads]]
kind = "imix"
label = "imix-iperf3"
generator = "iperf3"
rate_mbit = 10
seconds = 2
""",
    )
    for backend, cfg in (("none", "none"), ("strongswan", "esp:aes128gcm16")):
        rows = {x["label"]: x for x in _results(data, backend, cfg)}
        udp = rows["udp-1420"]
        assert udp["size"] == 1420 and udp["sent_packets"] > 0
        assert udp["mbps"] <= 40 * 1.05 and udp["generator"] == "udp-gso"
        # udp-gso (auto's) sends the mix's 40-byte packets; iperf3 needs 16 bytes of its
        # own payload
        for label, small, gen in (("imix", 40, "udp-gso"), ("imix-iperf3", 44, "iperf3")):
            imix = rows[label]
            assert imix["generator"] == gen and f"of {small}/576/1500 B" in imix["mix"]
            assert "7:4:1" in imix["mix"] and imix["sent_packets"] > 0
            # 7:4:1 by packets: the mix's mean size is (7*small + 4*576 + 1500) / 12 bytes
            got = imix["sent_packets"] - imix["lost_packets"]
            mean = imix["mbps"] * 1e6 / 8 * imix["seconds"] / got
            assert mean == pytest.approx((7 * small + 4 * 576 + 1500) / 12, rel=0.05), imix
        if backend == "none":
            # plain forwarding delivers what the generator sent, in its time; its own pace
            # shares these 2 cores with the hosts' forwarding (it once sent 34.6 of the 40
            # Mbit/s asked, under 1 % lost, in CI): the path's, not the generator's, figure
            assert udp["loss_pct"] < 1.0 and udp["mbps"] >= 0.95 * udp["sent_mbps"], udp
            # and the row says whether its figure is the generator's (not a rate asserted)
            short = udp["sent_mbps"] < 0.95 * udp["offered_mbps"] and udp["loss_pct"] <= 0.01
            assert udp["offered_mbps"] == 40 and udp["generator_bound"] == short, udp
        else:
            # libipsec's TUN takes 1400 bytes: gwA fragments each 1420-byte datagram in two
            delivered = udp["sent_packets"] - udp["lost_packets"]
            assert udp["wire_up_packets"] >= 1.9 * delivered


@pytest.mark.parametrize("topo", ["pair", "clients"])
def test_host_to_host_topologies_with_strongswan(tmp_path: Path, topo: str) -> None:
    data = _campaign(
        tmp_path,
        f"""
topology = "{topo}"
backends = ["strongswan"]
configurations = ["esp:chacha20poly1305"]
warmup_s = 0
links = ["ethernet-100"]
[[workloads]]
kind = "tcp"
seconds = 2
""",
    )
    flows = {r["flow"]: r for r in data["runs"]}
    assert set(flows) == ({"hostA-hostB"} if topo == "pair" else {"fast-server", "slow-server"})
    for r in flows.values():
        (x,) = r["results"]
        assert r["status"] == "done" and 1 < x["mbps"] <= 100
        assert x["ipsec_cpu_s"] > 0
        assert "strongSwan" in r["backend_version"]


def test_xfrm_is_skipped_with_the_reason_here(tmp_path: Path) -> None:
    from ipsec_lab.backends.xfrm import kernel_has_esp

    has_esp, why = kernel_has_esp()
    data = _campaign(
        tmp_path,
        """
topology = "line"
backends = ["xfrm"]
configurations = ["esp:aes128gcm16"]
""",
    )
    runs = {r["backend"]: r for r in data["runs"]}
    assert runs["xfrm"]["status"] == "skipped"
    if not has_esp:  # this project's machines: the kernel has no ESP
        assert "has no ESP" in runs["xfrm"]["reason"] and why in runs["xfrm"]["reason"]


def test_the_live_progress_display_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal `run` shows rich's progress bar, then the summary table."""
    f = tmp_path / "s.toml"
    f.write_text('name = "tty"\nbackends = ["none"]\nwarmup_s = 0\n'
                 '[[workloads]]\nkind = "tcp"\nseconds = 1\n')  # fmt: skip
    cmd = f"{sys.executable} -m ipsec_lab.cli run {f} --lab {tmp_path / 'lab'}"
    out = tmp_path / "typescript"
    p = subprocess.run(
        ["script", "-qec", cmd, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "160", "TERM": "xterm"},
    )
    text = out.read_text(errors="replace")
    assert p.returncode == 0, text[-2000:]
    assert "campaign 1: tty" in text  # the summary table's title
    assert "1/1" in text and "tcp-1x-1s" in text  # the progress line: count and run
    assert "━" in text  # its bar


def test_a_failing_run_is_stored_with_the_programs_log_and_the_campaign_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """nginx refuses its config: the HTTP run fails with nginx's own words in its stored
    reason, the TCP run after it still runs, and `ipsec-lab run` exits non-zero."""
    from ipsec_lab import cli
    from ipsec_lab.traffic import apps

    good = apps._nginx_conf
    monkeypatch.setattr(
        apps, "_nginx_conf", lambda d, addr: good(d, addr) + "\nno_such_directive_here on;\n"
    )
    f = tmp_path / "scenario.toml"
    f.write_text(
        """
name = "fails"
topology = "line"
backends = ["none"]
warmup_s = 0
[[workloads]]
kind = "http"
files = ["1K"]
[[workloads]]
kind = "tcp"
seconds = 1
"""
    )
    lab = tmp_path / "lab"
    rc = cli.main(["run", str(f), "--lab", str(lab)])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "2 runs planned: 1 done, 1 failed, 0 skipped" in err
    db = sqlite3.connect(lab / "results.sqlite")
    runs = dict(db.execute("SELECT workload, status FROM runs").fetchall())
    assert runs == {"http": "failed", "tcp-1x-1s": "done"}
    (reason,) = db.execute("SELECT reason FROM runs WHERE status = 'failed'").fetchone()
    assert "nothing listens on port 8080" in reason
    assert "no_such_directive_here" in reason  # nginx's own log, tail in the reason
    (status,) = db.execute("SELECT status FROM campaigns").fetchone()
    assert status == "failed"
    assert "FAILED" in out and "no_such_directive_here" in out  # the summary shows it
    # `results` counts it and shows why, as table, JSON and CSV
    p = _cli("results", "1", "--lab", str(lab), "--json")
    data = json.loads(p.stdout)
    assert data["counts"] == {"planned": 2, "done": 1, "failed": 1, "skipped": 0}
    assert any("failed" in r for r in data["summary"])
    p = _cli("results", "1", "--lab", str(lab), "--csv")
    assert "failed" in p.stdout and "nothing listens on port 8080" in p.stdout


def test_a_udp_sink_scheduled_late_loses_nothing(tmp_path: Path) -> None:
    """The traffic programs are the instrument: iperf3's receiving socket must hold what
    arrives while the sink is not scheduled (here: stopped for 150 ms at 50 Mbit/s, ~940
    datagrams of 1000 B; the kernel's default buffer holds ~90), or a loss-free-rate search
    blames the path for the sink's own drops."""
    import threading

    from ipsec_lab.testbed import topology
    from ipsec_lab.testbed.build import Testbed
    from ipsec_lab.traffic import iperf
    from ipsec_lab.traffic.rfc2544 import with_unarrived

    with Testbed(topology("line"), tmp_path / "run") as tb:
        flow = tb.topo.flows[0]
        servers = iperf.Servers(tb, flow.sink, [iperf.PORT])
        pid = servers.procs[0].pid

        def stall() -> None:
            time.sleep(0.8)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.15)
            os.kill(pid, signal.SIGCONT)

        try:
            t = threading.Thread(target=stall)
            t.start()
            row = iperf.udp_trial(tb, flow, 1000, 50, 2)
            t.join()
        finally:
            os.kill(pid, signal.SIGCONT)
            servers.close()
    assert row["sender_packets"] > 10000, row
    # none of the stall's ~940 datagrams lost at the socket (a gap in the numbers the
    # sink read; with the default buffer ~850 are), and no loss as the search counts it:
    # against what the sender sent, less what was still in flight when the test ended
    # (`with_unarrived`; CI saw 1 datagram of 12,494 unarrived once, at the end)
    assert row["lost_packets"] == 0, row
    assert with_unarrived(row)["loss_pct"] == 0, row


def test_an_imix_row_over_a_slower_link_says_its_loss(tmp_path: Path) -> None:
    """40 Mbit/s of IMIX offered over a 10 Mbit/s link: the summary row says what was
    offered, sent and delivered and the loss, in its note and its loss column — not only
    the delivered rate; and it is the path's figure, not the generator's."""
    data = _campaign(
        tmp_path,
        """
topology = "line"
backends = ["none"]
warmup_s = 0
links = ["ethernet-10"]
[[workloads]]
kind = "imix"
rate_mbit = 40
seconds = 2
""",
    )
    (x,) = _results(data, "none", "none")
    # 10 of 40 Mbit/s delivered; the link's queue drops big packets more than small ones,
    # so of packets about 40 % are lost (a byte-counting shaper: 75 % of the bytes)
    assert x["offered_mbps"] == 40 and x["mbps"] < 11 and x["loss_pct"] > 25, x
    assert x["generator_bound"] is False
    (row,) = [r for r in data["summary"] if r["measurement"] == "imix"]
    assert row["loss_pct_median"] == pytest.approx(x["loss_pct"])
    assert row["offered_mbps_median"] == 40 and row["sent_mbps_median"] > 25, row
    assert "offered 40.0 Mbit/s" in row["note"] and f"loss {x['loss_pct']:.1f} %" in row["note"]
    assert "generator-bound" not in row["note"]
    from ipsec_lab import metrics

    assert f"{x['loss_pct']:.1f} %" in metrics.cells(row)  # the summary's and report's column
