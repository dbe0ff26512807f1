"""The kernel's IPsec on real hosts, run INSIDE the micro-VM by tests/test_vm_root.py (the
host's kernel has no ESP): four hosts, each a namespace running `sshd` (tests/sshlab.py),
reached by the lab only through ssh. A campaign of `xfrm`, `xfrm-udp` and
`strongswan-kernel` x 1 s of UDP (trafgen from the client over ssh, counted on the
server): every run done, ESP's bytes on the wire to the byte, per-host CPU.
(Under TCG a run over ssh costs about 40 s: `none`, TCP, a second configuration and ours
run on this machine's kernel in tests/test_hosts_root.py.) A host's own xfrm state and policy
survive it, one that collides with the lab's SA is never replaced, and nothing the lab
added is left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parents[1])]
from sshlab import SshLab  # noqa: E402

LAB = [sys.executable, "-m", "ipsec_lab.cli"]
SCENARIO = """
name = "kernel IPsec on real hosts"
topology = "line"
backends = {backends}
configurations = ["esp:aes128gcm16"]
repetitions = 1
warmup_s = 0.2
[[links]]
preset = "ethernet-100"
[[workloads]]
kind = "udp"
size = 512
rate_mbit = 20
seconds = 1
"""
# A host's own IPsec, not the lab's: an SA and a policy between other addresses.
OWN_STATE = ("xfrm state add src 198.51.100.1 dst 198.51.100.2 proto esp spi 0x777 mode tunnel "
             "aead rfc4106(gcm(aes)) 0x" + "ab" * 20 + " 128")  # fmt: skip
OWN_POLICY = ("xfrm policy add dir out src 10.77.0.0/24 dst 10.78.0.0/24 tmpl src 198.51.100.1 "
              "dst 198.51.100.2 proto esp mode tunnel")  # fmt: skip


def _lab(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAB, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


def _ip(ns: str, line: str) -> None:
    subprocess.run(["ip", "-n", ns, *line.split()], check=True, capture_output=True)


def test_the_kernels_ipsec_on_real_hosts(tmp_path: Path) -> None:
    # The four "hosts" share the VM's kernel, whose UDP socket-buffer cap is global and
    # not visible in a namespace: the VM raised it at boot (vm.inside), as the lab does
    # on each real host.
    assert Path("/proc/sys/net/core/rmem_max").read_text().strip() == "4194304"
    with SshLab(workdir="/tmp/ipsec-lab-hosts") as lab:
        gwa = lab.hosts["gwA"]
        _ip(gwa.ns, OWN_STATE)
        _ip(gwa.ns, OWN_POLICY)
        gwa.baseline = lab.state(gwa)  # the host's own: it must be there, as it was, after
        hosts = lab.hosts_toml(tmp_path / "hosts.toml")
        sc = tmp_path / "scenario.toml"
        sc.write_text(SCENARIO.format(
            backends='["xfrm", "xfrm-udp", "strongswan-kernel"]'))  # fmt: skip
        p = _lab("hosts", "check", str(hosts), "--scenario", str(sc), "--json")
        assert p.returncode == 0, p.stdout
        checks = {(r["host"], r["check"]): r for r in json.loads(p.stdout)["checks"]}
        assert checks[("gwA", "module esp4")]["status"] == "ok"
        assert checks[("gwB", "tool python3")]["status"] == "ok"  # xfrm-udp's socket
        assert checks[("gwB", "tool /usr/lib/ipsec/charon")]["status"] == "ok"

        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"),
                 "--json")  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        runs = json.loads(p.stdout)["runs"]
        assert len(runs) == 3
        assert all(r["status"] == "done" for r in runs), [r["reason"] for r in runs]
        rows = {(r["backend"], r["configuration"]): r["results"][0] for r in runs}
        for key, row in rows.items():
            assert 0 < row["mbps"] <= 20 * 1.05, (key, row["mbps"])  # 20 Mbit/s offered
            assert row["generator"] == "udp-gso", key
            assert set(row["hosts_cpu"]) == {"client", "gwA", "gwB", "server"}, key
        versions = {r["backend"]: r["backend_version"] for r in runs}
        assert versions["xfrm"].startswith("Linux ") and "on the hosts" in versions["xfrm"]
        assert "kernel xfrm, on the hosts" in versions["strongswan-kernel"]
        # charon's own process, metered on the gateways (its ESP is the kernel's)
        assert set(rows[("strongswan-kernel", "esp:aes128gcm16")]["hosts_ipsec"]) == {"gwA", "gwB"}

        # Each 512-byte inner packet on the gateways' link, as its interface counts it
        # (RFC 4303 §2, RFC 4106 §3: tunnel mode, AES-GCM with an 8-byte IV and 16-byte
        # ICV): Ethernet 14 + outer IPv4 20 + ESP 8 + IV 8 + (512 + pad length and next
        # header 2, padded to 4: 516) + ICV 16 = 582; ESP in UDP (RFC 3948) 8 more.
        # (Within a byte on average: a stray ARP on the link moves the mean a little.)
        for b, frame in (("xfrm", 582), ("xfrm-udp", 590), ("strongswan-kernel", 582)):
            row = rows[(b, "esp:aes128gcm16")]
            per_packet = row["wire_up_bytes"] / row["wire_up_packets"]
            assert abs(per_packet - frame) < 1, (b, per_packet)
        led = next((tmp_path / "lab").glob("campaign-*/*/hosts/gwA.ledger")).read_text()
        whats = [json.loads(x) for x in led.splitlines()]
        xf = [w for w in whats if w["what"].startswith("xfrm states and policies")]
        assert xf and all("flush" not in w["undo"] and "delete" in w["undo"] for w in xf)
        assert lab.residue() == {}  # the lab's SAs gone; the host's own still there

        # the host already holds an SA the lab would add: never replaced, the run fails
        # naming it, and the host keeps its own
        clash = "src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1001"
        _ip(gwa.ns, f"xfrm state add {clash} mode tunnel aead rfc4106(gcm(aes)) 0x"
            + "cd" * 20 + " 128")  # fmt: skip
        gwa.baseline = lab.state(gwa)
        sc.write_text(SCENARIO.format(backends='["xfrm"]'))
        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab2"),
                 "--json")  # fmt: skip
        assert p.returncode == 1, p.stderr[-2000:]
        (run,) = json.loads(p.stdout)["runs"]
        assert run["status"] == "failed"
        assert f"gwA already has xfrm state {clash}" in run["reason"], run["reason"]
        assert lab.residue() == {}
