"""The SPD's lookup against the number of tunnels (1 to 4,096): ns per lookup of the
indexed SPD against the ordered scan it replaced, same rules and packets, in the same run
(crates/ipsec/examples/spd_scale.rs, built --release). Prints its JSON; `scan_over_index`
is the ratio. Not a test: nothing here asserts a time.

    .venv/bin/python benchmarks/spd_scale.py [N ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    cmd = ["cargo", "run", "--release", "-q", "-p", "ipsec", "--example", "spd_scale", "--",
           *argv]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        return out.returncode
    print(json.dumps(json.loads(out.stdout), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
