"""Real traffic through a testbed: iperf3 bulk TCP and fixed-size UDP, the RFC 2544
loss-free rate search, simple IMIX, HTTP (nginx + curl) and SMTP (aiosmtpd + curl).

Each workload returns one or more measurements (dicts); `Metered` wraps each one in the
meters (CPU, interface counters, the IPsec processes' CPU) so every row carries its own
effort and wire figures. Every program runs with a timeout: no traffic loop is unbounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import Testbed

Row = dict[str, Any]
# metered(label, fn): runs fn() inside the meters and returns its row with them added.
Metered = Callable[[str, Callable[[], Row]], Row]


@dataclass(frozen=True)
class Meters:
    """The runner's `Metered`, with the data plane's clock — per IPsec node, (CPU ns its
    processes have run, packets it has sealed or opened) so far — for a workload that
    times its own trials (rfc2544's overload trials); it reads {} where the IPsec under
    test has none (plain forwarding, the kernel's ESP, a daemon that does not count)."""

    meter: Metered
    plane_clock: Callable[[], dict[str, tuple[int, int]]] | None
    # the IPsec processes' (CPU s, resident bytes) so far, summed over the nodes (None:
    # none the lab can read) — for a workload that records them as it goes (soak)
    procs: Callable[[], tuple[float, int] | None] | None = None

    def __call__(self, label: str, fn: Callable[[], Row]) -> Row:
        return self.meter(label, fn)


IPV4_UDP = 28  # IPv4 (20) + UDP (8) header bytes in front of an iperf3 UDP payload
BACKGROUND_NICE = 19  # a load beside latency probes: never ahead of the instrument


def niced(argv: list[str], niceness: int) -> list[str]:
    """`argv` run at CPU priority `niceness` (as is at 0)."""
    return ["nice", "-n", str(niceness), *argv] if niceness else argv


T = TypeVar("T")


def steady(read: Callable[[], T], span_s: float, every_s: float, max_s: float,
           key: Callable[[T], object] = lambda x: x, first: T | None = None) -> T:  # fmt: skip
    """`read()`'s answer once it has stayed the same (compared by `key`) for `span_s`:
    read every `every_s`, the span timed from the end of the read that first gave the
    answer to the start of the read that gives it again — never more than the counter
    really stood still — so a wait ends `span_s` after the last change, not up to
    twice that as with reads `span_s` apart. At most `max_s`: then the newest answer.
    `first`: an answer read just now, to start from."""
    last = read() if first is None else first
    since = time.monotonic()
    deadline = since + max_s
    while True:
        time.sleep(every_s)
        start = time.monotonic()
        now = read()
        if key(now) != key(last):
            last, since = now, time.monotonic()
        elif start - since >= span_s:
            return now
        if time.monotonic() >= deadline:
            return now


def wait_listening(
    tb: Testbed, node: str, port: int, proto: str = "t", timeout: float = 10
) -> None:
    """Wait until something in `node` listens on `port` (TCP `t` or UDP `u`).

    The whole wait is `timeout`: a probe that is itself slow (a starved or emulated
    machine, where one `ss` took over 5 s) is given what is left of it, and one that
    runs out only means "not yet" — the wait fails once, at its deadline."""
    deadline = time.monotonic() + timeout
    slow = ""
    while (left := deadline - time.monotonic()) > 0:
        try:
            out = tb.run(node, ["ss", f"-ln{proto}H", f"sport = :{port}"], timeout=max(left, 1))
        except LabError as e:
            if "timed out" not in str(e):
                raise
            slow = " (its last probe, ss, timed out)"
            continue
        if out.strip():
            return
        time.sleep(0.05)
    raise LabError(f"nothing listens on port {port} in {node} after {timeout:g} s{slow}")
