"""A/B of the engine: `ipsec-lab bench` of another commit (A, built from REF in a git
worktree) against this checkout's (B), in alternating runs, as JSON — per (suite, op,
size) the median Mpps of each side and B's ratio to A. Every refactor of the engine shows
with it that it cost nothing.

    .venv/bin/python benchmarks/engine_ab.py 5505de5 [--rounds 3] [--suite aes128gcm16 ...]
        [--size 64 --size 1420] [--op seal --op open] [--budget-ms 80] [--b OTHER_REF]

REF's engine (its Python extension, with its own ipsec_lab package) is built with
maturin into target/engine-ab/REF and run from there; a second call with the same REF
reuses it. Runs alternate A, B, A, B, … so a machine's drift lands on both sides; each
run is a fresh process. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["aes128gcm16", "chacha20poly1305", "aes128-sha1"]
SIZES = [64, 1420]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def build(ref: str) -> Path:
    """REF's ipsec_lab (Python and extension) installed in a folder of its own."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    dest = ROOT / "target" / "engine-ab" / commit[:12]
    if (dest / "ipsec_lab").is_dir():
        return dest
    maturin = Path(sys.executable).with_name("maturin")
    with tempfile.TemporaryDirectory(prefix="engine-ab-") as tmp:
        tree = Path(tmp) / "tree"
        _git("worktree", "add", "--detach", str(tree), commit)
        try:
            wheels = Path(tmp) / "wheels"
            env = {**os.environ, "CARGO_TARGET_DIR": str(ROOT / "target" / "engine-ab" / "build")}
            subprocess.run([str(maturin), "build", "--release", "-q", "-o", str(wheels)],
                           cwd=tree, env=env, check=True)  # fmt: skip
            (wheel,) = wheels.glob("*.whl")
            part = dest.with_name(dest.name + ".part")
            shutil.rmtree(part, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--target", str(part), str(wheel)], check=True)  # fmt: skip
            part.rename(dest)
        finally:
            _git("worktree", "remove", "--force", str(tree))
    return dest


def bench(path: Path | None, args: argparse.Namespace) -> dict[tuple[str, str, int], float]:
    """One `ipsec-lab bench --json` run of the engine at `path` (None: this checkout's):
    Mpps by (suite, op, size)."""
    cmd = [sys.executable, "-m", "ipsec_lab.cli", "bench", "--json",
           "--budget-ms", str(args.budget_ms), "--trials", str(args.trials)]  # fmt: skip
    for s in args.suite or SUITES:
        cmd += ["--suite", s]
    for n in args.size or SIZES:
        cmd += ["--size", str(n)]
    for op in args.op or ["seal", "open"]:
        cmd += ["--op", op]
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = str(path)
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)["results"]
    return {(r["suite"], r["op"], int(r["size"])): float(r["mpps"]) for r in rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", help="the commit to compare against (A)")
    ap.add_argument(
        "--b",
        metavar="REF",
        help="B another commit's engine instead of this "
        "checkout's (to find which commit a change came in)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="A/B pairs (default 3)")
    ap.add_argument("--suite", action="append", help=f"default: {' '.join(SUITES)}")
    ap.add_argument("--size", action="append", type=int, help="default: 64 1420")
    ap.add_argument("--op", action="append", choices=["seal", "open"])
    ap.add_argument("--budget-ms", type=int, default=80)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    a_path = build(args.ref)
    b_path = build(args.b) if args.b else None
    runs: dict[str, list[dict[tuple[str, str, int], float]]] = {"a": [], "b": []}
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
        runs["a"].append(bench(a_path, args))
        runs["b"].append(bench(b_path, args))
    cells: list[dict[str, Any]] = []
    for key in runs["b"][0]:
        if key not in runs["a"][0]:
            continue
        a = statistics.median(r[key] for r in runs["a"])
        b = statistics.median(r[key] for r in runs["b"])
        cells.append({"suite": key[0], "op": key[1], "size": key[2], "a_mpps": round(a, 3),
                      "b_mpps": round(b, 3), "ratio": round(b / a, 3)})  # fmt: skip
    doc = {
        "a": args.ref, "b": args.b or _git("rev-parse", "--short", "HEAD") + ("+" if _git(
            "status", "--porcelain", "--untracked-files=no") else ""),
        "rounds": args.rounds, "median_ratio": round(statistics.median(
            c["ratio"] for c in cells), 3) if cells else None,
        "cells": cells,
    }  # fmt: skip
    json.dump(doc, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
