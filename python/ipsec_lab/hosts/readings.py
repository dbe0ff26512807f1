"""What the lab reads from a real host: the interface its SSH session uses, the CPU of
the whole host (/proc/stat) and of given processes (/proc/PID/stat and status), and
which processes run under a given name."""

from __future__ import annotations

import json
import shlex

from ipsec_lab.hosts.ssh import Ssh


def ssh_interface(h: Ssh) -> str | None:
    """The interface the host's end of our SSH session uses (from SSH_CONNECTION)."""
    r = h.run("echo $SSH_CONNECTION", root=False, check=False, timeout=15)
    parts = r.stdout.split()
    if len(parts) < 1:
        return None
    r = h.run(["ip", "-j", "route", "get", parts[0]], check=False, timeout=15)
    try:
        data = json.loads(r.stdout)
    except json.JSONDecodeError:
        return None
    return data[0].get("dev") if data else None


def proc_stat(text: str) -> tuple[float, float, int]:
    """(busy s, total s, CPUs) from /proc/stat: user+nice+system+irq+softirq as busy,
    steal left out (another guest's), at USER_HZ 100."""
    first = text.splitlines()[0].split()
    v = [int(x) for x in first[1:]]
    user, nice, system, idle, iowait, irq, softirq = v[:7]  # steal (v[7]) is not ours
    busy = user + nice + system + irq + softirq
    total = busy + idle + iowait
    ncpu = sum(1 for line in text.splitlines() if line.startswith("cpu") and line[3:4].isdigit())
    return busy / 100, total / 100, ncpu


def proc_cpu_line(pids: list[int]) -> str:
    """A shell line printing, per live process of `pids`, what `proc_cpu` reads."""
    return "; ".join(
        f's=$(cat /proc/{int(x)}/stat 2>/dev/null) && echo "{int(x)} rss='
        f"$(grep VmRSS /proc/{int(x)}/status | tr -s ' ' | cut -d' ' -f2) "
        f'${{s##*) }}"' for x in pids) + "; true"  # fmt: skip


def proc_cpu(text: str) -> tuple[float, int]:
    """(CPU s, resident bytes) summed over lines of `PID rss=<VmRSS kB> <fields 3… of
    /proc/PID/stat>` (the fields after the command's closing parenthesis, which may
    itself hold spaces): utime + stime, fields 14 and 15, at USER_HZ 100."""
    cpu, rss = 0.0, 0
    for line in text.splitlines():
        w = line.split()
        if len(w) < 16 or not w[1].startswith("rss="):
            continue
        cpu += (int(w[13]) + int(w[14])) / 100  # w[2] is field 3
        kb = w[1].removeprefix("rss=")
        rss += int(kb) * 1024 if kb.isdigit() else 0
    return cpu, rss


def offload_features(text: str) -> dict[str, bool]:
    """The shaping's offload features in `ethtool -k IFNAME`'s output, as they are now
    (only those the device lets one change)."""
    names = {"tcp-segmentation-offload": "tso", "generic-segmentation-offload": "gso",
             "tx-udp-segmentation": "tx-udp-segmentation",
             "generic-receive-offload": "gro"}  # fmt: skip
    out: dict[str, bool] = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in names and "[fixed]" not in v:
            out[names[k.strip()]] = v.split()[0] == "on" if v.split() else False
    return out


def named_line(comm: str) -> str:
    """A shell line listing the processes whose command name is `comm`, for `running`.
    One `grep` over every /proc/PID/comm, not a `cat` per process: a loop of forks
    took over 20 s on a loaded host (a QEMU guest beside other work), and the check
    then failed where nothing was wrong."""
    return f"grep -lsx -- {shlex.quote(comm)} /proc/[0-9]*/comm; true"


def running(text: str) -> list[str]:
    """The PIDs in `named_line`'s output (lines /proc/PID/comm)."""
    parts = [w.split("/") for w in text.split()]
    return [p[2] for p in parts if len(p) == 4 and p[:2] == ["", "proc"] and p[2].isdigit()]
