"""A gateway pair the lab does not configure: the user's appliance, a cloud VPN, another
vendor's box. The lab drives and meters only the traffic ends (the hosts file's client
and server); what the DUT is comes from the hosts file's `[dut]` table, recorded as
this backend's version. Only on a testbed of real hosts (`--hosts`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipsec_lab.backends.base import Processless

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts


class External(Processless):
    name = "external"

    def __init__(self) -> None:
        self.dut: dict[str, str] = {}

    def use_hosts(self, hosts: Hosts) -> None:
        """The hosts file's description of the DUT (its `[dut]` table)."""
        self.dut = dict(hosts.dut or {})

    def version(self) -> str:
        if not self.dut:
            return "external DUT (the hosts file's [dut] says nothing about it)"
        return "external DUT: " + ", ".join(f"{k} {v}" for k, v in self.dut.items())
