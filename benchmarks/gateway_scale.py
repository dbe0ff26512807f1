"""ipsec-gw's set-up against the number of tunnels (issue 44 item 2): for N tunnels —
each its own inner prefix pair, an SA each way with its own fresh key, a policy each way
and a route — the seconds `--check` takes, the seconds from start to "up" (the TUN
device, the routes, the guard, the engines), a reload (SIGHUP) that adds one tunnel to
"reloaded", a stop (SIGTERM) to exit, and the gateway's memory (RSS once up). N = 1 is
the baseline measured in the same run: `vs_1` holds each figure's ratio to it. Medians
of `--repeat` starts. Prints JSON; asserts no time.

Needs root: each start is in a network namespace of its own (a veth outer link, no
traffic), removed after, even on failure.

    sudo .venv/bin/python benchmarks/gateway_scale.py [--tunnels 1,256,4096] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import emit  # noqa: E402

from ipsec_lab.backends.ours import GATEWAY_USER, gateway_binary  # noqa: E402
from ipsec_lab.cli.args import whole  # noqa: E402

LOCAL, REMOTE = "192.0.2.1", "192.0.2.2"
UP_S = 120  # the most a start (or a reload) may take before the benchmark gives up


def inner(i: int, theirs: bool) -> str:
    """Tunnel i's inner prefix: ours 10.0.0.0/12's i-th /24, theirs 10.128.0.0/12's."""
    base = (10 << 24) | ((128 << 16) if theirs else 0)
    a = base + (i << 8)
    return f"{a >> 24}.{(a >> 16) & 255}.{(a >> 8) & 255}.0/24"


