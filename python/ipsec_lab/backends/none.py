"""No IPsec: the gateways forward in the clear (the baseline of every campaign)."""

from __future__ import annotations

import platform

from ipsec_lab.backends.base import Processless


class NoIpsec(Processless):
    name = "none"

    def version(self) -> str:
        return f"Linux {platform.release()} forwarding"
