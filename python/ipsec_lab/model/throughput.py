"""The Tisovsky-Baronak throughput model: per-packet time, fits and predictions.

Units as in the paper: packet sizes L in bytes of the inner IP packet, times in ms,
rates in Mbit/s. A packet of L bytes at R Mbit/s takes ``0.008 * L / R`` ms.

* synchronous (software crypto; the CPU waits for it), eq. 3:
  ``t = t_fix + L_alg / R_alg``
* asynchronous (a look-aside engine works beside the CPU), eq. 4:
  ``t = max(t_fix, t_oh + L_alg / R_alg)``, break-point ``L_bp = R_alg (t_fix - t_oh)``
  (eq. 15, in bytes of secured length).

Throughput at size L is ``R(L) = L / t(L)`` (eq. 12).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipsec_lab import units
from ipsec_lab.model.transforms import SecuredLength
from ipsec_lab.units import plural

MS_PER_BYTE_PER_MBPS = 0.008  # 8 bit/byte / 1e6 bit/Mbit * 1e3 ms/s


class FitError(ValueError):
    """Points that cannot be fitted, with what is wrong with them."""


def transfer_ms(size: float, mbps: float) -> float:
    """Time for ``size`` bytes at ``mbps`` Mbit/s, in ms."""
    return MS_PER_BYTE_PER_MBPS * size / mbps


@dataclass(frozen=True)
class Point:
    """One measurement: inner IP packet size (bytes) and throughput (Mbit/s)."""

    size: int
    mbps: float

    @property
    def t_ms(self) -> float:
        return transfer_ms(self.size, self.mbps)


def parse_point(text: str) -> Point:
    """``SIZE:RATE`` as the CLI takes it (``128:2.204``, ``128:2.2Mbps``: the rate in the
    grammar of `ipsec_lab.units`, a bare number Mbit/s); errors say which part is wrong."""
    size_s, sep, mbps_s = text.partition(":")
    if not sep:
        raise FitError(f"point {text!r}: write SIZE:MBPS, e.g. 128:2.204")
    try:
        size = int(size_s)
    except ValueError:
        raise FitError(f"point {text!r}: size {size_s!r} is not a whole number of bytes") from None
    if not 20 <= size <= 65535:
        raise FitError(f"point {text!r}: size must be 20 to 65535 bytes (an IP packet)")
    try:
        mbps = units.rate_mbit(mbps_s)
    except units.UnitError as e:
        raise FitError(f"point {text!r}: throughput {e}") from None
    return Point(size, mbps)


@dataclass(frozen=True)
class SyncModel:
    """t = t_fix + L_alg / R_alg (eq. 3)."""

    t_fix_ms: float
    r_alg_mbps: float
    lalg: SecuredLength
    mode = "sync"

    def time_ms(self, size: int) -> float:
        return self.t_fix_ms + transfer_ms(self.lalg(size), self.r_alg_mbps)

    def throughput_mbps(self, size: int) -> float:
        return transfer_ms(size, 1.0) / self.time_ms(size)

    def limit(self, size: int) -> str:
        """Which term is the larger part of this packet's time."""
        per_byte = transfer_ms(self.lalg(size), self.r_alg_mbps)
        return "L_alg/R_alg" if per_byte > self.t_fix_ms else "t_fix"

    def params(self) -> dict[str, float]:
        return {"t_fix_ms": self.t_fix_ms, "r_alg_mbps": self.r_alg_mbps}


