"""Application transfers, as study 4 measured them: a file over HTTP (nginx serves it,
curl fetches it: server to client) and a mail over SMTP (curl submits it, aiosmtpd — an
RFC 5321 server — accepts and discards it: client to server). One row per file size, each
metered on its own (transfer time, wire bytes and packets each way, CPU).

A file under 1 MiB is sent `SMALL_REPEATS` times within its measurement and the row gives
the median transfer time (`transfers` says how many; wire and CPU figures cover them all):
one 1 KB transfer takes well under a millisecond here, and a single one is at the mercy of
one scheduling delay."""

from __future__ import annotations

import base64
import functools
import random
import statistics
from collections.abc import Callable
from pathlib import Path

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import Testbed
from ipsec_lab.traffic import Metered, Row, wait_listening
from ipsec_lab.traffic.workload import Kind, Workload

SMALL_REPEATS = 7
HTTP_PORT = 8080
SMTP_PORT = 2525
CURL_TIMEOUT_S = 300


def _size_label(n: int) -> str:
    for unit, div in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"


def _repeated(n: int, size: int, once: Callable[[], float]) -> Row:
    """Transfer a file of `n` bytes (`size` on the wire's payload) once, or
    `SMALL_REPEATS` times when under 1 MiB; the row's time is the median transfer's."""
    k = SMALL_REPEATS if n < 1 << 20 else 1
    times = [once() for _ in range(k)]
    secs = statistics.median(times)
    return {"file_bytes": n, "transfers": k, "payload_bytes": size * k, "seconds": secs,
            "mbps": size * 8 / secs / 1e6 if secs else 0.0}  # fmt: skip


def _nginx_conf(d: Path | str, addr: str) -> str:
    # The worker runs as root: the run directory may be one only root can read (a root
    # home, pytest's tmp); it serves generated files, in a namespace of the lab's own.
    return f"""daemon off;
user root;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log;
events {{ worker_connections 64; }}
http {{
  access_log off;
  sendfile on;
  client_body_temp_path {d}/tmp;
  proxy_temp_path {d}/tmp;
  fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp;
  scgi_temp_path {d}/tmp;
  types {{ }}
  default_type application/octet-stream;
  server {{
    listen {addr}:{HTTP_PORT};
    root {d}/www;
  }}
}}
"""


def _curl(tb: Testbed, flow: Flow, args: list[str]) -> tuple[float, int]:
    out = tb.run(
        flow.source,
        ["curl", "-sS", "--max-time", str(CURL_TIMEOUT_S), "-w", "%{time_total} %{response_code}",
         *args],
        timeout=CURL_TIMEOUT_S + 10,
        limited=flow.slow,
    )  # fmt: skip
    secs, code = out.split()[-2:]
    return float(secs), int(code)


def http(tb: Testbed, flow: Flow, w: Workload, metered: Metered, seed: int) -> list[Row]:
    tb.needs("nginx", "curl")
    rng = random.Random(seed)
    # the files, nginx's config and its temporary directory where nginx runs (the sink)
    for n in w.files:
        tb.file_for(flow.sink, f"nginx/www/f{n}", rng.randbytes(n))
    d = str(Path(tb.file_for(flow.sink, "nginx/tmp/.keep", b"")).parent.parent)
    conf = tb.file_for(flow.sink, "nginx/nginx.conf", _nginx_conf(d, flow.sink_addr).encode())
    p = tb.spawn(flow.sink, ["nginx", "-c", conf, "-p", d], "nginx")
    try:
        wait_listening(tb, flow.sink, HTTP_PORT)
        url = f"http://{flow.sink_addr}:{HTTP_PORT}/"
        _curl(tb, flow, ["-o", "/dev/null", url + f"f{w.files[0]}"])  # warm-up: ARP, SAs

        def fetch(n: int) -> Row:
            def once() -> float:
                secs, code = _curl(tb, flow, ["-o", "/dev/null", url + f"f{n}"])
                if code != 200:
                    raise LabError(f"HTTP GET of {n} bytes answered {code}")
                return secs

            return _repeated(n, n, once)

        return [metered(f"{w.name}-{_size_label(n)}", functools.partial(fetch, n)) for n in w.files]
    finally:
        tb.stop(p)


def mail_message(n: int, rng: random.Random) -> bytes:
    """An RFC 5322 message of about `n` bytes (within one 78-byte line; never less than
    its headers): headers, then base64 lines of random bytes, as an attachment travels."""
    head = (
        b"From: lab@client.example\r\nTo: lab@server.example\r\n"
        b"Subject: ipsec-lab transfer\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\r\n"
    )
    body = base64.encodebytes(rng.randbytes(max(n, 1))).replace(b"\n", b"\r\n")
    msg = head + body  # base64 of n bytes is longer than n: cut at a line end
    cut = msg.rfind(b"\r\n", 0, n)
    return msg[: cut + 2] if cut >= len(head) else head + body[:78]


def smtp(tb: Testbed, flow: Flow, w: Workload, metered: Metered, seed: int) -> list[Row]:
    tb.needs("curl")
    rng = random.Random(seed)
    files: dict[int, tuple[str, int]] = {}  # size -> (the mail's path at the source, bytes)
    for n in w.files:
        m = mail_message(n, rng)
        files[n] = (tb.file_for(flow.source, f"smtp/mail{n}.eml", m), len(m))
    p = tb.spawn(
        flow.sink,
        [tb.python(flow.sink), "-I", "-m", "aiosmtpd", "-n", "-l", f"{flow.sink_addr}:{SMTP_PORT}",
         "-c", "aiosmtpd.handlers.Sink", "-s", str(64 << 20)],
        "aiosmtpd",
    )  # fmt: skip
    try:
        wait_listening(tb, flow.sink, SMTP_PORT)
        url = f"smtp://{flow.sink_addr}:{SMTP_PORT}"
        common = ["--mail-from", "lab@client.example", "--mail-rcpt", "lab@server.example", url]

        def send(n: int) -> Row:
            def once() -> float:
                secs, code = _curl(tb, flow, ["-T", files[n][0], *common])
                if code != 250:
                    raise LabError(f"SMTP transfer of {n} bytes ended with reply {code}")
                return secs

            return _repeated(n, files[n][1], once)

        send(w.files[0])  # warm-up
        return [metered(f"{w.name}-{_size_label(n)}", functools.partial(send, n)) for n in w.files]
    finally:
        tb.stop(p)


def _seconds(w: Workload, rate_mbit: float) -> float:
    """Every file once, and a warm-up fetch."""
    return sum(n * 8 / rate_mbit / 1e6 + 0.5 for n in w.files) + 0.5


HTTP = Kind(
    "http",
    "files of each of `files`' sizes fetched by curl from nginx",
    frozenset({"files"}),
    lambda c: http(c.tb, c.flow, c.workload, c.meters, c.seed),
    _seconds,
    tools=lambda w: ("nginx", "curl"),
    article="an",
)
SMTP = Kind(
    "smtp",
    "mails of each of `files`' sizes sent by curl to aiosmtpd",
    frozenset({"files"}),
    lambda c: smtp(c.tb, c.flow, c.workload, c.meters, c.seed),
    _seconds,
    tools=lambda w: ("curl", "python3", "aiosmtpd"),
    article="an",
)
