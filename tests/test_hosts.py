"""Hosts files without hosts: what they say, the errors that name the file and the key,
the topology placed on the hosts' interfaces and addresses (never a default route), the
shipped examples, the per-host CPU figures, and what the lab takes from what a host says
(the work directory's check, run here by `sh` on this machine; log names a host lists)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipsec_lab import backends
from ipsec_lab.hosts import HostsError, load, parse, place
from ipsec_lab.hosts.readings import proc_stat
from ipsec_lab.meters import HostMeters
from ipsec_lab.testbed import topology

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

LINE = """
topology = "line"
[client]
ssh = "root@203.0.113.10"
inside = { interface = "eth1", address = "172.16.1.2/24" }
[gwA]
ssh = "lab@gw-a"
inside = { interface = "eth1", address = "172.16.1.1/24" }
outside = { interface = "eth2", address = "198.18.0.1/24", present = true }
[gwB]
ssh = "gw-b"
outside = { interface = "eth2", address = "198.18.0.2/24" }
inside = { interface = "ens3", address = "172.16.2.1/24" }
[server]
ssh = "server"
inside = { interface = "eth1", address = "172.16.2.2/24" }
"""


def test_a_hosts_file_places_the_line_on_its_interfaces_and_addresses() -> None:
    h = parse(LINE, "h.toml")
    assert h.hosts["gwA"].sides["outside"].present
    assert h.hosts["client"].sides["inside"].present is False
    t = place(topology("line"), h)
    ends = {(w.a, w.a_if, w.a_addr) for w in t.wires} | {(w.b, w.b_if, w.b_addr) for w in t.wires}
    assert ("gwB", "ens3", "172.16.2.1/24") in ends
    assert ("gwA", "eth2", "198.18.0.1/24") in ends
    assert ("gwB", "eth2", "198.18.0.2/24") in ends
    # the tunnel between the outer addresses, protecting the inside networks
    (tun,) = t.tunnels
    assert (tun.left_outer, tun.right_outer) == ("198.18.0.1", "198.18.0.2")
    assert (tun.left_ts, tun.right_ts) == ("172.16.1.0/24", "172.16.2.0/24")
    (flow,) = t.flows
    assert (flow.sink_addr, flow.wire_end) == ("172.16.2.2", "gwA/eth2")
    # no default route on a real host: the client and server route the networks they
    # are not on through their gateway
    assert not any(dest == "default" for _, dest, _ in t.routes)
    client = sorted(d for n, d, v in t.routes if n == "client")
    assert client == ["172.16.2.0/24", "198.18.0.0/24"]
    assert all(v == "172.16.1.1" for n, _, v in t.routes if n == "client")
    assert ("gwA", "172.16.2.0/24", "198.18.0.2") in t.routes
    # no address at all: the topology's own, on the hosts' interfaces
    bare = parse("\n".join(x.split(", address")[0] + (" }" if ", address" in x else "")
                           for x in LINE.splitlines()), "h.toml")  # fmt: skip
    t = place(topology("line"), bare)
    assert [(w.a_if, w.a_addr) for w in t.wires][1] == ("eth2", "192.0.2.1/24")
    # the two ends of a link in two networks: refused, naming the second end
    odd = parse(LINE.replace("198.18.0.2/24", "192.0.2.2/24"), "h.toml")
    with pytest.raises(HostsError, match=r"gwB\.outside\.address: 192\.0\.2\.2/24 is not in "
                       r"gwA\.outside's network 198\.18\.0\.0/24"):  # fmt: skip
        place(topology("line"), odd)


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[client]\nssh = 'x'\ninside = 'eth1'", "client.inside", "must be a table"),
        ("[client]\ninside = { interface = 'eth1', address = '10.1.0.2' }", "client.inside."
         "address", "needs its prefix length"),
        ("[client]\ninside = { interface = 'eth1', address = 'ten' }", "client.inside.address",
         "not an address"),
        ("[client]\ninside = { interface = 'a very long name' }", "client.inside.interface",
         "must be an interface name"),
        ("[client]\noutside = { interface = 'eth1' }", "client.outside", "unknown key"),
        ("[router]\nssh = 'x'", "router", "unknown key: a node"),
        ("[client]\nssh = '-oProxyCommand=x'", "client.ssh", "not an ssh destination"),
        ("[client]\ninside = { interface = 'eth1', present = true }", "client.inside.present",
         "give `address`"),
        ("workdir = 'tmp'", "workdir", "absolute path"),
        ("workdir = '/var/lib/../tmp/lab'", "workdir", "no empty, `.` or `..`"),
        ("workdir = '/var/lib/lab/'", "workdir", "no trailing /"),
        ("workdir = '/var/lib/a lab'", "workdir", "only letters"),
        ("[gwA]\nworkdir = '/'", "gwA.workdir", "not / itself"),
        ("topology = 'ring'", "topology", "must be one of"),
        ("[client\n", "toml", ""),
    ],
)  # fmt: skip
def test_hosts_file_errors_name_the_file_and_key(text: str, key: str, words: str) -> None:
    with pytest.raises(HostsError) as e:
        parse(text, "h.toml")
    assert e.value.key == key and str(e.value).startswith(f"h.toml: {key}: ")
    assert words in str(e.value)


def test_a_file_must_map_every_node_and_only_an_external_dut_goes_undriven() -> None:
    h = parse(LINE.replace('ssh = "server"\n', ""), "h.toml")
    with pytest.raises(HostsError, match=r"h.toml: server.ssh: missing: the lab drives this "
                       r"host \(only an external DUT may be\)"):  # fmt: skip
        h.for_topology(topology("line"), backend_external=True)
    undriven_gw = parse(LINE.replace('ssh = "gw-b"\n', ""), "h.toml")
    with pytest.raises(HostsError, match=r'gwB\.ssh: missing.*backends = \["external"\]'):
        undriven_gw.for_topology(topology("line"))  # says what the file is for
    # an external DUT: it needs the addresses it has, the lab cannot add them
    no_addr = parse(LINE.replace('ssh = "gw-b"\n', "").replace(', address = "198.18.0.2/24"', ""),
                    "h.toml")  # fmt: skip
    with pytest.raises(HostsError, match=r"gwB\.outside\.address: missing: the lab does not"):
        no_addr.for_topology(topology("line"), backend_external=True)
    undriven_gw.for_topology(topology("line"), backend_external=True)  # addresses given: fine
    with pytest.raises(HostsError, match="this file is for 'line'"):
        h.for_topology(topology("pair"))
    with pytest.raises(HostsError, match="hostA: missing: topology 'pair' needs"):
        parse("", "h.toml").for_topology(topology("pair"))


@pytest.mark.parametrize("name", ["line", "external", "pair", "clients"])
def test_the_shipped_hosts_files_fit_their_topology(name: str) -> None:
    h = load(EXAMPLES / "hosts" / f"{name}.toml")
    assert h.topology is not None
    h.for_topology(topology(h.topology), backend_external=name == "external")
    t = place(topology(h.topology), h)
    assert len(t.wires) == len(topology(h.topology).wires)


def test_external_runs_on_real_hosts_only_and_none_on_both() -> None:
    by = backends.BY_NAME
    assert by["external"].hosts and not by["external"].namespaces
    assert by["none"].hosts and by["none"].namespaces
    ext = backends.make("external")
    ext.use_hosts(load(EXAMPLES / "hosts" / "external.toml"))
    assert ext.version().startswith("external DUT: model the appliance's model")


def test_proc_stat_busy_and_total_seconds() -> None:
    text = (
        "cpu  100 20 30 800 50 5 15 7 0 0\n"
        "cpu0 50 10 15 400 25 2 8 3 0 0\ncpu1 50 10 15 400 25 3 7 4 0 0\nintr 1 2\n"
    )
    busy, total, ncpu = proc_stat(text)
    # busy: user + nice + system + irq + softirq; total adds idle and iowait (not steal)
    assert (busy, total, ncpu) == (1.7, 10.2, 2)


def test_the_dut_s_effort_is_its_hosts_cpu_per_kb() -> None:
    m = HostMeters(lambda: {}, ["gwA", "gwB"])
    h0 = {"client": (10.0, 100.0, 2), "gwA": (5.0, 50.0, 2), "gwB": (1.0, 60.0, 4)}
    h1 = {"client": (12.0, 104.0, 2), "gwA": (6.0, 54.0, 2), "gwB": (3.0, 64.0, 4)}
    row: dict[str, object] = {"effort_us_per_kb": 99.0}
    m.fill(row, h0, h1, kb=1000)
    per = row["hosts_cpu"]
    assert per["client"]["cpu_load"] == pytest.approx(0.5)  # type: ignore[index]
    # gwA 1 s + gwB 2 s over 1000 kB; the generator's 2 s are not the DUT's
    assert row["effort_us_per_kb"] == pytest.approx(3000)
    assert row["cpu_load"] == pytest.approx((0.25 + 0.5) / 2)
    assert row["machine_effort_us_per_kb"] == 99.0
    # a DUT host that was not metered (an external one): no figure, and why
    row = {}
    HostMeters(lambda: {}, ["gwA", "gwX"]).fill(row, h0, h1, kb=1000)
    assert row["effort_us_per_kb"] is None and "gwX not metered" in str(row["cpu_note"])


def test_reproduce_on_hosts_needs_each_file_to_name_its_topology(tmp_path: Path) -> None:
    from conftest import cli

    f = tmp_path / "h.toml"
    f.write_text((EXAMPLES / "hosts" / "line.toml").read_text().replace('topology = "line"', ""))
    p = cli("reproduce", "freeswan", "--quick", "--hosts", str(f), "--lab", str(tmp_path))
    assert p.returncode == 2
    assert f"{f}: topology: missing: with reproduce, each hosts file says which" in p.stderr


def test_the_ipsec_processes_cpu_and_memory_on_a_host_as_psutil_reads_them() -> None:
    """The shell line the lab runs on a host, run here on this process (and a PID that
    does not exist): its CPU seconds and RSS agree with psutil's."""
    import os
    import subprocess

    import psutil

    from ipsec_lab.hosts.readings import proc_cpu, proc_cpu_line

    sum(i * i for i in range(3_000_000))  # some CPU time of our own
    me = psutil.Process()
    before = me.cpu_times()
    text = subprocess.run(["sh", "-c", proc_cpu_line([os.getpid(), 2**22 + 7])],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    after = me.cpu_times()
    cpu, rss = proc_cpu(text)
    assert len(text.splitlines()) == 1  # the missing PID prints nothing
    assert before.user + before.system - 0.011 <= cpu <= after.user + after.system + 0.011
    assert cpu > 0.05
    assert abs(rss - me.memory_info().rss) < 8 << 20


def test_the_ipsec_processes_on_the_hosts_fill_the_rows_ipsec_figures() -> None:
    m = HostMeters(lambda: {}, ["gwA", "gwB"], lambda: {})
    row: dict[str, object] = {"ipsec_cpu_s": 0.0, "ipsec_effort_us_per_kb": None}
    q0 = {"gwA": (1.0, 10 << 20), "gwB": (2.0, 12 << 20)}
    q1 = {"gwA": (1.5, 11 << 20), "gwB": (2.25, 12 << 20), "client": (9.0, 1)}
    m.fill_procs(row, q0, q1, kb=1000)
    assert row["ipsec_cpu_s"] == pytest.approx(0.75)  # gwA 0.5 s + gwB 0.25 s
    assert row["ipsec_effort_us_per_kb"] == pytest.approx(750)
    assert row["ipsec_rss_start_bytes"] == 22 << 20 and row["ipsec_rss_end_bytes"] == 23 << 20
    assert set(row["hosts_ipsec"]) == {"gwA", "gwB"}  # type: ignore[arg-type]
    # no IPsec process the lab runs (xfrm, an external DUT): the row keeps what it had
    row2: dict[str, object] = {"ipsec_effort_us_per_kb": None}
    m.fill_procs(row2, {}, {}, kb=1000)
    assert row2 == {"ipsec_effort_us_per_kb": None}


def test_check_on_hosts_leaves_the_kernels_to_the_hosts(tmp_path: Path) -> None:
    """`check --hosts`: the kernel's IPsec is the hosts' to answer (this machine's lacks
    ESP), strongSwan's data plane is chosen by their kernels at start, what no kernel can
    do is still skipped with why, and no root is asked of this machine."""
    from conftest import cli

    sc = tmp_path / "s.toml"
    sc.write_text('name = "x"\ntopology = "line"\n'
                  'backends = ["xfrm", "xfrm-udp", "strongswan"]\n'
                  'configurations = ["esp:aes128gcm16", "ah:aes128gmac"]\n[[links]]\n'
                  'preset = "ethernet-100"\n[[workloads]]\nkind = "tcp"\n'
                  'seconds = 2\n')  # fmt: skip
    p = cli("check", str(sc), "--hosts", str(EXAMPLES / "hosts" / "line.toml"), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    what = {(g["backend"], g["configuration"]): (g["status"], g["reason"]) for g in doc["groups"]}
    for b in ("xfrm", "xfrm-udp", "strongswan"):
        assert what[(b, "esp:aes128gcm16")] == ("run", ""), b
    assert what[("xfrm", "ah:aes128gmac")] == (
        "skip",
        "the kernel has no AH with AES-GMAC-128 (RFC 4543 AH is not in Linux)",
    )
    assert what[("xfrm-udp", "ah:aes128gmac")][1].startswith("AH cannot be carried in UDP")
    assert "gateways' kernels" in doc["backends"]["strongswan"]["why"]
    assert doc["warnings"] == []


class _Here:
    """`hosts.ssh.Ssh` with this machine as the host: its shell lines run by `sh` here
    (`in_sh`: with the guard's form for a line `sh` reads, as the kept shell runs it)."""

    def __init__(self, in_sh: bool = False) -> None:
        from ipsec_lab.hosts.ssh import Ssh

        class Here(Ssh):
            def remote(self, argv, root=True, guard=None):  # type: ignore[no-untyped-def]
                return ["sh", "-c", self.line(argv, root, guard, in_sh)]

        self.ssh = Here("here", "gwA")
        self.ssh.uid = os.getuid()
        self.ssh.in_sh = in_sh  # type: ignore[attr-defined]


@pytest.fixture(params=[False, True], ids=["line", "in-sh"])
def here(request: pytest.FixtureRequest) -> Iterator[Any]:
    """`_Here`'s Ssh (the guard in both its forms), closed afterwards (its control
    directory removed)."""
    h = _Here(request.param).ssh
    yield h
    h.close()


@pytest.fixture
def kept() -> Iterator[Any]:
    """`hosts.ssh.Ssh` connected, with this machine as the host: its kept shell a local
    `sh` (the ssh command line's remote part is evaluated here)."""
    from ipsec_lab.hosts.ssh import Ssh

    class Kept(Ssh):
        def base(self) -> list[str]:
            return ["sh", "-c", 'shift; eval "$1"', "sh"]  # then "--", the remote part

    h = Kept("here", "gwA")
    h.uid, h.connected = os.getuid(), True
    yield h
    h.close()


def test_every_command_list_keeps_the_kept_shell_whatever_its_first_word(kept: Any) -> None:
    """A list runs in a subshell of the kept shell, but one whose first word is shell
    syntax (a reserved word, which shlex leaves unquoted) or that is empty goes through
    `sh -c`: as a subshell it would be a syntax error of the kept shell, ending it."""
    from ipsec_lab.hosts.ssh import RESERVED

    assert kept.run(["echo", "a"]).stdout == "a\n"
    shell = kept._shells[False]._p
    for word in sorted(RESERVED):
        r = kept.run([word, "x"], check=False)  # `sh -c`'s own syntax error, or no such program
        assert r.returncode in (2, 127) and r.stderr, (word, r)
    assert kept.run([], check=False).returncode == 0
    assert kept.run(["echo", "done"]).stdout == "done\n"  # only the first word matters
    assert kept._shells[False]._p is shell  # one session throughout


def test_append_writes_the_text_to_the_byte_inline_or_on_stdin(kept: Any, tmp_path: Path) -> None:
    """A ledger entry is appended as it is (quotes, `%`, backslashes, newlines), the file
    made 0600; past APPEND_INLINE bytes, or not ASCII, it goes on stdin."""
    from ipsec_lab.hosts.ssh import APPEND_INLINE

    path = tmp_path / "ledger"
    texts = [json.dumps({"what": "a 'b' %s %d \\n $(x) `y`", "undo": "c\nd"}) + "\n",
             "x" * (APPEND_INLINE + 1) + "'\n", "né\n", "\n"]  # fmt: skip
    for t in texts:
        kept.append(t, str(path))
    assert path.read_text() == "".join(texts)
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_work_directory_check_refuses_what_others_can_write_and_makes_the_rest(
    tmp_path: Path, here: Any
) -> None:
    """The check the lab runs on a host before it uses its work directory (POSIX sh and
    coreutils): a directory above that others can write (not root's with the sticky
    bit) or a symbolic link that leads through one is refused, naming it; a sound one is
    made 0700 with the run's directory and an empty ledger; `clean`'s listing gives only
    the ledgers of sound run directories of its node, and names the others."""
    from ipsec_lab.hosts.ledger import _runs
    from ipsec_lab.hosts.workdir import UnsafeError, guard, refusals

    h = here
    wd = str(tmp_path / "lab")

    def do(op: str, arg: str = "", where: str = wd) -> subprocess.CompletedProcess[str]:
        g = guard(h.uid, where, op, arg)
        return subprocess.run(["sh", "-c", g.in_sh if h.in_sh else g.line],
                              capture_output=True, text=True, check=False)  # fmt: skip

    p = do("check")
    assert p.returncode == 0 and p.stdout == f"missing\t{wd}\n" and not os.path.exists(wd)
    assert do("make", "abc123-gwA").returncode == 0
    assert oct(os.stat(f"{wd}/abc123-gwA").st_mode & 0o7777) == "0o700"
    assert oct(os.stat(wd).st_mode & 0o7777) == "0o700"
    assert os.path.getsize(f"{wd}/abc123-gwA/ledger") == 0
    assert do("make", "abc123-gwA").returncode == 1  # never a directory that exists
    # a guarded command runs only when the check passes
    line = guard(h.uid, wd, "use", "abc123-gwA")
    assert h.run(["echo", "ran"], guard=line).stdout == "ran\n"
    (tmp_path / "lab" / "abc123-gwA" / "ledger").write_text('{"what": "w", "undo": "u"}\n')
    os.mkdir(f"{wd}/def456-gwA", 0o755)
    os.chmod(f"{wd}/def456-gwA", 0o777)  # anyone could have put a ledger in there
    (tmp_path / "lab" / "def456-gwA" / "ledger").write_text('{"what": "x", "undo": "y"}\n')
    os.mkdir(f"{wd}/fed654-gwB")  # another node's
    (tmp_path / "lab" / "fed654-gwB" / "ledger").write_text("")
    p = do("list", "gwA")
    assert _runs(p.stdout) == {"abc123-gwA": '{"what": "w", "undo": "u"}\n\n'}
    (bad,) = refusals(p.stderr)
    assert (bad.kind, bad.path, bad.mode) == ("mode", f"{wd}/def456-gwA", "777")
    assert f"`chmod go-w {wd}/def456-gwA`" in bad.why()

    # the directory above writable by others, not sticky: nothing is used or made
    os.chmod(tmp_path, 0o777)
    try:
        (found,) = refusals(do("check", where=f"{wd}/new").stderr)
        assert (found.kind, found.path) == ("mode", str(tmp_path))
        assert do("make", "abc999-gwA", f"{wd}/new").returncode == 97
        assert not os.path.exists(f"{wd}/new")
        with pytest.raises(UnsafeError, match=f"gwA \\(here\\): work directory {wd}: "
                           f"{tmp_path} is writable by group or others"):  # fmt: skip
            h.run(["touch", str(tmp_path / "ran")], guard=line)
        assert not (tmp_path / "ran").exists()
    finally:
        os.chmod(tmp_path, 0o700)
    # a symbolic link on the way that leads through such a directory
    (tmp_path / "open").mkdir(mode=0o700)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "open" / "lab").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "open" / "lab")
    (found,) = refusals(do("check", where=str(tmp_path / "link")).stderr)
    assert found.path == str(tmp_path / "open")