@dataclass(frozen=True)
class AsyncModel:
    """t = max(t_fix, t_oh + L_alg / R_alg) (eq. 4)."""

    t_fix_ms: float
    t_oh_ms: float
    r_alg_mbps: float
    lalg: SecuredLength
    mode = "async"

    @property
    def l_bp_bytes(self) -> float:
        """Break-point in bytes of secured length, eq. 15: L_bp = R_alg (t_fix - t_oh)."""
        return (self.t_fix_ms - self.t_oh_ms) / MS_PER_BYTE_PER_MBPS * self.r_alg_mbps

    def engine_ms(self, size: int) -> float:
        return self.t_oh_ms + transfer_ms(self.lalg(size), self.r_alg_mbps)

    def time_ms(self, size: int) -> float:
        return max(self.t_fix_ms, self.engine_ms(size))

    def throughput_mbps(self, size: int) -> float:
        return transfer_ms(size, 1.0) / self.time_ms(size)

    def limit(self, size: int) -> str:
        """Which branch sets this packet's time: the CPU (t_fix) or the crypto engine."""
        return "engine" if self.engine_ms(size) > self.t_fix_ms else "cpu"

    def params(self) -> dict[str, float]:
        return {
            "t_fix_ms": self.t_fix_ms,
            "t_oh_ms": self.t_oh_ms,
            "r_alg_mbps": self.r_alg_mbps,
            "l_bp_bytes": self.l_bp_bytes,
        }


Model = SyncModel | AsyncModel


# --- fits -------------------------------------------------------------------------------


def two_point(p1: Point, p2: Point, lalg: SecuredLength) -> SyncModel:
    """The paper's two-point method, eq. 10 and 11, literally."""
    la1, la2 = lalg(p1.size), lalg(p2.size)
    den = p2.size * p1.mbps - p1.size * p2.mbps
    num = (la2 - la1) * p1.mbps * p2.mbps
    if den == 0 or num == 0 or num / den <= 0:
        raise FitError(
            f"points {p1.size}:{p1.mbps:g} and {p2.size}:{p2.mbps:g} give a negative or "
            "infinite R_alg: for the model, time per packet must grow with the secured "
            f"length (here L_alg {la1} -> {la2}); check the points or the --lalg form"
        )
    r_alg = num / den  # eq. 10
    t_fix = transfer_ms(p1.size, p1.mbps) - transfer_ms(la1, r_alg)  # eq. 11
    return SyncModel(t_fix, r_alg, lalg)


@dataclass
class _Linear:
    """Weighted least squares of t = a + b * x, minimising relative residuals."""

    a: float
    b: float
    sa: float | None  # standard errors (None when the fit is exact: no degrees of freedom)
    sb: float | None
    cov_ab: float | None
    rss: float


def _linear(x: Sequence[float], t: Sequence[float]) -> _Linear:
    import numpy as np  # here, not at the top: every `ipsec-lab` command imports this
    # module, few fit a model (numpy is half of the CLI's start: 112 of 253 ms here)

    xa = np.asarray(x, dtype=float)
    ta = np.asarray(t, dtype=float)
    w = 1.0 / ta  # relative error in time = relative error in throughput
    a_mat = np.column_stack([w, xa * w])
    y = ta * w
    coef, _, rank, _ = np.linalg.lstsq(a_mat, y, rcond=None)
    if rank < 2:
        raise FitError(
            "the points do not pin down two parameters: give at least two different "
            "secured lengths (sizes)"
        )
    resid = y - a_mat @ coef
    rss = float(resid @ resid)
    dof = len(ta) - 2
    sa = sb = cab = None
    if dof > 0:
        cov = np.linalg.inv(a_mat.T @ a_mat) * (rss / dof)
        sa, sb, cab = float(math.sqrt(cov[0, 0])), float(math.sqrt(cov[1, 1])), float(cov[0, 1])
    return _Linear(float(coef[0]), float(coef[1]), sa, sb, cab, rss)


@dataclass
class PointResult:
    size: int
    mbps: float
    l_alg: int
    predicted_mbps: float | None = None
    residual_pct: float | None = None
    excluded: str | None = None  # why the point was left out of the fit

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "mbps": self.mbps,
            "l_alg": self.l_alg,
            "predicted_mbps": self.predicted_mbps,
            "residual_pct": self.residual_pct,
            "excluded": self.excluded,
        }


