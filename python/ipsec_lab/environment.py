"""What machine and software a measurement ran on (for every JSON result and report)."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_mhz() -> float | None:
    """This CPU's clock (the first core's, from /proc/cpuinfo or cpufreq), for turning CPU
    time into cycles (study 3's cycles per byte)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    try:
        import psutil

        f = psutil.cpu_freq()
        return float(f.current) if f and f.current else None
    except (ImportError, AttributeError, NotImplementedError):
        return None


def git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


@functools.cache
def build_id(*programs: Path) -> str:
    """What measured, byte for byte: SHA-256 (its first 16 hex digits) of every file of the
    lab's package — its Python and the engine it loads — and of `programs` (ipsec-gw's
    binary). Two campaigns with one build id ran the same code."""
    import hashlib

    package = Path(__file__).resolve().parent
    files = sorted(p for p in package.rglob("*") if p.is_file()
                   and p.suffix in (".py", ".so") and "__pycache__" not in p.parts)  # fmt: skip
    h = hashlib.sha256()
    for p in [*files, *programs]:
        name = str(p.relative_to(package) if p.is_relative_to(package) else p).encode()
        # a program that is not there (a stale $IPSEC_GW) is its name: no campaign that
        # runs it will finish, and one that does not (`none`) is not refused for it
        data = p.read_bytes() if p.is_file() else b""
        for part in (name, data):  # each part with its length: no two splits alike
            h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()[:16]


# What must be equal for two campaigns to be measurements of the same thing in the same
# place (`same_place`): the build, and the machine as `describe` says it.
SAME_PLACE = ("build", "cpu", "cpus", "machine", "kernel", "vm")


def same_place(env: dict[str, object], now: dict[str, object]) -> bool:
    """Whether a campaign's stored environment `env` is this build on this machine
    (`now`: `describe()` with the build id)."""
    return all(env.get(k) == now.get(k) for k in SAME_PLACE) and now.get("build") is not None


def identity() -> dict[str, object]:
    """What identifies this machine's own forwarding: its name, CPU, kernel and VM (not
    the build, nor the Python: plain forwarding is the kernel's). The testbed key of
    ceiling.py; `describe` says the same and more, without the name."""
    return {
        "node": platform.node(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        # set by `--vm`: "kvm|tcg, kernel …" — TCG figures are emulated
        "vm": os.environ.get("IPSEC_LAB_VM"),
    }


def describe() -> dict[str, object]:
    from ipsec_lab import __version__

    me = identity()
    return {
        "cpu": me["cpu"],
        "cpu_mhz": cpu_mhz(),
        "cpus": me["cpus"],
        "kernel": me["kernel"],
        "machine": platform.machine(),
        "python": platform.python_version(),
        "ipsec_lab": __version__,
        "git": git_revision(),
        "vm": me["vm"],
    }
