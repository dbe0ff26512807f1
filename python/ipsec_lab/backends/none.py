"""No IPsec: the gateways forward in the clear (the baseline of every campaign)."""

from __future__ import annotations

import platform

from ipsec_lab.testbed.build import Testbed


class NoIpsec:
    name = "none"

    def check(self, configuration: str) -> None:
        return None

    def start(self, tb: Testbed, configuration: str) -> None:
        return None

    def stop(self, tb: Testbed) -> None:
        return None

    def pids(self) -> list[int]:
        return []

    def version(self) -> str:
        return f"Linux {platform.release()} forwarding"
