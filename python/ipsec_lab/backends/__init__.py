"""The IPsec under test: how each implementation is started in a testbed's IPsec nodes.

`REGISTRY` lists every backend once (name, module, what it is); the scenario's
validation, the CLI's choices and help and the docs derive from it. Each lives in its
own module here; the SA planning those that key their own SAs share is `sa_plan`.

A backend that cannot run a configuration raises `Unsupported` with the reason; the run
is then recorded as skipped with that reason, not silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ipsec_lab.backends import (
    external,
    none,
    ours,
    strongswan,
    userspace_wireguard,
    wireguard,
    xfrm,
)
from ipsec_lab.backends.base import (
    Backend,
    Processless,
    Unsupported,
    exited,
    private_dir,
    private_file,
)

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts

__all__ = ["Backend", "Processless", "Unsupported", "exited", "private_dir", "private_file"]


@dataclass(frozen=True)
class Entry:
    """One backend of the registry: its name, its class and how it is built, and what the
    lab must know of it before it starts (what it needs, how long it takes to come up,
    where it can run)."""

    name: str
    cls: type[Backend]  # its class, in its module here
    what: str  # one line for --help and the docs
    kwargs: tuple[tuple[str, Any], ...] = ()
    stage_timing: bool = False  # takes ours' per-stage counters
    # Where it runs: on the namespace testbed, on real hosts (`--hosts`), or both.
    namespaces: bool = True
    hosts: bool = False
    # programs it needs on each IPsec node, besides the gateway's (`hosts check`)
    tools: tuple[str, ...] = ()
    # the unprivileged user its processes run as, which a host must have
    user: str | None = None
    # seconds it takes to come up and go down once (`check`'s estimate)
    start_s: float = 1.0
    # its ESP is the kernel's xfrm: the hosts need the ESP/AH/IPComp modules
    kernel_esp: bool = False
    # other kernel modules each IPsec host must have for it (`hosts check`): name, what
    modules: tuple[tuple[str, str], ...] = ()
    # its tunnel is the kernel's (no process of its own to meter), ESP or not
    kernel_tunnel: bool = False
    # whether it can run a configuration depends on this kernel (ESP, AH, IPComp in
    # xfrm): `check` without root, which cannot probe, says "unknown"
    probes_kernel: bool = False
    # a backend that is one of several variants here: which it runs as (on `hosts`, or
    # this machine) and why (`strongswan` -> `strongswan-kernel` or `-libipsec`)
    resolve: Callable[[Hosts | None], tuple[str, str]] | None = None
    # said whenever another backend resolves to this one: why it is not what was asked
    slower: str = ""
    # sets up many tunnels between the line testbed's gateways (the scenario's `tunnels`,
    # testbed/tunnels.py): its class takes `tunnels=N`; `none` routes them in clear
    tunnels: bool = False
    # why it sets up one tunnel only on real hosts, though many on namespaces ("": it
    # sets up many there too)
    no_tunnels_on_hosts: str = ""
    # the most tunnels the lab sets up with it (0: testbed/tunnels.py's MOST_TUNNELS), and
    # why no more
    most_tunnels: int = 0
    most_tunnels_why: str = ""
    # an IKE daemon that sets N tunnels up as the scenario's `[gateway] ike_sas` says
    # (N CHILD_SAs under one IKE_SA, or an IKE_SA each): its class takes `ike_sas`
    ike: bool = False
    # seconds its start takes per tunnel past the first (`check`'s estimate): ours 1.7 s
    # at 4,096 (stop 60's scenarios/tunnels.toml); strongSwan 0.11 s, its N CHILD_SAs one
    # after another under one IKE_SA in the micro-VM (TCG; 112.9 s for 1,024); wireguard-go
    # and boringtun 0.03 s, a site's process and key (2.2 and 3.1 s for 64 here, stop 64;
    # the kernel's WireGuard, unmeasured, is given the same)
    start_s_per_tunnel: float = 0.0
    # the same with an IKE_SA each (`[gateway] ike_sas = "per-tunnel"`, an IKE daemon
    # only): strongSwan 0.27 s, a DH exchange each, both ends at once (71.9 s for 256)
    start_s_per_ike_sa: float = 0.0

    def start_estimate(self, tunnels: int = 1, ike_sas: str = "one") -> float:
        """Seconds its start and stop take with `tunnels` set up as `ike_sas` says
        (`check`'s estimate)."""
        each = self.start_s_per_ike_sa if self.ike and ike_sas == "per-tunnel" else 0.0
        return self.start_s + (each or self.start_s_per_tunnel) * (tunnels - 1)

    @property
    def kernel_plane(self) -> bool:
        """Whether its data plane is the kernel's (xfrm's ESP, the kernel's WireGuard): its
        CPU is softirq and kernel threads, no process of its own."""
        return self.kernel_esp or self.kernel_tunnel

    @property
    def ipsec(self) -> bool:
        """Whether it runs IPsec at all (`none` is the baseline)."""
        return self.name != "none"

    @property
    def module(self) -> str:
        """Its module's name under ipsec_lab.backends (`ours`)."""
        return self.cls.__module__.rpartition(".")[2]


def _strongswan(name: str, what: str, data_plane: str, **more: Any) -> Entry:
    """One of strongSwan's three entries: charon, its tools and IKE's start, on either
    testbed; which ESP it drives (`data_plane`) is the difference."""
    return Entry(name, strongswan.StrongSwan, what, (("data_plane", data_plane),), hosts=True,
                 tools=("swanctl", "/usr/lib/ipsec/charon", "unshare"), start_s=3.0,
                 probes_kernel=True, ike=True, start_s_per_tunnel=0.11,
                 start_s_per_ike_sa=0.27, no_tunnels_on_hosts=strongswan.NO_HOSTS_TUNNELS,
                 **more)  # fmt: skip


def _wireguard_tunnels(most: int, why: str) -> dict[str, Any]:
    """What the three WireGuards' entries share of N tunnels (a hub and its sites,
    backends/wireguard.py): bounded by gwB's `most` devices, on namespaces only, 0.03 s a
    site to start."""
    return dict(tunnels=True, most_tunnels=most, most_tunnels_why=why,
                no_tunnels_on_hosts=wireguard.NO_HOSTS_TUNNELS,
                start_s_per_tunnel=0.03)  # fmt: skip


# Every backend, once: scenario validation, the CLI's choices and help, `check`, `hosts
# check` and the docs derive from this list. A new backend is its module and one line here.
REGISTRY: tuple[Entry, ...] = (
    Entry("none", none.NoIpsec,
          "plain forwarding, the baseline every ratio is taken against",
          hosts=True, start_s=0.5, tunnels=True),
    _strongswan("strongswan",
                "charon negotiating IKEv2 (PSK): strongswan-kernel where the kernel has ESP, "
                "else strongswan-libipsec", "auto", resolve=strongswan.resolve, tunnels=True),
    _strongswan("strongswan-kernel", "charon with its SAs in the kernel's xfrm", "kernel",
                kernel_esp=True, tunnels=True),
    _strongswan("strongswan-libipsec",
                "charon with kernel-libipsec, strongSwan's own user-space ESP on a TUN device",
                "libipsec", slower=strongswan.LIBIPSEC_SLOWER),
    Entry("xfrm", xfrm.Xfrm, "the Linux kernel's IPsec, keyed by hand", hosts=True,
          kernel_esp=True, probes_kernel=True, tunnels=True,
          no_tunnels_on_hosts=xfrm.NO_HOSTS_TUNNELS),
    Entry("xfrm-udp", xfrm.Xfrm, "the same with ESP in UDP, RFC 3948",
          (("udp_encap", True),), hosts=True, kernel_esp=True, probes_kernel=True,
          tools=("python3",), tunnels=True,  # the socket that holds ESP in UDP's port
          no_tunnels_on_hosts=xfrm.NO_HOSTS_TUNNELS),
    Entry("ours", ours.Ours, "this project's gateway, ipsec-gw", stage_timing=True,
          hosts=True, tools=("nft",), user=ours.GATEWAY_USER, start_s=1.5, tunnels=True,
          start_s_per_tunnel=0.0004),
    Entry("ours-udp", ours.Ours, "ipsec-gw with ESP in UDP, RFC 3948, and UDP GSO/GRO",
          (("udp_encap", True),), stage_timing=True, hosts=True, tools=("nft",),
          user=ours.GATEWAY_USER, start_s=1.5, tunnels=True, start_s_per_tunnel=0.0004),
    Entry("wireguard", wireguard.Wireguard,
          "the Linux kernel's WireGuard (configuration `wireguard`), where the kernel has "
          "the module: in the micro-VM here (--vm), or on real hosts",
          hosts=True, tools=("wg",), probes_kernel=True, kernel_tunnel=True,
          modules=(("wireguard", "WireGuard (the kernel's)"),),
          **_wireguard_tunnels(wireguard.MOST_SITES, wireguard.MOST_SITES_WHY)),
    Entry("wireguard-go", userspace_wireguard.WireguardGo,
          "WireGuard in user space on a TUN device, Debian's wireguard-go (configuration "
          "`wireguard`; a 2022 release, before upstream's batching)",
          hosts=True, tools=("wireguard-go", "wg"), start_s=1.5,
          **_wireguard_tunnels(userspace_wireguard.MOST_SITES, userspace_wireguard.MOST_SITES_WHY)),
    Entry("boringtun", userspace_wireguard.Boringtun,
          "WireGuard in user space on a TUN device, Cloudflare's boringtun in Rust "
          f"(configuration `wireguard`; boringtun-cli {userspace_wireguard.BORINGTUN_VERSION} from "
          "crates.io)",
          hosts=True, tools=("boringtun-cli", "wg", "ping"), start_s=1.5,
          **_wireguard_tunnels(userspace_wireguard.MOST_SITES, userspace_wireguard.MOST_SITES_WHY)),
    Entry("external", external.External,
          "a gateway pair the lab does not configure (an appliance, a cloud VPN): it drives "
          "and meters the traffic ends only; real hosts only (--hosts)",
          namespaces=False, hosts=True),
)  # fmt: skip
BY_NAME: dict[str, Entry] = {e.name: e for e in REGISTRY}
NAMES: tuple[str, ...] = tuple(BY_NAME)
IPSEC_NAMES: tuple[str, ...] = tuple(e.name for e in REGISTRY if e.ipsec)


def described(names: tuple[str, ...] = NAMES) -> str:
    """`name` (what it is), … — for --help."""
    return "; ".join(f"{n}: {BY_NAME[n].what}" for n in names)


def resolve(name: str, hosts: Hosts | None = None) -> tuple[str, str]:
    """The backend `name` will run as here (or on `hosts`), and why (empty when it is
    itself)."""
    e = BY_NAME[name]
    return e.resolve(hosts) if e.resolve else (name, "")


def tunnels_refusal(name: str, n: int, hosts: bool = False) -> str | None:
    """Why backend `name` cannot set up `n` tunnels (`hosts`: on real hosts; None: it
    can)."""
    e = BY_NAME[name]
    if e.tunnels and e.most_tunnels and n > e.most_tunnels:
        return f"{n} tunnels: {name} sets up at most {e.most_tunnels} ({e.most_tunnels_why})"
    if n == 1 or (e.tunnels and not (hosts and e.no_tunnels_on_hosts)):
        return None
    if e.tunnels:
        return f"{n} tunnels on real hosts: {name}: {e.no_tunnels_on_hosts}"
    can = ", ".join(e.name for e in REGISTRY if e.tunnels)
    return f"{n} tunnels: {name} sets up one so far (those that set up many: {can})"


def make(name: str, stage_timing: bool = False, hosts: Hosts | None = None,
         aqm: bool = False, tunnels: int = 1, ike_sas: str = "one",
         tun_queue: int | str | None = None) -> Backend:  # fmt: skip
    """The backend `name`; `stage_timing` switches on ours' per-stage counters (the
    others have none: the lab then records no per-stage split for them), `aqm` ours'
    CoDel on its receive queues (the others' queues are the kernel's), `tun_queue` the
    packets its TUN devices queue (None: the gateway's default). `hosts`: the
    real hosts it will run on — its checks then probe them, not this machine.
    `tunnels`: how many between the line testbed's gateways (`tunnels_refusal`), and
    `ike_sas` how an IKE daemon sets them up (charon_files.IKE_SAS)."""
    e = BY_NAME.get(name)
    if e is None:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(NAMES)})")
    why = tunnels_refusal(name, tunnels, hosts is not None)
    if why:
        raise ValueError(why)
    kwargs = dict(e.kwargs)
    if e.stage_timing:  # ours' entries: its gateway's own settings
        kwargs["stage_timing"] = stage_timing
        kwargs["aqm"] = aqm
        kwargs["tun_queue"] = tun_queue
    if e.tunnels and e.ipsec:
        kwargs["tunnels"] = tunnels
    if e.ike:
        kwargs["ike_sas"] = ike_sas
    backend: Backend = e.cls(**kwargs)
    if hosts is not None and e.hosts:
        backend.use_hosts(hosts)
    return backend


def markdown() -> str:
    """The backend table of docs/backends.md (`python -m ipsec_lab.backends` prints it)."""
    lines = ["| backend | what it is | module |", "|---|---|---|"]
    for e in REGISTRY:
        lines.append(f"| `{e.name}` | {e.what} | `backends/{e.module}.py` |")
    return "\n".join(lines) + "\n"
