"""`ipsec-lab run` as a person runs it (needs root, as CI runs it): the live display and
summary in a real terminal and in a pipe, a busy machine flagged, `--resume` with
nothing left, and `check` on every shipped scenario. Each test checks, after it, that
nothing of the lab is left (test_lab_root's fixture)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ipsec_lab.meters import BUSY_CPUS
from terminal import in_pipe, in_terminal, plain

# The lab tests' own check, autouse here too: no namespace, cgroup or process of a test
# left behind (and root required).

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[1]

TINY = """# one run of plain forwarding: the smallest campaign
name = "tiny"
topology = "line"
backends = ["none"]
warmup_s = 0.5

[[workloads]]
kind = "tcp"
seconds = 1
"""


def _tiny(tmp_path: Path, text: str = TINY) -> tuple[Path, Path]:
    f = tmp_path / "tiny.toml"
    f.write_text(text)
    return f, tmp_path / "lab"


def test_run_in_a_terminal_and_in_a_pipe(tmp_path: Path) -> None:
    f, lab = _tiny(tmp_path)
    rc, out = in_terminal(["run", str(f), "--lab", str(lab)], 80, timeout=180)
    text = plain(out)
    assert rc == 0 and "Traceback" not in out, text[-3000:]
    assert "\x1b[" in out  # the live display and the table's styles, on a terminal only
    assert f"results in {lab / 'results.sqlite'}" in text  # where the results go, said first
    assert "campaign 1: tiny" in text and "1 runs planned: 1 done" in text
    assert "Mbit/s" in text and "…" not in text
    rc, out = in_pipe(["run", str(f), "--lab", str(lab)], timeout=180)
    assert rc == 0 and "\x1b[" not in out, out[-3000:]
    assert "[1/1] done" in out and "campaign 2: tiny" in out
    rc, out = in_terminal(["results", "2", "--lab", str(lab)], 120)
    assert rc == 0 and "none" in plain(out) and "…" not in out


def test_a_run_on_a_busy_machine_is_flagged(tmp_path: Path) -> None:
    f, lab = _tiny(tmp_path)
    cmd = [sys.executable, "-m", "ipsec_lab.cli", "run", str(f), "--lab", str(lab), "--json"]
    quiet = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=180).stdout)
    # a baseline from this test, not a quiet machine assumed: whatever else runs here, the
    # flag says whether it passed the threshold, and our own loop below adds about a CPU
    base = quiet["runs"][0]["results"][0]
    assert base["busy"] is (base["other_cpu_before"] > BUSY_CPUS)
    # A busy loop of our own (bounded: it ends by itself after 120 s) beside the run.
    spin = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"
    loop = subprocess.Popen([sys.executable, "-c", spin])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    finally:
        os.kill(loop.pid, signal.SIGKILL)
        loop.wait()
    assert p.returncode == 0, p.stderr[-3000:]
    assert "warning: other processes are using" in p.stderr
    doc = json.loads(p.stdout)
    row = doc["runs"][0]["results"][0]
    assert row["busy"] is True and row["other_cpu_before"] > base["other_cpu_before"] + 0.5
    assert doc["summary"][0]["busy_runs"] == 1
    assert "BUSY machine in 1 of 1 runs" in doc["summary"][0]["note"]
    assert "[busy machine: other processes used" in p.stderr
    csv = in_pipe(["results", str(doc["campaign"]), "--lab", str(lab), "--csv"])[1]
    import csv as csv_

    first = next(csv_.DictReader(csv.splitlines()))  # a field may hold a comma, quoted
    assert first["busy"] == "True"


def test_resume_says_when_there_is_nothing_to_resume(tmp_path: Path) -> None:
    f, lab = _tiny(tmp_path)
    rc, out = in_pipe(["run", str(f), "--lab", str(lab), "--resume"])
    assert rc == 2 and "nothing to resume: no results in" in out
    rc, out = in_pipe(["run", str(f), "--lab", str(lab)], timeout=180)
    assert rc == 0, out[-3000:]
    # A comment edited: the same scenario, finished: nothing to do, and where it is.
    f.write_text(TINY.replace("# one run", "# just one run") + "# note\n")
    rc, out = in_pipe(["run", str(f), "--lab", str(lab), "--resume"])
    assert rc == 0 and "nothing to resume: campaign 1 of this scenario finished" in out, out
    # Unfinished, it resumes (the edited text still matches), with no run left to do.
    from ipsec_lab.store import Store

    store = Store(lab / "results.sqlite")
    store.set_status(1, "interrupted")
    store.close()
    rc, out = in_pipe(["run", str(f), "--lab", str(lab), "--resume"], timeout=180)
    assert rc == 0 and "resuming campaign 1: tiny — 0 of 1 runs to do" in out, out
    # Other runs under the same name: said so, and nothing started.
    f.write_text(TINY.replace('["none"]', '["none", "ours"]'))
    rc, out = in_pipe(["run", str(f), "--lab", str(lab), "--resume"])
    assert rc == 2 and "has this scenario's name but other runs" in out, out
    assert in_pipe(["results", "--lab", str(lab), "--json"])[1].count('"id"') == 1


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.toml")), ids=lambda p: p.name)
def test_check_says_what_each_shipped_scenario_will_run(path: Path) -> None:
    from ipsec_lab import preflight, scenario

    rc, out = in_pipe(["check", str(path), "--json"])
    assert rc == 0, out
    doc = json.loads(out)
    sc = scenario.load(path)
    assert doc["runs"] == len(preflight.plan(sc)) == doc["will_run"] + doc["skipped"]
    assert doc["unknown"] == 0  # as root every probe ran
    for g in doc["groups"]:
        assert (g["status"] == "skip") == bool(g["reason"]), g
    if "strongswan" in sc.backends:
        assert doc["backends"]["strongswan"]["runs_as"] in (
            "strongswan-kernel", "strongswan-libipsec",
        )  # fmt: skip
    assert doc["estimated_s"] > 0 or doc["will_run"] == 0
    rc, human = in_terminal(["check", str(path)], 80)
    assert rc == 0 and "…" not in human and f"{doc['runs']} runs:" in plain(human)
