"""iperf3 workloads: bulk TCP, UDP at a fixed inner IP packet size, simple IMIX."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import UDP_SOCKET_BUFFER_BYTES, Testbed
from ipsec_lab.traffic import IPV4_UDP, Metered, Row, niced, wait_listening
from ipsec_lab.traffic.workload import Context, Kind, Workload

PORT = 5201
# Simple IMIX: 7 : 4 : 1 packets of 40, 576 and 1500 bytes (IP packet sizes).
SIMPLE_IMIX = ((40, 7), (576, 4), (1500, 1))
# iperf3 needs 16 bytes of UDP payload for its own header (64-bit counters): a "40-byte"
# IMIX packet is therefore sent as 44 bytes (16 + 28); the rows say so.
IPERF_MIN_UDP_PAYLOAD = 16
UDP_SOCKET_BUFFER = f"{UDP_SOCKET_BUFFER_BYTES >> 20}M"


def _udp_args(port: int, app_rate: float, payload: int, seconds: float) -> list[str]:
    """iperf3 client options of one UDP stream: `app_rate` bit/s of `payload`-byte
    datagrams to `port`, with the sockets' buffers at UDP_SOCKET_BUFFER."""
    return ["-p", str(port), "-u", "-b", f"{app_rate:.0f}", "-l", str(payload),
            "-w", UDP_SOCKET_BUFFER, "-t", f"{seconds:g}"]  # fmt: skip


class Servers:
    """iperf3 servers in the sink node, one per port, for the life of a measurement."""

    def __init__(self, tb: Testbed, node: str, ports: list[int], nice: int = 0) -> None:
        self.tb = tb
        self.procs = [
            tb.spawn(node, niced(["iperf3", "-s", "-p", str(p)], nice), f"iperf3-server-{p}")
            for p in ports
        ]
        for p in ports:
            wait_listening(tb, node, p)

    def close(self) -> None:
        for p in self.procs:
            self.tb.stop(p)


def _client(tb: Testbed, flow: Flow, args: list[str], seconds: float,
            nice: int = 0) -> dict[str, Any]:  # fmt: skip
    """iperf3's client on the flow's source (at `nice`), its JSON."""
    argv = ["iperf3", "-c", flow.sink_addr, "-J", "--connect-timeout", "5000", *args]
    argv = niced(argv, nice)
    for again in (True, False):
        text = tb.run(flow.source, argv, timeout=seconds + 30, check=False)
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError:
            raise LabError(f"iperf3 on {flow.source} gave no JSON: {text[-500:]}") from None
        # iperf3's server closes its listening socket between one test and the next: a
        # client right after another (the warm-up's) may find none and be refused (CI
        # saw it once). Wait until it listens again, and try once more.
        if again and "Connection refused" in str(data.get("error", "")):
            wait_listening(tb, flow.sink, int(args[args.index("-p") + 1]) if "-p" in args
                           else PORT)  # fmt: skip
            continue
        break
    if "error" in data:
        raise LabError(f"iperf3 on {flow.source}: {data['error']}")
    return data


def _tcp_row(data: dict[str, Any]) -> Row:
    end = data["end"]
    recv, sent = end["sum_received"], end["sum_sent"]
    return {
        "payload_bytes": int(recv["bytes"]),
        "seconds": float(recv["seconds"]),
        "mbps": recv["bits_per_second"] / 1e6,
        "retransmits": sent.get("retransmits"),
    }


def tcp(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float) -> list[Row]:
    if w.data != "iperf":
        from ipsec_lab.traffic import bulk

        return bulk.tcp(tb, flow, w, metered, warmup_s)
    srv = Servers(tb, flow.sink, [PORT])
    try:
        if warmup_s > 0:
            _client(tb, flow, ["-p", str(PORT), "-t", f"{max(warmup_s, 1):g}"], warmup_s)
        if w.bytes:
            args = ["-n", str(w.bytes)]
            bound = 60 + w.bytes * 8 / 1e6  # the byte count at no less than 1 Mbit/s
        else:
            args = ["-t", f"{w.seconds:g}"]
            bound = w.seconds
        args += ["-p", str(PORT), "-P", str(w.streams)]
        return [metered(w.name, lambda: _tcp_row(_client(tb, flow, args, bound)))]
    finally:
        srv.close()


