"""The Tisovsky-Baronak throughput model and the tools built on it.

Pure Python on numbers: no root, no testbed. ``transforms`` lays packets out per
configuration (wire size, secured length L_alg), ``throughput`` fits and predicts,
``plan`` turns a fit into cycles and cores, ``ipcomp`` advises on compression and
``overhead`` counts what IPsec adds to packets and transfers.
"""

from ipsec_lab.model.throughput import (
    AsyncModel,
    Fit,
    FitError,
    Point,
    SyncModel,
    fit,
    fit_async,
    fit_sync,
    parse_mix,
    parse_point,
    predict_mix,
    two_point,
)
from ipsec_lab.model.transforms import (
    ConfigError,
    Configuration,
    Layout,
    SecuredLength,
    packet_plan,
    parse_configuration,
    parse_lalg,
    wire_size,
)

__all__ = [
    "AsyncModel",
    "ConfigError",
    "Configuration",
    "Fit",
    "FitError",
    "Layout",
    "Point",
    "SecuredLength",
    "SyncModel",
    "fit",
    "fit_async",
    "fit_sync",
    "packet_plan",
    "parse_configuration",
    "parse_lalg",
    "parse_mix",
    "parse_point",
    "predict_mix",
    "two_point",
    "wire_size",
]
