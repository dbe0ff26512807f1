"""Study 3's CPU soaker: a busy loop on every CPU at the lowest priority there is
(SCHED_IDLE), counting how much work it gets done. On an idle machine it gets all of each
CPU; while traffic runs it gets only what everything else leaves, kernel softirq work
included — which is why FreeS/WAN's authors used it: kernel IPsec hides from load
averages. CPU used by the rest = 1 - (soaker's rate now / its rate when idle), per CPU.

It is opt-in (`soaker = true` in a scenario): it keeps every CPU busy, so the machine-wide
/proc/stat figures then count it too; the soaker's own figures are reported beside them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing.sharedctypes import Synchronized
from typing import Any

CHUNK = 20_000  # loop iterations between counter updates


def _loop(cpu: int, counter: Synchronized[int], stop: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    x = 0
    while not stop.is_set():
        for i in range(CHUNK):
            x ^= i
        with counter.get_lock():
            counter.value += 1


class Soaker:
    def __init__(self) -> None:
        ctx = mp.get_context("fork")
        self.cpus = sorted(os.sched_getaffinity(0))
        self.stop_event = ctx.Event()
        self.counters: list[Synchronized[int]] = [ctx.Value("q", 0) for _ in self.cpus]
        self.procs = [
            ctx.Process(target=_loop, args=(c, n, self.stop_event), daemon=True)
            for c, n in zip(self.cpus, self.counters)
        ]
        self.idle_rate: list[float] = []

    def _counts(self) -> list[int]:
        return [int(c.value) for c in self.counters]

    def start(self, calibrate_s: float = 1.0) -> None:
        for p in self.procs:
            p.start()
        time.sleep(0.2)
        # The idle rate is the best the loop does: the maximum over short windows, so a
        # disturbance during calibration does not lower it.
        windows = [self._rate(calibrate_s / 5) for _ in range(5)]
        self.idle_rate = [max(w[i] for w in windows) for i in range(len(self.cpus))]
        if not all(self.idle_rate):
            self.close()
            raise RuntimeError("the CPU soaker made no progress while calibrating")

    def _rate(self, seconds: float) -> list[float]:
        a, t = self._counts(), time.monotonic()
        time.sleep(seconds)
        b, dt = self._counts(), time.monotonic() - t
        return [(y - x) / dt for x, y in zip(a, b)]

    def mark(self) -> tuple[list[int], float]:
        return self._counts(), time.monotonic()

    def used_since(self, mark: tuple[list[int], float]) -> dict[str, Any]:
        """CPUs' worth used by everything but the soaker since `mark`, per CPU and in all."""
        counts, t0 = mark
        dt = time.monotonic() - t0
        now = self._counts()
        per = [
            max(0.0, 1.0 - (b - a) / dt / idle) for a, b, idle in zip(counts, now, self.idle_rate)
        ]
        return {"soaker_cpu_used": sum(per), "soaker_per_cpu": per, "soaker_wall_s": dt}

    def close(self) -> None:
        self.stop_event.set()
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join(2)
