"""Work inside a network namespace from this process, with no program started.

setns(2) moves only the calling thread (CAP_SYS_ADMIN: root, as the namespace testbed
is), so a thread of its own enters the namespace `ip netns add` made (/run/netns/NS),
does the work and ends: the caller's thread never moves. In there, what the kernel keys
by the calling thread's namespace is that namespace's: a socket made, /proc/sys/net/...
and /proc/thread-self/net/... (sysfs is not: it shows the namespace it was mounted in).

Under the micro-VM's emulation a program costs ~0.1-0.2 s of CPU; the meters read every
wire end's counters before and after each workload, 24 `ip` commands a run on `line`."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000  # setns(2)'s namespace type: a network namespace


def on_thread(work: Callable[[], T], name: str, timeout: float = 30) -> T:
    """`work()`'s value, called on a thread of its own (what it raises is raised here, in
    the caller's thread): for what changes the calling thread alone — its namespace,
    its CPUs. A `work` still running after `timeout` is left to end by itself (it holds
    nothing of the caller's; the caller gets a TimeoutError)."""
    done: list[T] = []
    failed: list[BaseException] = []

    def call() -> None:
        try:
            done.append(work())
        except BaseException as e:  # raised below, in the caller's thread
            failed.append(e)

    t = threading.Thread(target=call, name=name, daemon=True)
    t.start()
    t.join(timeout)
    if failed:
        raise failed[0]
    if not done:
        raise TimeoutError(f"{name}: not done within {timeout:g} s")
    return done[0]


def within(ns: str, work: Callable[[], T], timeout: float = 30) -> T:
    """`work()`'s value, called in a thread that entered network namespace `ns` (by its
    name under /run/netns); what it raises is raised here, in the caller's thread."""

    def enter_and_work() -> T:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/run/netns/{ns}") as there:
            if libc.setns(there.fileno(), CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"setns into {ns}: {os.strerror(e)}")
        return work()

    return on_thread(enter_and_work, f"in-{ns}", timeout)


def net_dev() -> dict[str, dict[str, int]]:
    """The calling thread's namespace's interfaces: rx/tx bytes and packets, from
    /proc/thread-self/net/dev (the kernel's 64-bit counters, those `ip -s link` shows)."""
    with open("/proc/thread-self/net/dev") as f:
        lines = f.read().splitlines()[2:]  # two lines of headings
    out = {}
    for line in lines:
        name, _, rest = line.partition(":")
        v = [int(x) for x in rest.split()]
        # receive: bytes packets errs drop fifo frame compressed multicast; then transmit
        out[name.strip()] = {"rx_bytes": v[0], "rx_packets": v[1],
                             "tx_bytes": v[8], "tx_packets": v[9]}  # fmt: skip
    return out


def sysctl_path(key: str) -> str:
    """/proc/sys's file for a sysctl key, as sysctl(8) reads one: when its first
    separator is a dot, dots separate and a slash stands for a dot in a name
    (`net.ipv4.conf.eth0/1.forwarding`); else it is the path (`net/ipv4/ip_forward`)."""
    first = next((c for c in key if c in "./"), "/")
    rel = key.translate(str.maketrans("./", "/.")) if first == "." else key
    parts = rel.split("/")  # empty, absolute, `a//b`: an empty part
    if "" in parts or ".." in parts:
        raise ValueError(f"not a sysctl key: {key!r}")
    return f"/proc/sys/{rel}"


def write_sysctl(key: str, value: str) -> None:
    """Set a sysctl of the calling thread's network namespace: one under net. (any other
    is the whole machine's, and refused)."""
    path = sysctl_path(key)
    if not path.startswith("/proc/sys/net/"):
        raise ValueError(f"not a network namespace's own sysctl: {key!r}")
    with open(path, "w") as f:
        f.write(value)
