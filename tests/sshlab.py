"""Real hosts for the hosts-testbed tests, on one machine: a network namespace per host,
each running OpenSSH's own `sshd` (key-only, root login by key) on a management link from
this namespace, with veth test links between the hosts that carry no address until the
lab adds one. The lab reaches them only through `ssh`, by the aliases of an ssh_config,
as it would real machines.

Each sshd runs in its own mount namespace where the lab's work directory is that host's
own private directory (kept across an sshd restart, as a real host's disk): a file the
lab did not push through ssh to that host is not there. With `shared=True` the four
hosts' work directories are one directory (as nodes sharing one machine, or a shared
mounted directory, would have it).

`SshLab` is a context manager; it removes every namespace, process and file it made.
`residue()` lists what a host holds beyond what the SshLab gave it (addresses, routes,
policy rules, routes in tables of their own, links, qdiscs, nftables tables, processes,
files in the work directory): empty after every lab run.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

WORKDIR = "/var/tmp/ipsec-lab-test"
NS_PREFIX = "iplh-"  # not the lab's `ipl-`: `ipsec-lab clean` must not take these for its own

# The `line` topology: (host, interface) pairs of each test link.
LINE_LINKS = (
    (("client", "eth1"), ("gwA", "eth1")),
    (("gwA", "eth2"), ("gwB", "eth2")),
    (("gwB", "eth1"), ("server", "eth1")),
)
LINE_SIDES = {
    "client": {"inside": "eth1"},
    "gwA": {"inside": "eth1", "outside": "eth2"},
    "gwB": {"inside": "eth1", "outside": "eth2"},
    "server": {"inside": "eth1"},
}


def _run(*argv: str, check: bool = True) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p.stdout


def _free_mgmt_net(n: int) -> int:
    """The first third octet X in 172.31.200-251 with 172.31.X..X+n-1 on no link here.
    A rig a killed test run left behind keeps its addresses: a second one on the same
    /30 sent this rig's ssh to the dead one's namespace (every host test then failed
    with "sshd did not come up")."""
    used = {int(m) for m in re.findall(r"inet 172\.31\.(\d+)\.", _run("ip", "-4", "-o", "addr"))}
    for x in range(200, 252 - n + 1):
        if not used & set(range(x, x + n)):
            return x
    raise RuntimeError(
        "no free 172.31.200-251 management addresses: `ip -4 addr` shows them all taken"
    )


@dataclass
class SshHost:
    name: str
    ns: str
    mgmt_addr: str  # where sshd listens
    sshd: subprocess.Popen[bytes] | None = None
    baseline: dict[str, object] = field(default_factory=dict)


class SshLab:
    """Four hosts (client, gwA, gwB, server) reachable by ssh aliases of `ssh_config`."""

    def __init__(self, names: tuple[str, ...] = ("client", "gwA", "gwB", "server"),
                 links: tuple = LINE_LINKS, workdir: str = WORKDIR,
                 shared: bool = False) -> None:  # fmt: skip
        """`workdir`: the hosts' work directory (the VM's /var is read-only: /tmp there);
        `shared`: one directory for all hosts."""
        self.workdir = workdir
        self.shared = shared
        self.token = secrets.token_hex(2)
        self.dir = Path(tempfile.mkdtemp(prefix="iplh-"))
        self.dir.chmod(0o711)  # sshd reads authorized_keys as the user logging in
        self.net = _free_mgmt_net(len(names))
        self.hosts = {
            n: SshHost(n, f"{NS_PREFIX}{self.token}-{n}", f"172.31.{self.net + i}.2")
            for i, n in enumerate(names)
        }
        self.links = links
        self.ssh_config = self.dir / "ssh_config"

    # --- building ---------------------------------------------------------------------

    def __enter__(self) -> SshLab:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self) -> None:
        d = self.dir
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "user_key"))
        (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
        hostkey = (d / "host_key.pub").read_text().split()
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        Path(self.workdir).mkdir(mode=0o700, exist_ok=True)  # each host's mount point
        known, config = [], []
        for i, h in enumerate(self.hosts.values()):
            _run("ip", "netns", "add", h.ns)
            _run("ip", "-n", h.ns, "link", "set", "lo", "up")
            outer = f"ipl{self.token}m{i}"
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", "mgmt0",
                 "netns", h.ns)  # fmt: skip
            _run("ip", "addr", "add", f"172.31.{self.net + i}.1/30", "dev", outer)
            _run("ip", "link", "set", outer, "up")
            _run("ip", "-n", h.ns, "addr", "add", f"{h.mgmt_addr}/30", "dev", "mgmt0")
            _run("ip", "-n", h.ns, "link", "set", "mgmt0", "up")
            cfg = d / f"sshd_{h.name}"
            cfg.write_text(
                f"ListenAddress {h.mgmt_addr}\nHostKey {d / 'host_key'}\n"
                f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                f"StrictModes no\nPidFile none\nMaxSessions 100\nMaxStartups 100\n"
                "AcceptEnv LANG\n"
            )  # fmt: skip
            known.append(f"{h.mgmt_addr} {hostkey[0]} {hostkey[1]}")
            config.append(
                f"Host {h.name}\n  HostName {h.mgmt_addr}\n  User root\n"
                f"  IdentityFile {d / 'user_key'}\n  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
            )  # fmt: skip
        for (a, ai), (b, bi) in self.links:
            ha, hb = self.hosts[a], self.hosts[b]
            _run("ip", "link", "add", "tmpx", "netns", ha.ns, "type", "veth", "peer", "name",
                 "tmpy", "netns", hb.ns)  # fmt: skip
            # real links: 1500 bytes (the namespaces' testbed has the same)
            _run("ip", "-n", ha.ns, "link", "set", "tmpx", "name", ai, "mtu", "1500", "up")
            _run("ip", "-n", hb.ns, "link", "set", "tmpy", "name", bi, "mtu", "1500", "up")
        (d / "known_hosts").write_text("\n".join(known) + "\n")
        self.ssh_config.write_text("\n".join(config))
        for h in self.hosts.values():
            self.start_sshd(h)
        for h in self.hosts.values():
            h.baseline = self.state(h)

    def disk(self, name: str) -> Path:
        """The directory that is host `name`'s work directory."""
        return self.dir / ("disk" if self.shared else f"disk_{name}")

    def start_sshd(self, h: SshHost) -> None:
        disk = self.disk(h.name)
        disk.mkdir(mode=0o700, exist_ok=True)
        inner = f"mount --bind {disk} {self.workdir} && "
        for path, mine in self._accounts().items():  # in this sshd's mount namespace only
            inner += f"mount --bind {mine} {path} && "
        inner += f"exec /usr/sbin/sshd -D -e -f {self.dir / f'sshd_{h.name}'}"
        log = open(self.dir / f"sshd_{h.name}.log", "ab")
        h.sshd = subprocess.Popen(
            ["ip", "netns", "exec", h.ns, "unshare", "-m", "--propagation", "private",
             "sh", "-c", inner], stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 10
        while self.ssh(h.name, "true", check=False).returncode != 0:
            if h.sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"sshd of {h.name} did not come up: "
                    + (self.dir / f"sshd_{h.name}.log").read_text()[-500:]
                )
            time.sleep(0.1)

    def _accounts(self) -> dict[str, Path]:
        """The files each host's sshd sees in place of this machine's (path -> copy):
        - /etc/shadow with root unlocked where it is locked (a `!` password, as in the
          micro-VM): sshd refuses a locked account even with a key;
        - /etc/passwd with root's home an empty directory (a clean host's shell);
        - two more users, `lab` with passwordless sudo (/etc/sudoers.d/ipsec-lab-test)
          and `nosudo` without, key login only, as a real host's users would be.
        Made once; this machine's own files are never changed."""
        d = self.dir / "etc"
        out = {"/etc/passwd": d / "passwd", "/etc/group": d / "group", "/etc/shadow": d / "shadow"}
        if Path("/etc/sudoers.d").is_dir():
            out["/etc/sudoers.d"] = d / "sudoers.d"
        if d.exists():
            return out
        d.mkdir(mode=0o755)
        home = self.dir / "home"
        home.mkdir(mode=0o755)
        shadow = [("root:*:" + x.split(":", 2)[2]) if x.startswith("root:!") else x
                  for x in Path("/etc/shadow").read_text().splitlines(keepends=True)]  # fmt: skip
        users = [("lab", 4242), ("nosudo", 4243)]
        # root's home too: a clean host's, not this machine's (whose shell start-up files
        # may put another python3 first on the PATH of every ssh command)
        passwd = "".join(
            f"root:x:0:0:root:{home}:/bin/bash\n" if x.startswith("root:") else x
            for x in Path("/etc/passwd").read_text().splitlines(keepends=True)
        )
        group = Path("/etc/group").read_text()
        for name, uid in users:
            passwd += f"{name}:x:{uid}:{uid}:ipsec-lab test:{home}:/bin/sh\n"
            group += f"{name}:x:{uid}:\n"
            shadow.append(f"{name}:*:19000:0:99999:7:::\n")
        (d / "passwd").write_text(passwd)
        (d / "group").write_text(group)
        (d / "shadow").write_text("".join(shadow))
        (d / "shadow").chmod(0o640)
        if "/etc/sudoers.d" in out:
            (d / "sudoers.d").mkdir(mode=0o755)
            f = d / "sudoers.d" / "ipsec-lab-test"
            f.write_text("lab ALL=(ALL:ALL) NOPASSWD: ALL\n")
            f.chmod(0o440)
        return out

    def sshd_pid(self, name: str) -> int:
        """sshd's PID (ip netns exec, unshare and sh each exec the next)."""
        p = self.hosts[name].sshd
        assert p is not None
        return p.pid

    def kill_sshd(self, name: str) -> None:
        """The host drops off the network as far as the lab can tell: its sshd and every
        session it serves are killed (by PID)."""
        h = self.hosts[name]
        assert h.sshd is not None
        for pid in self.pids(h):
            if self._is_sshd(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        h.sshd.wait(10)

    def _is_sshd(self, pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip() in ("sshd", "sshd-session")
        except OSError:
            return False

    # --- looking ----------------------------------------------------------------------

    def ssh(self, name: str, line: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes",
                            "-o", "ConnectTimeout=5", name, line],
                           capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        if check and p.returncode != 0:
            raise RuntimeError(f"ssh {name} {line}: {p.stderr.strip()}")
        return p

    def pids(self, h: SshHost) -> list[int]:
        out = _run("ip", "netns", "pids", h.ns, check=False)
        return [int(x) for x in out.split()]

    def state(self, h: SshHost) -> dict[str, object]:
        """What a host holds that the lab could have changed."""
        ip = lambda *a: _run("ip", "-n", h.ns, *a, check=False)  # noqa: E731
        addrs = sorted(
            f"{a['local']}/{a['prefixlen']} {i['ifname']}"
            for i in json.loads(ip("-j", "addr", "show") or "[]")
            for a in i.get("addr_info", [])
            if a.get("scope") == "global"
        )
        routes = sorted(
            json.dumps(r, sort_keys=True) for r in json.loads(ip("-j", "route") or "[]")
        )
        qdiscs = sorted(
            f"{q['dev']} {q['kind']}" for q in json.loads(_run(
                "ip", "netns", "exec", h.ns, "tc", "-j", "qdisc", "show", check=False) or "[]")
        )  # fmt: skip
        xfrm = _run("ip", "-n", h.ns, "xfrm", "state", check=False) + _run(
            "ip", "-n", h.ns, "xfrm", "policy", check=False
        )
        sysctl = _run("ip", "netns", "exec", h.ns, "sysctl", "-n", "net.ipv4.ip_forward",
                      "net.ipv4.ip_no_pmtu_disc", "net.core.rmem_max", "net.core.wmem_max",
                      check=False)  # fmt: skip
        # nftables tables (trafgen's sink counter, ipsec-gw's guard)
        nft = sorted(_run("ip", "netns", "exec", h.ns, "nft", "list", "tables",
                          check=False).split("\n"))  # fmt: skip
        # policy rules, routes in tables of their own (WireGuard's, ours' guard) and links
        rules = sorted(_run("ip", "-n", h.ns, *fam, "rule", "show", check=False).strip()
                       for fam in ([], ["-6"]))  # fmt: skip

        def own_tables(fam: list[str]) -> list[str]:
            text = _run("ip", "-n", h.ns, *fam, "-j", "route", "show", "table", "all",
                        check=False)  # fmt: skip
            return [json.dumps(r, sort_keys=True) for r in json.loads(text or "[]")
                    if r.get("table") not in (None, "main", "local")]  # fmt: skip

        tables = sorted(own_tables([]) + own_tables(["-6"]))
        # the local table (an address's own routes, and AnyIP ranges such as the many
        # tunnels' testbed/tunnels.FAR on the server)
        local = sorted(json.dumps(r, sort_keys=True) for r in json.loads(
            ip("-j", "route", "show", "table", "local") or "[]"))  # fmt: skip
        links = sorted(i["ifname"] for i in json.loads(ip("-j", "link", "show") or "[]"))
        disk = self.disk(h.name)  # the host's WORKDIR
        files = sorted(os.listdir(disk)) if disk.is_dir() else []
        procs = sorted(
            Path(f"/proc/{p}/comm").read_text().strip()
            for p in self.pids(h)
            if Path(f"/proc/{p}/comm").exists() and not self._is_sshd(p)
        )
        return {"addresses": addrs, "routes": routes, "local": local, "rules": rules,
                "tables": tables,
                "links": links, "qdiscs": qdiscs, "xfrm": xfrm.strip(),
                "nft": [t for t in nft if t], "sysctl": sysctl.split(), "files": files,
                "processes": procs}  # fmt: skip

    def residue(self, settle_s: float = 5.0) -> dict[str, dict[str, object]]:
        """Per host, what differs from how the SshLab left it (empty: nothing left)."""
        deadline = time.monotonic() + settle_s
        while True:
            out: dict[str, dict[str, object]] = {}
            for h in self.hosts.values():
                now = self.state(h)
                diff = {k: v for k, v in now.items() if v != h.baseline.get(k)}
                if diff:
                    out[h.name] = diff
            if not out or time.monotonic() > deadline:
                return out
            time.sleep(0.2)

    def hosts_toml(self, path: Path, drive: tuple[str, ...] | None = None,
                   extra: str = "") -> Path:  # fmt: skip
        """A hosts file for the `line` topology; hosts not in `drive` get no `ssh` (an
        external DUT) and the addresses they have (the topology's own)."""
        from ipsec_lab.testbed import topology

        own = {(n, s): a for w in topology("line").wires
               for n, s, a in ((w.a, w.a_side, w.a_addr), (w.b, w.b_side, w.b_addr))}  # fmt: skip
        lines = [f'ssh_config = "{self.ssh_config}"', f'workdir = "{self.workdir}"', extra]
        for name, sides in LINE_SIDES.items():
            lines.append(f"[{name}]")
            driven = drive is None or name in drive
            if driven:
                lines.append(f'ssh = "{name}"')
            for side, ifname in sides.items():
                addr = "" if driven else f', address = "{own[(name, side)]}"'
                lines.append(f'{side} = {{ interface = "{ifname}"{addr} }}')
        path.write_text("\n".join(lines) + "\n")
        return path

    # --- removing ---------------------------------------------------------------------

    def close(self) -> None:
        for h in self.hosts.values():
            for pid in self.pids(h):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if h.sshd is not None:
                try:
                    h.sshd.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            _run("ip", "netns", "del", h.ns, check=False)
        for i in range(len(self.hosts)):
            _run("ip", "link", "del", f"ipl{self.token}m{i}", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            Path(self.workdir).rmdir()
        except OSError:
            pass
