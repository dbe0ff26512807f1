"""What the lab writes for strongSwan's charon and reads back from it: strongswan.conf,
swanctl.conf for one tunnel per topology tunnel or N between one pair of gateways (the
scenario's `tunnels`, as `[gateway] ike_sas` says), and the count of CHILD_SAs its log
reports while N come up (backends/strongswan.py starts and times them)."""

from __future__ import annotations

import re
from pathlib import Path

from ipsec_lab.testbed import Tunnel
from ipsec_lab.testbed.tunnels import selectors

PLUGINS = (
    "random nonce kdf openssl pem pkcs1 x509 pubkey "
    "kernel-libipsec kernel-netlink socket-default vici"
)
KERNEL_PLUGINS = "random nonce kdf openssl pem pkcs1 x509 pubkey kernel-netlink socket-default vici"
# charon's own IKE and ESP-in-UDP packets carry this mark and skip the routes
# kernel-libipsec installs into its TUN device (needed for host-to-host tunnels, where the
# peer's address is itself inside the remote traffic selector).
FWMARK = "0x4c4142"


def charon_conf(vici: Path | str, log: Path | str, kernel: bool = False) -> str:
    libipsec = (
        ""
        if kernel
        else """    kernel-libipsec {
      load = yes
      allow_peer_ts = yes
    }
"""
    )
    return f"""charon {{
  load = {KERNEL_PLUGINS if kernel else PLUGINS}
  install_routes = {"no" if kernel else "yes"}
  retransmit_tries = 3
  plugins {{
    vici {{
      socket = unix://{vici}
    }}
{libipsec}    kernel-netlink {{
      fwmark = !{FWMARK}
    }}
    socket-default {{
      fwmark = {FWMARK}
    }}
  }}
  filelog {{
    lab {{
      path = {log}
      time_format = %s
      flush_line = yes
      default = 1
    }}
  }}
  syslog {{
    daemon {{
      default = -1
    }}
  }}
}}
swanctl {{
  load = pem pkcs1 x509 pubkey openssl random
}}
"""


# How the IKE daemons set up N tunnels between one pair of gateways (the scenario's
# `[gateway] ike_sas`): N CHILD_SAs under one IKE_SA (a site with many subnets), or an
# IKE_SA each (N sites behind one address: the set-up rate's hard case, N DH exchanges
# and N half-open IKE_SAs at once).
IKE_SAS = ("one", "per-tunnel")


def connections(node: str, tunnels: list[Tunnel], many: int, ike_sas: str
                 ) -> list[tuple[str, str, str, str, list[tuple[str, str]]]]:  # fmt: skip
    """This node's connections: (my address, the peer's, my IKE identity, the peer's,
    its children's (local TS, remote TS)), one per topology tunnel; with `many` > 1 (the
    line's one tunnel, testbed/tunnels.py) the N tunnels as N children of one connection,
    or N connections of one child each, told apart by identities of their own (the
    responder picks a connection by the identities, then a child within it)."""
    out = []
    for t in tunnels:
        end = t.seen_from(node)
        me, peer = end.outer, end.peer_outer
        pairs = selectors(t, many) if many > 1 else [(t.left_ts, t.right_ts)]
        ts = [(lts, rts) if end.left else (rts, lts) for lts, rts in pairs]
        if many == 1 or ike_sas == "one":
            out.append((me, peer, me, peer, ts))
            continue
        out += [(me, peer, f"@t{j}.{end.node}.lab", f"@t{j}.{end.peer}.lab", [pair])
                for j, pair in enumerate(ts)]  # fmt: skip
    return out


def swanctl_conf(
    node: str,
    tunnels: list[Tunnel],
    esp: str | None,
    psk: str,
    ah: str | None = None,
    ipcomp: bool = False,
    kernel: bool = False,
    many: int = 1,
    ike_sas: str = "one",
    initiates: bool = False,
) -> str:
    """swanctl.conf for `node`: connection t<i>, children c<j> numbered across the
    file. `initiates`: its children start when loaded (`start_action = start`: how N
    tunnels come up at once; one tunnel is initiated by swanctl)."""
    child = (
        (f"        esp_proposals = {esp}\n" if esp else "")
        + (f"        ah_proposals = {ah}\n" if ah else "")
        + ("        ipcomp = yes\n" if ipcomp else "")
        + ("        start_action = start\n" if initiates else "")
    )
    encap = "no" if kernel else "yes"
    conns = []
    secrets_ = []
    j = 0
    for i, (me, peer, my_id, peer_id, ts) in enumerate(connections(node, tunnels, many, ike_sas)):
        children = []
        for lts, rts in ts:
            children.append(f"""      c{j} {{
        local_ts = {lts}
        remote_ts = {rts}
{child}        mode = tunnel
        rekey_time = 0
        life_time = 0
      }}""")
            j += 1
        kids = "\n".join(children)
        conns.append(
            f"""  t{i} {{
    version = 2
    local_addrs = {me}
    remote_addrs = {peer}
    proposals = aes128-sha256-modp2048
    encap = {encap}
    local {{
      auth = psk
      id = {my_id}
    }}
    remote {{
      auth = psk
      id = {peer_id}
    }}
    children {{
{kids}
    }}
  }}"""
        )
        secrets_.append(
            f"""  ike-{i} {{
    id-1 = {my_id}
    id-2 = {peer_id}
    secret = 0x{psk}
  }}"""
        )
    return "connections {\n" + "\n".join(conns) + "\n}\nsecrets {\n" + "\n".join(secrets_) + "\n}\n"


# Setting up N tunnels at once: given up after SETUP_S + SETUP_S_PER_TUNNEL x N, the logs
# read every SETUP_POLL_S. Under the micro-VM's emulation (TCG) one CHILD_SA under one
# IKE_SA took 0.11 s (1,024 in 112.9 s), an IKE_SA each (a DH exchange each, both ends at
# once) more: 256 of them did not load within 73 s.
SETUP_S = 30.0
SETUP_S_PER_TUNNEL = 1.0
SETUP_POLL_S = 0.05


class LogCount:
    """What a charon's log has said so far about setting up CHILD_SAs, read on from where
    the last read ended (the log is this run's: start() removes an old one)."""

    # charon's own words (libcharon/sa/ikev2/tasks/child_create.c and task_manager_v2.c)
    ESTABLISHED = re.compile(rb"CHILD_SA \S+\{\d+\} established with SPIs")
    RETRANSMIT = re.compile(rb"retransmit \d+ of request with message ID")
    FAILED = re.compile(rb"giving up after \d+ retransmits|failed to establish CHILD_SA")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.established = self.retransmits = self.failed = 0

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()  # a line not yet ended: counted when it is
        for line in lines:
            if self.ESTABLISHED.search(line):
                self.established += 1
            elif self.RETRANSMIT.search(line):
                self.retransmits += 1
            elif self.FAILED.search(line):
                self.failed += 1
