"""Our gateway daemon `ipsec-gw` (crates/ipsec-gw) as the IPsec under test: one in each
IPsec node, with manual keys generated fresh for each run, its config written to the run
directory, its counters read from its stats socket."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipsec_lab.backends import Unsupported
from ipsec_lab.model.transforms import parse_configuration
from ipsec_lab.testbed import Tunnel
from ipsec_lab.testbed.build import LabError, Testbed, tail

# Key material bytes per algorithm (the engine's; salts of the combined modes included).
ENC_KEY = {
    "null": 0, "aes128": 16, "aes192": 24, "aes256": 32, "aes128gcm16": 20,
    "aes256gcm16": 36, "chacha20poly1305": 36, "aes128gmac": 20, "aes256gmac": 36,
    "3des": 24, "des": 8,
}  # fmt: skip
INTEG_KEY = {"null": 0, "md5": 16, "sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64}
# The lab's outer links have an MTU of 1600, room for a whole 1500-byte inner packet plus
# ESP's overhead: the gateways' TUN takes 1500-byte packets and nothing is fragmented.
TUN_MTU = 1500


def gateway_binary() -> Path | None:
    here = Path(__file__).resolve().parents[3]
    for p in (here / "target/release/ipsec-gw", here / "target/debug/ipsec-gw"):
        if p.exists():
            return p
    found = shutil.which("ipsec-gw")
    return Path(found) if found else None


def sa_fields(configuration: str) -> dict[str, Any]:
    """The [[sa]] keys a configuration needs (without spi, direction and keys)."""
    c = parse_configuration(configuration)
    if c.is_none:
        raise Unsupported("ours runs an IPsec configuration; use backend `none` for none")
    if c.ipcomp or (c.ah and c.esp):
        raise Unsupported("ipsec-gw does not take bundles or IPComp in its config yet")
    if c.esp:
        enc, integ = c.esp[0].name, c.esp[1].name
        proto = "esp"
    else:
        assert c.ah is not None
        enc, integ = "null", c.ah.name
        proto = "ah"
    return {
        "protocol": proto,
        "encryption": enc,
        "integrity": integ,
        "legacy": c.legacy,
    }


def gateway_config(
    node: str,
    tunnel: Tunnel,
    fields: dict[str, Any],
    keys: dict[str, tuple[str, str]],
    stats: Path,
    udp_encap: bool = False,
    stage_timing: bool = False,
    tun: str = "ipsec0",
    table: int = 220,
    mtu: int = TUN_MTU,
    mode: str = "tunnel",
) -> str:
    """One gateway's TOML. `keys[direction]` = (enc, integ) hex of the left->right ("lr")
    and right->left ("rl") SAs; SPIs 0x1001 (left to right) and 0x2002 (back)."""
    left = tunnel.left == node
    me, peer = (
        (tunnel.left_outer, tunnel.right_outer) if left else (tunnel.right_outer, tunnel.left_outer)
    )
    mine, theirs = (tunnel.left_ts, tunnel.right_ts) if left else (tunnel.right_ts, tunnel.left_ts)
    out_d, in_d = ("lr", "rl") if left else ("rl", "lr")
    spi = {"lr": 0x1001, "rl": 0x2002}

    def sa(name: str, direction: str, d: str) -> str:
        enc, integ = keys[d]
        return (
            f'[[sa]]\nname = "{name}"\ndirection = "{direction}"\nspi = {spi[d]}\n'
            f'protocol = "{fields["protocol"]}"\nmode = "{mode}"\n'
            f'encryption = "{fields["encryption"]}"\n'
            f'integrity = "{fields["integrity"]}"\nenc_key = "{enc}"\ninteg_key = "{integ}"\n'
            f"legacy = {str(fields['legacy']).lower()}\n"
        )

    return (
        f'[gateway]\ntun = "{tun}"\nmtu = {mtu}\ntable = {table}\n'
        f'local = "{me}"\nremote = "{peer}"\n'
        f'routes = ["{theirs}"]\nstats = "{stats}"\nudp_encap = {str(udp_encap).lower()}\n'
        f"stage_timing = {str(stage_timing).lower()}\n\n"
        + sa("out", "out", out_d)
        + "\n"
        + sa("in", "in", in_d)
        + f'\n[[policy]]\ndirection = "out"\nsrc = "{mine}"\ndst = "{theirs}"\n'
        f'action = "protect"\nsa = "out"\n'
        f'\n[[policy]]\ndirection = "in"\nsrc = "{theirs}"\ndst = "{mine}"\n'
        f'action = "protect"\nsa = "in"\n'
    )


def fresh_keys(fields: dict[str, Any]) -> dict[str, tuple[str, str]]:
    e, i = ENC_KEY[fields["encryption"]], INTEG_KEY[fields["integrity"]]
    return {d: (secrets.token_hex(e), secrets.token_hex(i)) for d in ("lr", "rl")}


def stats(socket: Path, timeout: float = 5) -> dict[str, Any]:
    """A running gateway's counters (its JSON)."""
    binary = gateway_binary()
    if binary is None:
        raise LabError("ipsec-gw is not built")
    p = subprocess.run(
        [str(binary), "stats", "--socket", str(socket), "--json"],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        raise LabError(f"ipsec-gw stats: {p.stderr.strip()}")
    data: dict[str, Any] = json.loads(p.stdout)
    return data


class Ours:
    name = "ours"

    def __init__(
        self,
        udp_encap: bool = False,
        stage_timing: bool = False,
        edit: Callable[[str, str], str] | None = None,
        mode: str = "transport",
    ) -> None:
        """`edit(key, toml)` may change each generated config before it is used (tests
        use it for mismatched keys, lifetimes, extra policies). `mode`: of host-to-host
        tunnels (gateways always use tunnel mode)."""
        self.mode = mode
        self.udp_encap = udp_encap
        self.stage_timing = stage_timing
        self.edit = edit
        self.configs: dict[str, Path] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.sockets: dict[str, Path] = {}

    def check(self, configuration: str) -> None:
        if gateway_binary() is None:
            raise Unsupported("ipsec-gw is not built (`make native` builds it)")
        sa_fields(configuration)

    def start(self, tb: Testbed, configuration: str) -> None:
        """One ipsec-gw per tunnel end: a node in several tunnels (the clients topology's
        server) runs one per tunnel, each with its own TUN device, routing table and outer
        address. Processes, configs and sockets are keyed by node, or `node-tN` then."""
        self.check(configuration)
        fields = sa_fields(configuration)
        binary = gateway_binary()
        assert binary is not None
        d = tb.rundir / "ipsec-gw"
        d.mkdir(parents=True, exist_ok=True)
        ends = [(n, t) for t in tb.topo.tunnels for n in (t.left, t.right)]
        for i, t in enumerate(tb.topo.tunnels):
            keys = fresh_keys(fields)
            host_to_host = t.left_ts.endswith("/32")
            for node in (t.left, t.right):
                mine = [x for n, x in ends if n == node]
                k = mine.index(t)
                key = node if len(mine) == 1 else f"{node}-t{i}"
                sock = tb.sockets / f"gw-{key}.sock"
                conf = d / f"{key}.toml"
                text = gateway_config(
                    node, t, fields, keys, sock, self.udp_encap, self.stage_timing,
                    tun=f"ipsec{k}", table=220 + k,
                    # host-to-host: the link is both sides, 1500 bytes; leave room for ESP
                    mtu=1400 if host_to_host else TUN_MTU,
                    mode=self.mode if host_to_host else "tunnel",
                )  # fmt: skip
                conf.write_text(self.edit(key, text) if self.edit else text)
                conf.chmod(0o600)  # it holds keys
                self.configs[key] = conf
                self.sockets[key] = sock
                self._procs[key] = tb.spawn(
                    node,
                    [str(binary), "--config", str(conf)],
                    f"ipsec-gw-{key}",
                    limited=node in tb.topo.limited_nodes,
                )
        deadline = time.monotonic() + 10
        for key, sock in self.sockets.items():
            while not sock.exists():
                p = self._procs[key]
                if p.poll() is not None or time.monotonic() > deadline:
                    raise LabError(
                        f"ipsec-gw {key} did not start:\n{tail(tb.rundir / f'ipsec-gw-{key}.log')}"
                    )
                time.sleep(0.05)

    def stop(self, tb: Testbed) -> None:
        for p in self._procs.values():
            tb.stop(p)
        self._procs.clear()
        self.sockets.clear()

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.poll() is None]

    def process(self, node: str) -> subprocess.Popen[bytes]:
        return self._procs[node]

    def version(self) -> str:
        binary = gateway_binary()
        if binary is None:
            return "ipsec-gw (not built)"
        p = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=5)
        return p.stdout.strip() or "ipsec-gw"
