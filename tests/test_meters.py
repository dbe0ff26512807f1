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