def config(n: int, d: Path, keys: list[str]) -> str:
    """gwA's TOML for the first n tunnels, SA k's key keys[k] (AES-128-GCM)."""
    routes = ", ".join(f'"{inner(i, True)}"' for i in range(n))
    out = [
        f'[gateway]\ntun = "isl-scale0"\nmtu = "auto"\nlocal = "{LOCAL}"\nremote = "{REMOTE}"\n'
        f'routes = [{routes}]\nstats = "{d / "run" / "gw.sock"}"\nstate = "{d / "gw.state"}"\n'
    ]
    for i in range(n):
        mine, theirs = inner(i, False), inner(i, True)
        for way, spi, src, dst in (("out", 0x10000 + i, mine, theirs),
                                   ("in", 0x20000 + i, theirs, mine)):  # fmt: skip
            out.append(
                f'[[sa]]\nname = "t{i}-{way}"\ndirection = "{way}"\nspi = {spi}\n'
                f'encryption = "aes128gcm16"\nenc_key = "{keys[2 * i + (way == "in")]}"\n\n'
                f'[[policy]]\ndirection = "{way}"\nsrc = "{src}"\ndst = "{dst}"\n'
                f'action = "protect"\nsa = "t{i}-{way}"\n'
            )
    return "\n".join(out)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], after: int = 0) -> float:
    """Seconds until `text` appears in `log` past byte `after` (the process alive)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < UP_S:
        if text in log.read_text(errors="replace")[after:]:
            return time.perf_counter() - t0
        if proc.poll() is not None:
            raise SystemExit(f"ipsec-gw ended ({proc.returncode}):\n{log.read_text()[-2000:]}")
        time.sleep(0.002)
    raise SystemExit(f"no {text!r} in {UP_S} s:\n{log.read_text()[-2000:]}")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def one(gw: Path, n: int) -> dict[str, float]:
    """One start, reload and stop of n tunnels in a namespace of its own."""
    d = Path(tempfile.mkdtemp(prefix="isl-scale-"))
    ns = f"isl-scale-{os.getpid()}"
    proc: subprocess.Popen[bytes] | None = None
    try:
        # the config root's (the gateway refuses one its own user could change); its
        # stats socket in a directory of that user's, group root, 0770 (as the lab's:
        # bound while uid 0 without the capability to override file modes)
        d.chmod(0o711)
        (d / "run").mkdir(mode=0o770)
        shutil.chown(d / "run", GATEWAY_USER, "root")
        (d / "run").chmod(0o770)
        conf = d / "gw.toml"
        # each SA its own fresh key (16 bytes and the 4-byte salt)
        keys = [secrets.token_hex(20) for _ in range(2 * n + 2)]
        conf.write_text(config(n, d, keys))
        t0 = time.perf_counter()
        subprocess.run([str(gw), "--config", str(conf), "--check"], check=True,
                       capture_output=True, timeout=UP_S)  # fmt: skip
        check_s = time.perf_counter() - t0
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # (a veth pair inside it: this kernel may have no dummy links)
        sh("ip", "-n", ns, "link", "add", "wan", "type", "veth", "peer", "name", "wan-peer")
        sh("ip", "-n", ns, "addr", "add", f"{LOCAL}/24", "dev", "wan")
        for dev in ("wan", "wan-peer"):
            sh("ip", "-n", ns, "link", "set", dev, "up")
        log = d / "gw.log"
        with log.open("wb") as f:
            argv = ["ip", "netns", "exec", ns, str(gw), "--config", str(conf), "--init-state"]
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        start_s = wait_for(log, "ipsec-gw: up", proc)
        rss = rss_bytes(proc.pid)  # `ip netns exec` execs it: the PID is the gateway's
        # one tunnel more, its keys fresh, the others unchanged (CSIT's reconfiguration)
        conf.write_text(config(n + 1, d, keys))
        mark = log.stat().st_size
        proc.send_signal(signal.SIGHUP)
        reload_s = wait_for(log, "ipsec-gw: reload", proc, mark)
        if "refused" in log.read_text()[mark:]:
            raise SystemExit(f"the reload was refused:\n{log.read_text()[mark:][-2000:]}")
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(UP_S)
        stop_s = time.perf_counter() - t0
        proc = None
        return {"check_s": check_s, "start_s": start_s, "reload_s": reload_s,
                "stop_s": stop_s, "rss_bytes": float(rss)}  # fmt: skip
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(d, ignore_errors=True)


MOST_TUNNELS = 16_384  # ours and theirs stay apart up to 32,767 /24s each


def tunnel_counts(text: str) -> list[int]:
    """`--tunnels`: counts, comma-separated, each from 1 to MOST_TUNNELS."""
    one = whole(1, MOST_TUNNELS, "a tunnel count")
    counts = [one(x) for x in text.split(",") if x.strip()]
    if not counts:
        raise argparse.ArgumentTypeError("no counts: give them comma-separated, e.g. 1,256,4096")
    return counts


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tunnels", type=tunnel_counts, default="1,256,4096",
                    help="tunnel counts, comma-separated (1, the baseline, always)")  # fmt: skip
    ap.add_argument("--repeat", type=whole(1, None, "--repeat"), default=3,
                    help="starts per count (median)")  # fmt: skip
    ap.add_argument("--gateway", type=Path, help="the ipsec-gw to measure (default: the build's)")
    a = ap.parse_args(argv)
    gw = a.gateway or gateway_binary()
    if gw is None:
        print("no ipsec-gw built (make gateway)", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("needs root (network namespaces, a TUN device)", file=sys.stderr)
        return 2
    counts = sorted({1, *a.tunnels})
    rows: list[dict[str, Any]] = []
    for n in counts:
        runs = [one(gw, n) for _ in range(a.repeat)]
        row: dict[str, Any] = {"tunnels": n, "sas": 2 * n, "policies": 2 * n}
        for k in runs[0]:
            row[k] = statistics.median(r[k] for r in runs)
        row["rss_per_tunnel_bytes"] = (row["rss_bytes"] - rows[0]["rss_bytes"]) / (n - 1) \
            if rows and n > 1 else None  # fmt: skip
        if rows:
            row["vs_1"] = {k: round(row[k] / rows[0][k], 2) for k in runs[0] if rows[0][k]}
        rows.append(row)
        print(f"{n} tunnels: start {row['start_s']:.3f} s, reload {row['reload_s']:.3f} s",
              file=sys.stderr)  # fmt: skip
    return emit({"benchmark": "gateway_scale", "gateway": str(gw), "repeat": a.repeat,
                 "rows": rows})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