def udp_trial(
    tb: Testbed, flow: Flow, size: int, rate_mbit: float, seconds: float, port: int = PORT
) -> Row:
    """Offer `rate_mbit` (in inner IP packet bits) of `size`-byte IP packets for `seconds`."""
    payload = max(size - IPV4_UDP, IPERF_MIN_UDP_PAYLOAD)
    ip_size = payload + IPV4_UDP
    app_rate = rate_mbit * 1e6 * payload / ip_size
    data = _client(tb, flow, _udp_args(port, app_rate, payload, seconds), seconds)
    end = data["end"]
    s = end.get("sum_received") or end["sum"]
    sent = end.get("sum_sent") or end["sum"]
    packets = int(s.get("packets") or sent.get("packets") or 0)
    lost = int(s.get("lost_packets", 0))
    got = max(packets - lost, 0)
    secs = float(s["seconds"]) or seconds
    # The receiver counts a datagram lost only below the highest sequence number it saw:
    # what was still queued in the path when the test ended (a deep queue in front of an
    # overloaded gateway) is neither received nor lost. The sender's own count shows it.
    sender_packets = int(sent.get("packets") or packets)
    return {
        "size": ip_size,
        "offered_mbps": rate_mbit,
        # what the sender managed (iperf3 falls short of a high rate of small packets)
        "sent_mbps": sender_packets * ip_size * 8 / (float(sent.get("seconds") or secs)) / 1e6,
        "sent_packets": packets,
        "sender_packets": sender_packets,
        "unarrived_packets": max(sender_packets - packets, 0),
        "lost_packets": lost,
        "loss_pct": 100.0 * lost / packets if packets else 100.0,
        "payload_bytes": got * payload,
        "seconds": secs,
        "mbps": got * ip_size * 8 / secs / 1e6,  # received inner IP packet bits
    }


class IperfGenerator:
    """iperf3 as the UDP generator (`generator.Generator`): a server per port on the sink
    for the generator's life, a client per trial on the source."""

    name = "iperf3"

    def __init__(self, tb: Testbed, flow: Flow, why: str = "") -> None:
        self.tb, self.flow, self.why = tb, flow, why
        self.ports = [PORT + i for i in range(len(SIMPLE_IMIX))]
        self.srv = Servers(tb, flow.sink, self.ports)

    def trial(self, size: int, rate_mbit: float, seconds: float) -> Row:
        row = udp_trial(self.tb, self.flow, size, rate_mbit, seconds)
        return {**row, "generator": self.name}

    def mix(self, sizes: tuple[tuple[int, int], ...], rate_mbit: float, seconds: float) -> Row:
        """The mix as concurrent iperf3 UDP streams, one per size, whose packet rates
        stand as the mix's counts (their bit rates in proportion to packets x size).
        iperf3 needs 16 bytes of UDP payload: a smaller packet goes as 44 bytes."""
        tb, flow = self.tb, self.flow
        if len(sizes) > len(self.ports):
            raise LabError(f"iperf3 runs a mix of at most {len(self.ports)} sizes")
        weights = [(max(s - IPV4_UDP, IPERF_MIN_UDP_PAYLOAD) + IPV4_UDP) * n for s, n in sizes]
        procs = []
        for (size, _), port, wt in zip(sizes, self.ports, weights):
            payload = max(size - IPV4_UDP, IPERF_MIN_UDP_PAYLOAD)
            rate = rate_mbit * wt / sum(weights) * 1e6 * payload / (payload + IPV4_UDP)
            argv = tb.command(
                flow.source,
                ["iperf3", "-c", flow.sink_addr, "-J", *_udp_args(port, rate, payload, seconds)],
            )
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        rows = []
        for (size, _), p in zip(sizes, procs):
            try:
                out, _ = p.communicate(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                raise LabError("a mix's iperf3 stream did not finish in time") from None
            end = json.loads(out)["end"]
            s = end.get("sum_received") or end["sum"]
            payload = max(size - IPV4_UDP, IPERF_MIN_UDP_PAYLOAD)
            rows.append((payload + IPV4_UDP, int(s["packets"]), int(s["lost_packets"])))
        packets = sum(n for _, n, _ in rows)
        lost = sum(x for _, _, x in rows)
        ip_bytes = sum(sz * (n - x) for sz, n, x in rows)
        return {
            "offered_mbps": rate_mbit,
            "sent_mbps": sum(sz * n for sz, n, _ in rows) * 8 / seconds / 1e6,
            "sent_packets": packets,
            "lost_packets": lost,
            "loss_pct": 100.0 * lost / packets if packets else 100.0,
            "payload_bytes": sum((sz - IPV4_UDP) * (n - x) for sz, n, x in rows),
            "seconds": seconds,
            "mbps": ip_bytes * 8 / seconds / 1e6,
            "generator": self.name,
            "mix_sizes": [sz for sz, _, _ in rows],
        }

    def close(self) -> None:
        self.srv.close()


def _tcp_run(c: Context) -> list[Row]:
    return tcp(c.tb, c.flow, c.workload, c.meters, c.warmup_s)


def _tcp_seconds(w: Workload, rate_mbit: float) -> float:
    return w.bytes * 8 / rate_mbit / 1e6 if w.bytes else w.seconds


TCP = Kind(
    "tcp",
    "bulk TCP for `seconds` or `bytes`: iperf3's own bytes, or the lab's sender of "
    "compressible text or random bytes (`data`)",
    frozenset({"seconds", "bytes", "streams", "data"}),
    _tcp_run,
    _tcp_seconds,
    # the lab's own bytes are sent and received by python3 (iperf3 sends its own)
    tools=lambda w: ("python3",) if w.data != "iperf" else (),
)
