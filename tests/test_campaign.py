"""A campaign's guard rails without namespaces: `run` checks the scenario before root, a
backend that dies fails its run instead of being measured, and key files are private."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from conftest import cli
from ipsec_lab import runner, scenario, workloads
from ipsec_lab.testbed import topology
from ipsec_lab.traffic.workload import Context


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=60, env=env)


def test_run_with_a_bad_scenario_names_the_key_and_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("topology = 'star'\n")
    p = _cli("run", str(f), "--lab", str(tmp_path / "lab"))
    assert p.returncode == 2
    assert f"{f}: topology: must be one of pair, line, clients" in p.stderr
    assert not (tmp_path / "lab" / "results.sqlite").exists()


def test_run_refuses_without_root_after_checking_the_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ipsec_lab import cli

    f = tmp_path / "s.toml"
    f.write_text('backends = ["none"]\n')
    monkeypatch.setattr("os.geteuid", lambda: 1000)  # an ordinary user
    assert cli.main(["run", str(f), "--lab", str(tmp_path / "lab")]) == 2
    assert "needs root" in capsys.readouterr().err
    assert not (tmp_path / "lab").exists()
    assert cli.main(["clean"]) == 2
    assert "needs root" in capsys.readouterr().err


OURS_TWICE = """
backends = ["ours"]
configurations = ["esp:aes128gcm16"]
repetitions = 2
[[links]]
preset = "ethernet-10"
[[workloads]]
kind = "tcp"
bytes = "10M"
"""


class _Testbed:
    """What Campaign._one asks of a testbed, and no namespaces."""

    remote = False

    topo = topology("line")

    def log_mark(self) -> dict[str, int]:
        return {}

    def logs_since(self, mark: dict[str, int]) -> list[tuple[str, str]]:
        return [("ipsec-gw-gwA.log", "ipsec-gw: worker inbound panicked")]

    def driven(self, node: str) -> bool:
        return True

    def run(self, node: str, argv: list[str], **kw: object) -> str:
        assert argv[:4] == ["ip", "-j", "link", "show"], argv  # the outer link's MTU
        return '[{"ifname": "wan", "mtu": 1600}]'


def test_a_run_whose_gateway_died_is_failed_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ipsec-gw exiting during a run (the workload itself went fine: the lab's gateways
    keep plain routes, so traffic can flow without it) fails that run and the next one,
    which is not run at all — and says which process exited, with status and log."""
    from ipsec_lab.backends.ours import Ours

    sc = scenario.parse(OURS_TWICE, "t.toml")
    c = runner.Campaign(sc, tmp_path / "lab")
    gw = Ours()
    gw._procs = {"gwA": subprocess.Popen(["sleep", "30"]), "gwB": subprocess.Popen(["sleep", "30"])}
    ran: list[str] = []

    def workload(ctx: Context) -> list:
        ran.append(ctx.workload.kind)
        gw._procs["gwB"].kill()  # the gateway dies while traffic flows
        gw._procs["gwB"].wait()
        return [{"label": "tcp", "mbps": 95.0}]

    tcp = dataclasses.replace(workloads.BY_KIND["tcp"], run=workload)
    monkeypatch.setitem(workloads.BY_KIND, "tcp", tcp)
    first, second = [p for p in c.plan if p.workload.kind == "tcp"][:2]
    seen: list[tuple[str, str]] = []
    c.on_progress = lambda p: seen.append((p.last, p.more))
    try:
        c._one(_Testbed(), gw, first, "ipsec-gw test")  # type: ignore[arg-type]
        c._one(_Testbed(), gw, second, "ipsec-gw test")  # type: ignore[arg-type]
        assert gw.died() == "ipsec-gw gwB exited (status -9)"  # gwA still runs
    finally:
        gw._procs["gwA"].kill()
    runs = {r["repetition"]: r for r in c.store.runs(c.id)}
    assert [r["status"] for r in runs.values()] == ["failed", "failed"]
    assert ran == ["tcp"], "the second run must not run through a dead gateway"
    assert "ours went down during the run: ipsec-gw gwB exited (status -9)" in runs[1]["reason"]
    assert "worker inbound panicked" in runs[1]["reason"]  # the gateway's own log
    assert runs[2]["reason"].startswith("ours is down: ipsec-gw gwB exited (status -9)")
    # the progress line is the reason's first line; the rest (the log) goes with it
    last, more = next((x, y) for x, y in seen if x.startswith("failed"))
    assert "\n" not in last and last.startswith("failed") and "went down" in last, last
    assert "worker inbound panicked" in more and "worker inbound panicked" not in last


def test_a_log_of_a_run_says_a_failed_runs_whole_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In a pipe or a log (`quiet`), each run's line, and after a failed run's line its
    whole reason indented: CI's log showed only the first line, and the daemon's own
    words that named the failure were in the store alone."""
    from ipsec_lab.cli.output import run_with_progress

    class Fake:
        on_progress: object = None

        def run(self) -> None:
            p = runner.Progress(total=2)
            p.done, p.failed, p.last = 1, 1, "failed  ours | x: backend ours failed to start"
            p.more = "--- charon.log ---\nvici: connection refused"
            self.on_progress(p)  # type: ignore[misc, operator]
            p.done, p.last, p.more = 2, "done    ours | y: tcp 95 Mbit/s", ""
            self.on_progress(p)  # type: ignore[misc, operator]

    run_with_progress(Fake(), quiet=True)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "[1/2] failed  ours | x: backend ours failed to start",
        "    --- charon.log ---",
        "    vici: connection refused",
        "[2/2] done    ours | y: tcp 95 Mbit/s",
    ], err


def test_key_files_and_their_directories_are_private_from_the_start(tmp_path: Path) -> None:
    """Issue 29, item 12: a file holding keys is created 0600 (never readable by others
    between a write and a chmod), a file that existed with a wider mode is narrowed before
    the keys go in, a symlink put in its place is refused, and a run's directories are
    0700 whatever the umask."""
    import os
    import stat

    from ipsec_lab.backends import private_dir, private_file

    old = os.umask(0)  # the widest umask: nothing may depend on it
    try:
        d = private_dir(tmp_path / "run" / "ipsec-gw")
        f = d / "gwA.toml"
        private_file(f, 'enc_key = "00"\n')
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        wide = d / "old.toml"
        wide.write_text("x")
        wide.chmod(0o644)
        private_file(wide, "keys\n")
        assert stat.S_IMODE(wide.stat().st_mode) == 0o600 and wide.read_text() == "keys\n"
        target = tmp_path / "elsewhere"
        target.write_text("precious\n")
        link = d / "link.toml"
        link.symlink_to(target)
        with pytest.raises(OSError):
            private_file(link, "keys\n")
        assert target.read_text() == "precious\n"
    finally:
        os.umask(old)
