"""ipsec-lab: what does IPsec cost, here, and why?

The IPsec engine is Rust (``ipsec_lab._native``); this package is its Python face.
"""

from ipsec_lab._native import (
    DropError,
    IpcompAssociation,
    SecurityAssociation,
    SecurityBundle,
)

__all__ = [
    "DropError",
    "IpcompAssociation",
    "SecurityAssociation",
    "SecurityBundle",
    "__version__",
]
__version__ = "0.1.0"
