"""Bulk TCP of chosen bytes: English text (compressible) or random (incompressible).

iperf3 always sends its own random buffer; study 1 needs the same transfer once with
data DEFLATE can shrink and once with data it cannot, sent by the same program so that
only the bytes differ. A small Python sender writes 64 KiB chunks of the corpus for
`seconds`; the receiver counts the bytes from the first to the last and reports them.

The text is the licence texts Debian installs with every system
(/usr/share/common-licenses, package base-files): real English prose, which raw DEFLATE
shrinks by about half per 1400-byte packet, as study 1's compressible data (46 %).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import Testbed
from ipsec_lab.traffic import Metered, Row, wait_listening
from ipsec_lab.traffic.workload import Workload

PORT = 5301
LICENSES = Path("/usr/share/common-licenses")
CORPUS_BYTES = 4 << 20

_RECEIVER = """
import json, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(float(sys.argv[4]))
c, _ = s.accept()
c.settimeout(float(sys.argv[4]))
buf = bytearray(1 << 18)
n = c.recv_into(buf)
t0 = time.monotonic()
total = n
while n:
    n = c.recv_into(buf)
    total += n
secs = time.monotonic() - t0
open(sys.argv[3], "w").write(json.dumps({"bytes": total, "seconds": secs}))
"""

_SENDER = """
import socket, sys, time
data = open(sys.argv[3], "rb").read()
view = memoryview(data)
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
end = time.monotonic() + float(sys.argv[4])
i = 0
while time.monotonic() < end:
    s.sendall(view[i : i + 65536])
    i = (i + 65536) % (len(data) - 65536)
s.shutdown(socket.SHUT_WR)
s.recv(1)
s.close()
"""


def corpus(kind: str) -> bytes:
    """`CORPUS_BYTES` of English text or of random bytes."""
    if kind == "random":
        import os

        return os.urandom(CORPUS_BYTES)
    files = sorted(p for p in LICENSES.glob("*") if p.is_file() and not p.is_symlink())
    if not files:
        raise LabError(f"no English text in {LICENSES} (Debian package base-files)")
    text = b"\n".join(p.read_bytes() for p in files)
    return (text * (CORPUS_BYTES // len(text) + 1))[:CORPUS_BYTES]


def tcp(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float) -> list[Row]:
    # the corpus where the sender runs (on real hosts, pushed to the source host)
    src = tb.file_for(flow.source, f"bulk-{w.data}.bin", corpus(w.data))
    k = 0

    def transfer(seconds: float) -> Row:
        nonlocal k
        k += 1  # a fresh report file per transfer: never an earlier one's figures
        got = tb.file_for(flow.sink, f"bulk-{w.data}.received.{k}.json", b"")
        bound = seconds + 30
        p = tb.spawn(
            flow.sink,
            [tb.python(flow.sink), "-I", "-c", _RECEIVER, flow.sink_addr, str(PORT), got, "30"],
            f"bulk-receiver-{w.data}",
        )
        try:
            wait_listening(tb, flow.sink, PORT)
            tb.run(
                flow.source,
                [tb.python(flow.source), "-I", "-c", _SENDER, flow.sink_addr, str(PORT), src,
                 f"{seconds:g}"],
                timeout=bound,
                limited=flow.slow,
            )  # fmt: skip
            try:
                p.wait(bound)
            except subprocess.TimeoutExpired:
                raise LabError(f"the bulk receiver in {flow.sink} did not finish") from None
        finally:
            tb.stop(p)
        try:
            r = json.loads(tb.read_back(flow.sink, got) or b"")
        except ValueError:
            raise LabError(f"the bulk receiver in {flow.sink} reported nothing") from None
        secs = float(r["seconds"]) or seconds
        return {
            "data": w.data,
            "payload_bytes": int(r["bytes"]),
            "seconds": secs,
            "mbps": int(r["bytes"]) * 8 / secs / 1e6,
        }

    if warmup_s > 0:
        transfer(max(warmup_s, 0.5))
    return [metered(w.name, lambda: transfer(w.seconds))]
