"""Our gateway daemon `ipsec-gw` (crates/ipsec-gw) as the IPsec under test."""

from __future__ import annotations

import shutil
from pathlib import Path

from ipsec_lab.backends import Processless, Unsupported


def gateway_binary() -> Path | None:
    here = Path(__file__).resolve().parents[3]
    for p in (here / "target/release/ipsec-gw", here / "target/debug/ipsec-gw"):
        if p.exists():
            return p
    found = shutil.which("ipsec-gw")
    return Path(found) if found else None


class Ours(Processless):
    name = "ours"

    def check(self, configuration: str) -> None:
        if gateway_binary() is None:
            raise Unsupported(
                "the gateway daemon ipsec-gw does not exist yet (it is the gateway issue); "
                "use the engine benchmark `ipsec-lab bench` for our engine's costs meanwhile"
            )
        raise Unsupported("driving ipsec-gw from the lab is not wired up yet")

    def version(self) -> str:
        return "ipsec-gw (not built)"
