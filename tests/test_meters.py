"""The meters without namespaces: the CPU soaker sees a busy CPU, the IPsec processes'
CPU clock counts every thread, and only a data plane that counts packets lends a clock."""

from __future__ import annotations

import time

import pytest


@pytest.mark.quiet  # its calibration is of an idle machine's CPUs
def test_the_cpu_soaker_sees_a_busy_cpu() -> None:
    import multiprocessing as mp
    import os

    from ipsec_lab.meters.soaker import Soaker

    s = Soaker()
    s.start(calibrate_s=0.5)
    try:
        cpu = s.cpus[0]

        def burn() -> None:
            os.sched_setaffinity(0, {cpu})
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                pass

        mark = s.mark()
        p = mp.get_context("fork").Process(target=burn)
        p.start()
        p.join(10)
        used = s.used_since(mark)
    finally:
        s.close()
    # the busy loop (normal priority) took CPU `cpu` from the idle-priority soaker for
    # most of the time measured
    assert used["soaker_per_cpu"][0] > 0.6, used
    assert all(0.0 <= u <= 1.0 for u in used["soaker_per_cpu"])
    assert not any(p.is_alive() for p in s.procs)


def test_the_ipsec_cpu_clock_counts_every_thread_to_the_ns() -> None:
    """The process CPU-time clock: a second thread's 0.2 s counts after it ended, and it
    agrees with /proc/PID/stat's 10 ms ticks (psutil); a gone process counts 0."""
    import os
    import threading

    from ipsec_lab.meters import process_cpu_ns, process_cpu_s

    def burn() -> None:
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass

    me = [os.getpid()]
    ns0, s0 = process_cpu_ns(me), process_cpu_s(me)
    t = threading.Thread(target=burn)
    t.start()
    t.join()
    ns1, s1 = process_cpu_ns(me), process_cpu_s(me)
    assert ns1 - ns0 >= 0.2e9  # the thread's own 0.2 s of CPU, at least
    assert abs((ns1 - ns0) / 1e9 - (s1 - s0)) < 0.05
    assert process_cpu_ns([2**22 + 7]) == 0


def test_the_ipsec_cpu_wait_counts_what_threads_waited_for_a_cpu() -> None:
    """Two processes that spin on the same one CPU each wait for it while the other runs:
    their run delay grows by a good part of the time they spun together; a process that
    sleeps waits for nothing; a gone one counts nothing (None when nothing is left)."""
    import os
    import subprocess
    import sys

    from ipsec_lab.meters import process_cpu_wait_ns

    cpu = sorted(os.sched_getaffinity(0))[0]
    # each child says "ready" once it is what it should be (pinned and spinning, or about
    # to sleep): its interpreter's start, itself runnable, is not counted
    spin = (f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nprint('ready', flush=True)\n"
            "end = time.monotonic() + 1.5\nwhile time.monotonic() < end:\n    pass\n")  # fmt: skip
    sleep = "import time\nprint('ready', flush=True)\ntime.sleep(3)\n"

    def run(code: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    sleeper = run(sleep)
    procs = [run(spin) for _ in range(2)]
    try:
        for p in [*procs, sleeper]:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        time.sleep(0.05)  # the sleeper's print done: it sleeps now
        pids = [p.pid for p in procs]
        w0 = process_cpu_wait_ns(pids)
        s0 = process_cpu_wait_ns([sleeper.pid])
        assert w0 is not None and s0 is not None
        time.sleep(0.4)
        w1 = process_cpu_wait_ns(pids)
        s1 = process_cpu_wait_ns([sleeper.pid])
        assert w1 is not None and s1 is not None
        # 0.4 s of two runnable processes on one CPU: about 0.4 s of waiting between them
        assert w1 - w0 >= 0.1e9, (w0, w1)
        # asleep throughout: it was never runnable, so never waited
        assert s1 - s0 < 0.01e9, (s0, s1)
    finally:
        for p in [*procs, sleeper]:
            p.kill()
            p.wait()
            if p.stdout:
                p.stdout.close()
    assert process_cpu_wait_ns([p.pid for p in procs]) is None


def test_only_a_data_plane_that_counts_its_packets_lends_its_clock() -> None:
    """The kernel's ESP (xfrm, strongSwan on it) is softirq time, and charon's
    kernel-libipsec counts nothing the lab reads: no clock, so no CPU-per-packet figure
    that would make their work look free; ours without running gateways has none."""
    from ipsec_lab.backends import make
    from ipsec_lab.backends.ours import Ours
    from ipsec_lab.backends.strongswan import StrongSwan

    for b in (make("none"), make("xfrm"), StrongSwan("kernel"), StrongSwan("libipsec"), Ours()):
        assert b.plane_clock() == {}, b.name


def test_gso_buffers_are_counted_as_the_segments_they_leave_as() -> None:
    """Plain forwarding's veth counts ~61 KB GSO buffers, an IPsec's packets: counted as
    segments, both have headers per packet on the wire (issue 45: 9 % vs 5.8 %)."""
    from ipsec_lab.meters import count_segments

    # 100 buffers of 61,000 B on a 1500-B link: 60,934 B of TCP payload each, 43 segments
    # of at most 1448; 42 more Ethernet + IPv4 + TCP headers (66 B) per buffer
    row = {"data": "iperf", "wire_up_bytes": 6_100_000, "wire_up_packets": 100,
           "wire_down_bytes": 66_000, "wire_down_packets": 1000}  # fmt: skip
    count_segments(row, 1500)
    assert row["wire_up_packets"] == 4300
    assert row["wire_up_bytes"] == 6_100_000 + 100 * 42 * 66
    assert (row["wire_up_gso_bytes"], row["wire_up_gso_packets"]) == (6_100_000, 100)
    assert row["wire_down_bytes"] == 66_000 and "wire_down_gso_bytes" not in row  # ACKs
    assert str(row["wire_counted"]).startswith("segments")
    # packets already (an IPsec's ESP, at most the frame): untouched
    esp = {"data": "iperf", "wire_up_bytes": 1514 * 1000, "wire_up_packets": 1000}
    count_segments(esp, 1500)
    assert esp == {"data": "iperf", "wire_up_bytes": 1514 * 1000, "wire_up_packets": 1000}
    # not TCP (a UDP GSO buffer's headers are not TCP's): marked, not guessed
    udp = {"size": 1400, "wire_up_bytes": 64_000 * 10, "wire_up_packets": 10}
    count_segments(udp, 1500)
    assert udp["wire_up_bytes"] == 640_000 and "GSO buffers" in str(udp["wire_counted"])
    count_segments(row := {"data": "x", "wire_up_bytes": 9, "wire_up_packets": 0}, None)
    assert "wire_counted" not in row  # unknown MTU (an external link): nothing to say