@dataclass
class Fit:
    model: Model
    method: str
    points: list[PointResult]
    uncertainty: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mode": self.model.mode, "lalg": self.model.lalg.spec}
        d.update(self.model.params())
        d["method"] = self.method
        d["uncertainty"] = self.uncertainty
        d["points"] = [p.to_json() for p in self.points]
        kept = [p for p in self.points if p.excluded is None and p.residual_pct is not None]
        d["max_abs_residual_pct"] = max((abs(p.residual_pct or 0) for p in kept), default=None)
        d["notes"] = self.notes
        return d


def fit_sync(points: Sequence[Point], lalg: SecuredLength) -> tuple[SyncModel, str, dict[str, Any]]:
    """Two points: eq. 10-11. More: weighted least squares with standard errors."""
    pts = sorted(points, key=lambda p: p.size)
    if len(pts) < 2:
        raise FitError("a synchronous fit needs at least two points (t_fix and R_alg)")
    if len(pts) == 2 and lalg(pts[0].size) != lalg(pts[1].size):
        m = two_point(pts[0], pts[1], lalg)
        _check_t_fix(m.t_fix_ms, None)
        return m, "two-point (eq. 10-11)", {"t_fix_ms": None, "r_alg_mbps": None}
    lin = _linear([lalg(p.size) for p in pts], [p.t_ms for p in pts])
    if lin.b <= 0:
        raise FitError(
            "the points give a negative or infinite R_alg: time per packet does not grow "
            "with the secured length (are they limited by something else, e.g. the link?)"
        )
    r_alg = MS_PER_BYTE_PER_MBPS / lin.b
    _check_t_fix(lin.a, lin.sa)
    unc: dict[str, Any] = {
        "t_fix_ms": lin.sa,
        "r_alg_mbps": None if lin.sb is None else MS_PER_BYTE_PER_MBPS * lin.sb / lin.b**2,
    }
    return SyncModel(lin.a, r_alg, lalg), "weighted least squares", unc


def _check_t_fix(t_fix: float, sigma: float | None) -> None:
    if t_fix < 0 and (sigma is None or t_fix < -2 * sigma):
        raise FitError(
            f"the points imply a negative per-packet time t_fix = {t_fix:.4g} ms: throughput "
            "grows faster with size than the model allows; check the points and --lalg"
        )


def fit_async(
    points: Sequence[Point], lalg: SecuredLength
) -> tuple[AsyncModel, str, dict[str, Any]]:
    """The smallest k points on the CPU branch (t = t_fix), the rest on the engine branch
    (t = t_oh + L_alg/R_alg). Three points: the paper's method (one small, two large).
    More: every split is tried and the best consistent one kept."""
    import numpy as np  # (as in _linear)

    pts = sorted(points, key=lambda p: p.size)
    if len(pts) < 3:
        raise FitError(
            "an asynchronous fit needs at least three points: one below the break-point "
            "for t_fix and two above it for t_oh and R_alg"
        )
    best: tuple[float, AsyncModel, dict[str, Any]] | None = None
    for k in range(1, len(pts) - 1):
        low, high = pts[:k], pts[k:]
        t_low = np.array([p.t_ms for p in low])
        # t_fix: the relative-error-weighted mean of the CPU-branch times.
        t_fix = float(len(t_low) / np.sum(1.0 / t_low))
        if len(high) == 2 and lalg(high[0].size) != lalg(high[1].size):
            try:
                m2 = two_point(high[0], high[1], lalg)
            except FitError:
                continue
            t_oh, r_alg, s_oh, s_r, rss = m2.t_fix_ms, m2.r_alg_mbps, None, None, 0.0
        else:
            try:
                lin = _linear([lalg(p.size) for p in high], [p.t_ms for p in high])
            except FitError:
                continue
            if lin.b <= 0:
                continue
            t_oh, r_alg, rss = lin.a, MS_PER_BYTE_PER_MBPS / lin.b, lin.rss
            s_oh = lin.sa
            s_r = None if lin.sb is None else MS_PER_BYTE_PER_MBPS * lin.sb / lin.b**2
        if t_oh >= t_fix or t_oh < 0:
            continue
        m = AsyncModel(t_fix, t_oh, r_alg, lalg)
        # Consistent only if each point sits on the branch it was fitted to.
        slack = 0.02
        if any(lalg(p.size) > m.l_bp_bytes * (1 + slack) for p in low):
            continue
        if any(lalg(p.size) < m.l_bp_bytes * (1 - slack) for p in high):
            continue
        rss += float(np.sum((t_low / t_fix - 1.0) ** 2))
        s_fix = None
        if k > 1:
            s_fix = float(np.std(t_low, ddof=1) / math.sqrt(k))
        unc = {"t_fix_ms": s_fix, "t_oh_ms": s_oh, "r_alg_mbps": s_r}
        if best is None or rss < best[0]:
            best = (rss, m, unc)
    if best is None:
        raise FitError(
            "no break-point is consistent with the points: an asynchronous model needs "
            "small packets at a constant time and larger ones on a rising line with "
            "t_oh < t_fix; try --mode sync"
        )
    method = "three-point (paper)" if len(pts) == 3 else "least squares over break-point splits"
    return best[1], method, best[2]