def test_log_names_a_host_lists_never_name_a_path_outside_the_run_directory(
    tmp_path: Path,
) -> None:
    """A host whose `ls` says `/…`, `../…`, a subdirectory or anything but a plain log
    name: nothing is written outside the run directory, and each refusal is noted."""
    from ipsec_lab.hosts.ledger import fetch_logs
    from ipsec_lab.hosts.ssh import Result

    outside = tmp_path / "outside.log"
    names = [str(outside), "../up.log", "..", "sub/x.log", ".hidden.log", "-n.log",
             "a\\b.log", "iperf3-server-5201.log"]  # fmt: skip
    fetched: list[str] = []

    class Hostile:
        def run(self, line: str, **kw: object) -> Result:
            return Result(0, "\n".join(names) + "\n", "")

        def fetch(self, path: str) -> bytes:
            fetched.append(path)
            return b"#!/bin/sh\n"

    to = tmp_path / "run" / "hosts" / "gwA"
    fetch_logs(Hostile(), "/var/lib/ipsec-lab/abc123-gwA", to)  # type: ignore[arg-type]
    assert fetched == ["/var/lib/ipsec-lab/abc123-gwA/iperf3-server-5201.log"]
    assert sorted(os.listdir(to)) == ["iperf3-server-5201.log"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["hosts"]
    # each refusal is noted (teardown notes them in the run's commands.log)
    notes: list[str] = []
    fetch_logs(Hostile(), "/var/lib/ipsec-lab/abc123-gwA", to, notes.append)  # type: ignore[arg-type]
    assert len(notes) == len(names) - 1 and all("refused a log name" in n for n in notes)


@pytest.mark.parametrize(
    "target, placeholder",
    [("root@203.0.113.10", True), ("lab@192.0.2.7", True), ("198.51.100.1", True),
     ("root@[2001:db8::5]", True), ("root@203.0.113.10:2222", True), ("root@10.0.0.1", False),
     ("gw-a", False), ("lab@gw-a.example.net", False), ("root@[2001:470::1]", False)],
)  # fmt: skip
def test_a_documentation_address_is_a_placeholder_and_fails_at_once(
    target: str, placeholder: bool
) -> None:
    """The shipped examples' 203.0.113.x: `hosts check` says they are placeholders at
    once, rather than "cannot connect" after a timeout."""
    from ipsec_lab.hosts.ssh import Ssh, SshError
    from ipsec_lab.hosts.ssh import placeholder as why

    assert (why(target) is not None) is placeholder
    if placeholder:
        s = Ssh(target, "client")
        try:
            with pytest.raises(SshError, match=r"documentation address.*a placeholder"):
                s.connect()
        finally:
            s.close()


def test_hosts_check_of_the_shipped_example_says_placeholders_once() -> None:
    """Each problem once where a person reads it: in the table on a terminal, and on
    stderr too when that stands apart (a pipe)."""
    from conftest import cli

    p = cli("hosts", "check", "examples/hosts/line.toml", check=False)
    assert p.returncode == 1
    assert p.stdout.count("a placeholder") == 4 and "cannot connect" not in p.stdout
    # in a pipe stderr stands apart from the table: each problem in full, once
    assert p.stderr.count("a placeholder") == 4 and "not ready: 4 problems:" in p.stderr
    # on a terminal the table is on the same screen: the verdict names the hosts only
    from terminal import in_terminal

    rc, out = in_terminal(["hosts", "check", "examples/hosts/line.toml"], 200)
    assert rc == 1 and out.count("a placeholder") == 4, out
    assert "not ready: 4 problems (client, gwA, gwB, server; the fail rows above)" in out


def test_the_charon_check_finds_a_running_charon_by_its_name_alone(tmp_path: Path) -> None:
    """`hosts check`'s line for a running charon, run here by `sh`: it finds a process
    whose command name is exactly `charon` (a copy of `sleep` so named), and neither a
    name that only begins with it nor, once that process is gone, anything at all."""
    from ipsec_lab.hosts.readings import named_line, running

    def found() -> list[str]:
        out = subprocess.run(["sh", "-c", named_line("charon")], capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
        return running(out)

    sleep = Path(subprocess.run(["sh", "-c", "command -v sleep"], capture_output=True,
                                text=True, check=True).stdout.strip())  # fmt: skip
    named = {}
    for name in ("charon", "charon-x"):
        (tmp_path / name).write_bytes(sleep.read_bytes())
        (tmp_path / name).chmod(0o755)
        named[name] = subprocess.Popen([str(tmp_path / name), "30"])
    try:
        pids = found()
        assert str(named["charon"].pid) in pids
        assert str(named["charon-x"].pid) not in pids
    finally:
        for p in named.values():
            p.kill()
            p.wait(timeout=10)
    assert str(named["charon"].pid) not in found()
    assert running("/proc/12/comm\n/proc/self/comm\n/tmp/x\n") == ["12"]


def test_hosts_check_knows_every_tool_a_backend_or_a_shipped_scenario_needs() -> None:
    """Every tool any backend or workload asks a host for is one `hosts check` can name
    (what it is for, how to ask its version, the Debian package): a tool it did not know
    crashed `hosts check` (wireguard-go's, once) instead of checking the host."""
    from ipsec_lab import scenario
    from ipsec_lab.hosts.check import TOOLS, needed_tools, optional_tools
    from ipsec_lab.testbed import TOPOLOGIES

    root = Path(__file__).resolve().parents[1]
    workloads = tuple(w for f in sorted((root / "scenarios").glob("*.toml"))
                      for w in scenario.load(f).workloads)  # fmt: skip
    names = tuple(e.name for e in backends.REGISTRY)
    for topo in TOPOLOGIES:
        for node in topology(topo).nodes:
            need = needed_tools(node, topo, names, workloads)
            for t in need + optional_tools(node, topo, need, workloads):
                assert t in TOOLS, (topo, node, t)
    assert {"wireguard-go", "wg", "swanctl", "nft", "trafgen", "irtt"} <= set(TOOLS)
