"""Study 1: Ferrante, Piuri, Owen, "IPSec Hardware Resource Requirements Evaluation" (2005).

Pentium III 500 MHz gateways, FreeS/WAN, 1500-byte datagrams, 1 GByte per run, on a
100 Mbit/s link and on one shaped to 10 Mbit/s. Throughput in Mbit/s, CPU effort in µs per
kB (kB = 1024 B).
"""

from __future__ import annotations

from ipsec_lab.model.ipcomp import Costs

PACKET_SIZE = 1500

# 100 Mbit/s series.
NO_IPSEC_MBPS_100 = 89.0  # link-limited; implied by the paper's ratios
NO_IPSEC_CPU_100 = 0.20  # "CPU under 20 %"
ENC_SHA1_MBPS_100 = 53.8  # ESP AES-128-CBC + HMAC-SHA-1-96, CPU-bound (~100 %)
ENC_SHA2_MBPS_100 = 34.8
IPCOMP_COMPRESSIBLE_MBPS_100 = 11.74
IPCOMP_COMPRESSIBLE_EFFORT = 665.53
IPCOMP_COMPRESSIBLE_REDUCTION_100 = 0.46  # wire traffic fell by 46 %
IPCOMP_INCOMPRESSIBLE_MBPS_100 = 27.44
IPCOMP_INCOMPRESSIBLE_EFFORT = 284.68

# 10 Mbit/s series.
NO_IPSEC_MBPS_10 = 9.58
IPCOMP_COMPRESSIBLE_MBPS_10 = 11.67  # CPU 100 %, above the link's no-IPsec rate
IPCOMP_COMPRESSIBLE_REDUCTION_10 = 0.43  # 1,070 MB -> 603 MB
IPCOMP_ENOUGH_CPU_MBPS_10 = 17.44  # "with enough CPU"

KB = 1024


def _effort(mbps: float, load: float = 1.0) -> float:
    """CPU effort (µs/kB) of a run at ``mbps`` with the CPU ``load`` busy."""
    return load * 8 * KB / mbps


def ipcomp_costs(data: str) -> Costs:
    """The IPComp advisor's costs for study 1's machine, derived from its 100 Mbit/s
    figures only: forwarding from the no-IPsec run (CPU < 20 % at ~89 Mbit/s), ESP from
    enc + SHA-1 (CPU-bound at 53.8 Mbit/s), and DEFLATE as what is left of the published
    IPComp effort once forwarding and ESP on the compressed bytes are taken out.
    ``data`` is "compressible" or "incompressible" (DEFLATE runs faster on data it cannot
    shrink, and the study measured both)."""
    fwd = _effort(NO_IPSEC_MBPS_100, NO_IPSEC_CPU_100)
    esp = _effort(ENC_SHA1_MBPS_100) - fwd
    if data == "compressible":
        after = 1 - IPCOMP_COMPRESSIBLE_REDUCTION_100
        comp = IPCOMP_COMPRESSIBLE_EFFORT - fwd - esp * after
    elif data == "incompressible":
        comp = IPCOMP_INCOMPRESSIBLE_EFFORT - fwd - esp
    else:
        raise ValueError(f"data {data!r}: compressible or incompressible")
    return Costs(fwd, esp, comp, f"ferrante2005 ({data}), from its 100 Mbit/s figures")


# Study 1's eight configurations as ipsec-lab configurations and payloads ("no IPsec" has
# no engine work to time), and the CPU effort of each relative to enc + SHA-1 implied by
# the published 100 Mbit/s figures (CPU-bound rows: effort ~ 1 / throughput at ~100 % CPU;
# the effort ratios the paper states directly: enc-only = 1.17 x auth-only, enc + auth =
# 1.66 x auth-only; IPComp efforts 665.53 and 284.68 µs/kB; AH + ESP "similar to" enc +
# SHA-1).
CONFIGURATIONS: tuple[tuple[str, str | None, str], ...] = (
    ("no IPsec", None, "text"),
    ("auth only", "esp:null-sha1", "text"),
    ("enc only", "esp:aes128", "text"),
    ("enc + SHA-1", "esp:aes128-sha1", "text"),
    ("enc + SHA-2", "esp:aes128-sha256", "text"),
    ("AH + ESP", "ah:sha1+esp:aes128", "text"),
    ("IPComp, compressible", "ipcomp+esp:aes128-sha1", "text"),
    ("IPComp, incompressible", "ipcomp+esp:aes128-sha1", "random"),
)
BASELINE = "enc + SHA-1"
_ENC_SHA1_EFFORT = _effort(ENC_SHA1_MBPS_100)
PUBLISHED_EFFORT_VS_ENC_SHA1: dict[str, float] = {
    "auth only": 1 / 1.66,
    "enc only": 1.17 / 1.66,
    "enc + SHA-1": 1.0,
    "enc + SHA-2": _effort(ENC_SHA2_MBPS_100) / _ENC_SHA1_EFFORT,
    "AH + ESP": 1.0,
    "IPComp, compressible": IPCOMP_COMPRESSIBLE_EFFORT / _ENC_SHA1_EFFORT,
    "IPComp, incompressible": IPCOMP_INCOMPRESSIBLE_EFFORT / _ENC_SHA1_EFFORT,
}