def fit_model(points: Sequence[Point], lalg: SecuredLength, mode: str) -> tuple[Model, str, Any]:
    if mode == "sync":
        return fit_sync(points, lalg)
    if mode == "async":
        return fit_async(points, lalg)
    raise FitError(f"mode {mode!r}: sync or async")


def _min_points(mode: str) -> int:
    return 2 if mode == "sync" else 3


def fit(
    points: Sequence[Point],
    lalg: SecuredLength,
    mode: str = "sync",
    *,
    link_mbps: float | None = None,
    wire_overhead: int | None = None,
    auto_exclude: bool = True,
    tolerance: float = 0.05,
) -> Fit:
    """Fit ``mode`` to ``points``, leaving out those the link rather than the securing
    process limited (study 2 notes such points must not enter the fit).

    With ``link_mbps`` a point is link-limited when its rate on the wire (its size plus the
    configuration's overhead, or ``wire_overhead`` bytes) reaches the link rate within 2 %.
    Without it, the largest point is tested against a fit of the smaller ones: it is
    link-limited when it falls short of that fit by more than ``tolerance`` while its wire
    rate is the highest seen (a ceiling), and the test repeats downwards.
    """
    if len({p.size for p in points}) != len(points):
        raise FitError("two points have the same size: give each size once (average repeats)")
    results = {p.size: PointResult(p.size, p.mbps, lalg(p.size)) for p in points}
    kept = sorted(points, key=lambda p: p.size)
    notes: list[str] = []

    def wire_rate(p: Point) -> float:
        w = lalg.wire(p.size)
        if w is None:
            w = p.size + (wire_overhead or 0)
        elif wire_overhead is not None:
            w += wire_overhead
        return p.mbps * w / p.size

    if link_mbps is not None:
        for p in list(kept):
            if wire_rate(p) >= 0.98 * link_mbps:
                results[p.size].excluded = (
                    f"link-limited: {wire_rate(p):.4g} Mbit/s on the wire of a "
                    f"{link_mbps:g} Mbit/s link"
                )
                kept.remove(p)
    elif auto_exclude:
        need = _min_points(mode)
        while len(kept) - 1 >= need:
            top, rest = kept[-1], kept[:-1]
            try:
                m, _, _ = fit_model(rest, lalg, mode)
            except FitError:
                break
            pred = m.throughput_mbps(top.size)
            ceiling = wire_rate(top) >= (1 - tolerance) * max(wire_rate(p) for p in rest)
            if top.mbps < pred * (1 - tolerance) and ceiling:
                results[top.size].excluded = (
                    f"link-limited (detected): {top.mbps:.4g} Mbit/s is "
                    f"{100 * (1 - top.mbps / pred):.1f} % below the fit of the smaller points "
                    f"({pred:.4g}) at the highest wire rate seen"
                )
                kept = rest
            else:
                break
    if len(kept) < _min_points(mode) and len(kept) < len(points):
        raise FitError(
            f"only {plural(len(kept), 'point')} left after leaving out link-limited ones; "
            f"a {mode} fit needs {_min_points(mode)}"
        )
    model, method, unc = fit_model(kept, lalg, mode)
    for r in results.values():
        r.predicted_mbps = model.throughput_mbps(r.size)
        r.residual_pct = 100.0 * (r.mbps - r.predicted_mbps) / r.predicted_mbps
    excluded = [r.size for r in results.values() if r.excluded]
    if excluded:
        notes.append(f"left out of the fit as link-limited: {excluded} B")
    if isinstance(model, SyncModel) and model.t_fix_ms < 0:
        notes.append("t_fix is negative but within two standard errors of 0")
    return Fit(model, method, [results[s] for s in sorted(results)], unc, notes)


