"""What machine and software a measurement ran on (for every JSON result and report)."""

from __future__ import annotations

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


def describe() -> dict[str, object]:
    from ipsec_lab import __version__

    return {
        "cpu": cpu_model(),
        "cpu_mhz": cpu_mhz(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "ipsec_lab": __version__,
        "git": git_revision(),
        # set by `--vm`: "kvm|tcg, kernel …" — TCG figures are emulated
        "vm": os.environ.get("IPSEC_LAB_VM"),
    }
