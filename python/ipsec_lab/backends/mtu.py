"""What a run's tunnel offers and what fits its link whole: the outer link's MTU, the inner
MTU the tunnel offers its hosts (ours: its TUN device's), and the largest inner packet
whose protected form fits the link (the model's overhead; RFC 4301 §8 — larger ones are
fragmented or, with DF, refused with a PMTU message). A tunnel that offers more than fits
fragments every full-size packet after sealing it: on 1500-byte links ours-udp carried
0.07 x plain forwarding's TCP where 1600 gave 0.33 x."""

from __future__ import annotations

from typing import Any

from ipsec_lab.model.transforms import ConfigError, Layout, parse_configuration


def facts(topology: str, backend: str, configuration: str, link_mtu: int | None,
          inner_mtu: int | None = None) -> dict[str, Any]:  # fmt: skip
    """`link_mtu`, `largest_whole_inner` and, where the tunnel is a device of its own
    (ours, whose backend reads it from its TUN devices), `inner_mtu` — for every row of a run.
    `link_mtu` None: unknown (a link the lab does not drive: an external DUT's)."""
    from ipsec_lab.model.overhead import largest_inner

    out: dict[str, Any] = {"link_mtu": link_mtu, "largest_whole_inner": None}
    if link_mtu is None:
        return out
    if backend == "none":
        out["largest_whole_inner"] = link_mtu
        return out
    mode = "tunnel" if topology == "line" else "transport"
    if inner_mtu is not None:
        out["inner_mtu"] = inner_mtu
    elif mode != "tunnel":
        return out  # host to host: the daemon's mode is its own
    lay = Layout(mode=mode, udp_encap=backend.endswith("-udp"))
    try:
        out["largest_whole_inner"] = largest_inner(parse_configuration(configuration),
                                                   link_mtu, lay)  # fmt: skip
    except ConfigError:
        pass
    return out


def fragmenting_note(xs: list[dict[str, Any]]) -> str:
    """The summary's note when a run's tunnel offered more than fits the link whole."""
    for x in xs:
        inner, whole = x.get("inner_mtu"), x.get("largest_whole_inner")
        if inner and whole and inner > whole:
            return (f"FRAGMENTING: the tunnel offers an inner MTU of {inner} B but only "
                    f"{whole} B fit the {x['link_mtu']}-B link whole — a larger inner packet "
                    "leaves as two fragments")  # fmt: skip
    return ""
