"""The lab on hosts it shares with others: a local user of a host cannot get a command
run as root by the lab (a work directory, or a directory above it, that they made or
can write is refused at the start, by `hosts check` and by `clean --hosts`, and checked
again before each use, so a run's directory swapped mid-run is not used); an interface
name the host chose cannot run a command from the ledger; and hosts that share one work
directory each keep and undo their own ledger. Four sshd-in-namespace hosts sharing one
work directory (tests/sshlab.py, shared=True); the other user is a throw-away system
user, removed after each test. Needs root (CI runs as root)."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sshlab import NS_PREFIX, SshLab

pytestmark = pytest.mark.root

LAB = [sys.executable, "-m", "ipsec_lab.cli"]
SCENARIO = """
name = "shared hosts"
topology = "line"
backends = ["none"]
warmup_s = 0
[[links]]
preset = "ethernet-100"
[[workloads]]
kind = "tcp"
seconds = 1
"""


@pytest.fixture(scope="module")
def other() -> Iterator[tuple[str, int]]:
    """A local user of the hosts (they share this machine's /var/tmp), not the lab's:
    made before the hosts are (useradd replaces /etc/passwd, which detaches the copy a
    running host has mounted over it), removed after them, also on failure."""
    name = f"iplh-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    name], check=True, capture_output=True)  # fmt: skip
    try:
        yield name, pwd.getpwnam(name).pw_uid
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture(scope="module")
def lab(other: tuple[str, int]) -> Iterator[SshLab]:
    with SshLab(shared=True) as sl:
        yield sl


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    """A fresh name in /var/tmp (sticky, anyone may create there), removed after."""
    p = Path(f"/var/tmp/{NS_PREFIX}{secrets.token_hex(3)}")
    try:
        yield p
    finally:
        shutil.rmtree(p, ignore_errors=True)


def _who(other: tuple[str, int]) -> str:
    """How a host's `stat` names the other user (the hosts share this machine's users)."""
    return f"{other[0]} (uid {other[1]})"


def _as(user: str, line: str) -> None:
    subprocess.run(["runuser", "-u", user, "--", "sh", "-c", line], check=True)


def _lab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAB, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


def _hosts(lab: SshLab, tmp: Path, workdir: str | None = None) -> Path:
    f = lab.hosts_toml(tmp / "hosts.toml")
    if workdir:
        f.write_text(f.read_text().replace(f'workdir = "{lab.workdir}"', f'workdir = "{workdir}"'))
    return f


def _plant(user: str, run_dir: str, undo: str, program: str | None = None) -> None:
    """`user` makes `run_dir` (and what is above it, where they can) with a ledger whose
    one line is `undo`, and a `bin/ipsec-gw` running `program`."""
    entry = json.dumps({"what": "an address", "undo": undo})
    line = f"mkdir -p -m 0755 {run_dir} && echo {shlex.quote(entry)} > {run_dir}/ledger"
    if program:
        line += (f" && mkdir {run_dir}/bin && printf '#!/bin/sh\\n%s\\n' "
                 f"{shlex.quote(program)} > {run_dir}/bin/ipsec-gw && "
                 f"chmod 755 {run_dir}/bin/ipsec-gw")  # fmt: skip
    _as(user, line)


def test_a_work_directory_another_user_made_is_refused_by_clean_run_and_check(
    lab: SshLab, other: tuple[str, int], var_tmp: Path, tmp_path: Path
) -> None:
    """The attack of issue 39: a local user makes the work directory first (in
    /var/tmp, where anyone may) and plants a ledger whose undo line writes a file as
    root. `clean --hosts` names it, its owner and mode and the fix, exits 1 and runs
    nothing; a run refuses to start; `hosts check` fails naming it. No file is written."""
    user = other[0]
    pwned = tmp_path / "written-by-root"
    _plant(user, f"{var_tmp}/abc123-gwA", f"touch {pwned}")
    hosts = _hosts(lab, tmp_path, str(var_tmp))

    p = _lab("clean", "--hosts", str(hosts))
    assert p.returncode == 1, p.stdout + p.stderr
    said = f"work directory {var_tmp}: {var_tmp} is owned by {_who(other)}, mode 755"
    assert f"refused: gwA: {said}" in p.stderr, p.stderr
    assert "another user made it" in p.stderr and "/var/lib/ipsec-lab" in p.stderr
    assert "undid" not in p.stdout
    assert not pwned.exists()

    sc = tmp_path / "scenario.toml"
    sc.write_text(SCENARIO)
    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"), "--json")
    assert p.returncode == 1
    (run,) = json.loads(p.stdout)["runs"]
    assert run["status"] == "failed" and said in run["reason"], run["reason"]
    assert not pwned.exists()
    assert sorted(os.listdir(var_tmp)) == ["abc123-gwA"]  # nothing made in it either

    p = _lab("hosts", "check", str(hosts))
    assert p.returncode == 1
    assert f"gwA: work directory: {var_tmp}: {var_tmp} is owned by {_who(other)}" in p.stderr
    assert not pwned.exists()
    assert lab.residue() == {}


def test_a_work_directory_under_another_users_directory_is_refused_and_not_made(
    lab: SshLab, other: tuple[str, int], var_tmp: Path, tmp_path: Path
) -> None:
    """The directory above the work directory is another user's (who could rename the
    run's directory and put their own in its place): `hosts check` fails naming it and
    makes nothing; a run refuses to start and makes nothing there."""
    user = other[0]
    _as(user, f"mkdir -m 0755 {var_tmp}")
    hosts = _hosts(lab, tmp_path, f"{var_tmp}/lab")
    p = _lab("hosts", "check", str(hosts), "--json")
    assert p.returncode == 1
    rows = {r["host"]: r for r in json.loads(p.stdout)["checks"] if r["check"] == "work directory"}
    assert set(rows) == {"client", "gwA", "gwB", "server"}
    assert all(r["status"] == "fail" for r in rows.values())
    assert f"{var_tmp} is owned by {_who(other)}, mode 755" in rows["gwB"]["detail"]
    assert os.listdir(var_tmp) == []

    sc = tmp_path / "scenario.toml"
    sc.write_text(SCENARIO)
    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"), "--json")
    assert p.returncode == 1
    (run,) = json.loads(p.stdout)["runs"]
    assert f"{var_tmp} is owned by {_who(other)}" in run["reason"], run["reason"]
    assert os.listdir(var_tmp) == []
    assert lab.residue() == {}


def test_a_run_directory_swapped_mid_run_is_not_used_and_teardown_runs_its_own_ledger(
    lab: SshLab, other: tuple[str, int], var_tmp: Path, tmp_path: Path
) -> None:
    """The directory above the work directory changes hands mid-run (it was root's at
    the start), and its new owner puts their own run directory, ledger and
    `bin/ipsec-gw` in place of the lab's: the pushed program is not run, and teardown
    runs the lab's own copy of the ledger (not the host's file), leaving out the lines
    that use the swapped directory, and says so."""
    from ipsec_lab import hosts as hostsfile
    from ipsec_lab.hosts.testbed import HostsTestbed
    from ipsec_lab.testbed import topology
    from ipsec_lab.testbed.build import LabError

    user, uid = other
    var_tmp.mkdir(mode=0o755)
    hosts = hostsfile.load(_hosts(lab, tmp_path, f"{var_tmp}/lab"))
    tb = HostsTestbed(topology("line"), hosts, tmp_path / "run")
    tb.rundir.mkdir(mode=0o700)
    pwned, ours = tmp_path / "written-by-root", tmp_path / "undone"
    try:
        tb.connect()
        prog = tmp_path / "prog"
        prog.write_text("#!/bin/sh\necho the lab\n")
        gw = tb.program("gwA", prog, "ipsec-gw")
        assert tb.run("gwA", [gw]) == "the lab\n"
        tb.record("gwA", "the gateway's guard", shlex.join([gw, "--release"]))
        tb.record("gwA", "an address", f"touch {ours}")
        os.chown(var_tmp, uid, -1)
        run_dir = tb.workdir("gwA")
        _as(user, f"mv {var_tmp}/lab {var_tmp}/was")
        _plant(user, run_dir, f"touch {pwned}", program=f"touch {pwned}")
        # (an UnsafeError: a LabError)
        with pytest.raises(LabError, match=re.escape(f"{var_tmp} is owned by {_who(other)}")):
            tb.run("gwA", [gw])
    except BaseException:
        try:
            tb.teardown()
        except LabError:
            pass
        raise
    with pytest.raises(LabError) as e:
        tb.teardown()
    assert not pwned.exists()
    assert ours.exists()  # the lab's own line, from its own copy
    assert f"gwA: work directory {var_tmp}/lab: {var_tmp} is owned by {_who(other)}" in str(e.value)
    assert "not run, as they use it: the gateway's guard" in str(e.value)
    assert lab.residue() == {}


def test_hosts_sharing_one_work_directory_each_keep_and_undo_their_own_ledger(
    lab: SshLab, tmp_path: Path
) -> None:
    """Issue 40: four nodes whose work directory is one (as two nodes on one machine,
    or a shared mounted directory): each has its own run directory and ledger, and
    every host is restored — by teardown, and by `clean --hosts` after a killed run."""
    from ipsec_lab import hosts as hostsfile
    from ipsec_lab.hosts.testbed import HostsTestbed
    from ipsec_lab.testbed import topology

    hosts = hostsfile.load(_hosts(lab, tmp_path))
    disk = lab.disk("gwA")
    assert disk == lab.disk("server")  # one directory for all four
    with HostsTestbed(topology("line"), hosts, tmp_path / "a") as tb:
        names = sorted(os.listdir(disk))
        assert names == sorted(f"{tb.token}-{n}" for n in ("client", "gwA", "gwB", "server"))
        assert all((disk / n / "ledger").stat().st_size > 0 for n in names)
        assert lab.residue(settle_s=0) != {}  # addresses and routes added on every host
    assert lab.residue() == {}

    # a killed run: its ledgers stay on the hosts; `clean --hosts` undoes each node's own
    tb = HostsTestbed(topology("line"), hosts, tmp_path / "b")
    tb.build()
    for h in tb.ssh.values():
        h.close()
    p = _lab("clean", "--hosts", str(_hosts(lab, tmp_path)))
    assert p.returncode == 0, p.stderr
    for node in ("client", "gwA", "gwB", "server"):
        assert f"undid {node}: directory {lab.workdir}/{tb.token}-{node}" in p.stdout
    assert lab.residue() == {}


def test_a_hostile_interface_name_in_the_ledger_runs_nothing(tmp_path: Path) -> None:
    """Linux allows `;` and `$` in an interface name: trafgen's pacing on an interface
    named `e;touch${IFS}pw` (a real one, in a namespace) is undone by its ledger line,
    run by a shell as a host runs it, and nothing else runs."""
    from ipsec_lab.testbed import Flow
    from ipsec_lab.traffic.paced import Trafgen

    ns, dev = f"{NS_PREFIX}{secrets.token_hex(2)}-if", "e;touch${IFS}pw"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", "p0"],
                       check=True)  # fmt: skip
        subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        undo: list[str] = []

        class Host:  # the ledger and commands of a real host, in the namespace
            rundir = tmp_path
            remote = True  # a testbed of real hosts (testbed.interface.on_hosts)

            def run(self, node: str, argv: list[str], timeout: float = 60,
                    check: bool = True) -> str:  # fmt: skip
                return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True,
                                      text=True, check=check).stdout  # fmt: skip

            def record(self, node: str, what: str, line: str) -> None:
                undo.append(line)

        tg = Trafgen.__new__(Trafgen)  # its pacing alone, on the hostile interface
        tg.tb, tg.dev, tg.mtu, tg._paced = Host(), dev, 1500, False
        tg.flow = Flow("f", "client", "server", "10.2.0.2", "gwA/eth2")
        tg._pace(1e6, 64)
        qdisc = ["ip", "netns", "exec", ns, "tc", "-j", "qdisc", "show", "dev", dev, "root"]
        assert json.loads(subprocess.run(qdisc, capture_output=True, text=True,
                                         check=True).stdout)[0]["kind"] == "htb"  # fmt: skip
        (line,) = undo
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", line], cwd=tmp_path, check=True)
        kind = json.loads(subprocess.run(qdisc, capture_output=True, text=True,
                                         check=True).stdout)[0]["kind"]  # fmt: skip
        assert kind != "htb"  # the kernel's default is back
        assert sorted(os.listdir(tmp_path)) == []  # no `pw`, no `root`
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