# --- predictions for sizes and mixes ------------------------------------------------------

# The "simple IMIX" (7:4:1 of 40, 576 and 1500-byte IP packets), the mix most test
# equipment calls IMIX; sizes are IP packets, as everywhere in the model.
SIMPLE_IMIX: tuple[tuple[int, float], ...] = ((40, 7.0), (576, 4.0), (1500, 1.0))
MIXES: dict[str, tuple[tuple[int, float], ...]] = {"imix": SIMPLE_IMIX, "simple": SIMPLE_IMIX}


def parse_mix(text: str) -> tuple[tuple[int, float], ...]:
    """``imix``, ``SIZE:WEIGHT,SIZE:WEIGHT,...`` or ``@FILE`` (a histogram: one
    ``SIZE WEIGHT`` or ``SIZE,WEIGHT`` pair per line; ``#`` starts a comment)."""
    t = text.strip().lower()
    if t in MIXES:
        return MIXES[t]
    if t.startswith("@"):
        path = text.strip()[1:]
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as e:
            raise FitError(f"mix file {path}: {e.strerror or e}") from None
        pairs = []
        for n, line in enumerate(lines, 1):
            body = line.split("#", 1)[0].replace(",", " ").split()
            if not body:
                continue
            if len(body) != 2:
                raise FitError(f"mix file {path}, line {n}: want SIZE WEIGHT, got {line!r}")
            pairs.append(f"{body[0]}:{body[1]}")
        if not pairs:
            raise FitError(f"mix file {path}: no SIZE WEIGHT lines")
        try:
            return parse_mix(",".join(pairs))
        except FitError as e:
            raise FitError(f"mix file {path}: {e}") from None
    out: list[tuple[int, float]] = []
    for part in t.split(","):
        s, sep, w = part.partition(":")
        try:
            size, weight = int(s), float(w) if sep else 1.0
        except ValueError:
            raise FitError(
                f"mix {text!r}: {part!r} is not SIZE:WEIGHT (e.g. 40:7,576:4,1500:1) "
                f"nor one of {', '.join(MIXES)}"
            ) from None
        if not 20 <= size <= 65535 or not weight >= 0:
            raise FitError(f"mix {text!r}: {part!r} needs a size 20-65535 and a weight >= 0")
        out.append((size, weight))
    if not any(w > 0 for _, w in out):
        raise FitError(f"mix {text!r}: the weights add up to nothing")
    return tuple(out)


@dataclass(frozen=True)
class MixPrediction:
    mbps: float
    kpps: float
    mean_size: float
    packets: float  # total weight

    def to_json(self) -> dict[str, float]:
        return {
            "mbps": self.mbps,
            "kpps": self.kpps,
            "mean_size": self.mean_size,
            "packets": self.packets,
        }


def predict_mix(model: Model, mix: Iterable[tuple[int, float]]) -> MixPrediction:
    """Throughput for packets of the given sizes in the given proportions: the mean bytes
    per packet over the mean time per packet (not the mean of per-size rates)."""
    items = [(s, w) for s, w in mix if w > 0]
    if not items:
        raise FitError("an empty mix has no throughput")
    n = sum(w for _, w in items)
    mean_t = sum(w * model.time_ms(s) for s, w in items) / n
    mean_l = sum(w * s for s, w in items) / n
    return MixPrediction(transfer_ms(mean_l, 1.0) / mean_t, 1.0 / mean_t, mean_l, n)
