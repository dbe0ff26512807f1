"""The seed studies: each one's published figures as data (with the paper's table or
figure number), its experiment as lab scenarios, and the analysis that puts the two side
by side. See docs/seed-studies.md; `ipsec-lab reproduce` runs them, `ipsec-lab report`
renders their analyses.

A study module has:
- `NAME`, `TITLE`, `SOURCE` (the paper, with what the figures come from);
- `roles(quick, backends)`: the campaigns it runs, in order (e.g. study 1's "today" and
  "limited-ours", whose CPU quota is computed from "today");
- `scenario(role, quick, backends, done)`: that campaign's scenario (TOML text), or a
  `Skip` with the reason; `done` holds the finished campaigns' runs by role;
- `analyse(done)`: an `Analysis` — tables, plot data and findings, published beside ours.

Analyses are plain data (JSON-able): the report draws them; tests check them without a
browser or a plotting library.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

NAMES = ("ferrante2005", "tisovsky2013", "freeswan", "hadjichristofi2003")

Runs = list[dict[str, Any]]  # a campaign's runs as `Store.runs` gives them


@dataclass(frozen=True)
class Skip:
    """A campaign a study cannot run here, and why."""

    reason: str


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""


@dataclass
class Plot:
    """What to draw. kind: `bars` (categories x series), `lines` (series of (x, y), with
    `points` drawn as markers), `area` (stacked shares over time)."""

    kind: str
    title: str
    xlabel: str
    ylabel: str
    categories: list[str] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)
    lines: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    points: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    logy: bool = False
    note: str = ""
    hlines: dict[str, float] = field(default_factory=dict)  # label -> y: a reference line
    # bars: per series, per category, the (min, max) drawn as an error bar (None: none)
    errors: dict[str, list[tuple[float, float] | None]] = field(default_factory=dict)


HOLDS = "holds"
STRONGER = "holds, stronger"
WEAKER = "holds, weaker"
REVERSED = "reversed"
NOT_MEASURED = "not measured"

# The verdict scale, in order, with what each means (the report prints it).
VERDICTS = {
    HOLDS: "this machine shows what the paper shows, within the finding's tolerance",
    STRONGER: "the same direction, and a larger effect than published (e.g. a cost ratio "
    "of 26 x where the paper had 7 x)",
    WEAKER: "the same direction, but a smaller effect than published, or an order that "
    "holds for most but not all of its steps",
    REVERSED: "the opposite of the published finding (or no effect where it found one)",
    NOT_MEASURED: "no run measured it here; the 'this machine' column says why",
}


@dataclass
class Finding:
    """One published finding and what this machine shows. verdict: one of `VERDICTS`
    (`not measured` with why in `ours`); `ours` is generated from the very numbers the
    verdict was decided on."""

    claim: str
    published: str
    ours: str
    verdict: str
    # set when the effect is smaller than this run's own noise: the verdict may differ
    # between runs (the text says the difference and its uncertainty)
    noise: str = ""
    backend: str = ""  # the IPsec it was measured on (with --compare, each has its own)


@dataclass
class Analysis:
    study: str
    title: str
    source: str
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    cause: str = ""  # what the model / the per-stage split says drives the cost
    campaigns: dict[str, int] = field(default_factory=dict)  # role -> campaign id
    quick: bool = False
    failures: list[str] = field(default_factory=list)  # failed runs, a line each, with why
    # how to continue or re-run it (a command line), where it is not `reproduce`
    rerun: str = ""
    terms: str = ""  # what its tables' and plots' terms mean, said once

    def add_findings(self, backend: str, findings: list[Finding]) -> None:
        """Add what one backend's runs show (each finding tagged with the backend)."""
        for f in findings:
            f.backend = backend
        self.findings += findings

    def backends(self) -> list[str]:
        """The backends its findings were measured on, in order."""
        return list(dict.fromkeys(f.backend for f in self.findings if f.backend))

    def add_cause(self, backend: str, text: str) -> None:
        """Add one backend's reading of the cause (several with --compare)."""
        if text:
            self.cause = f"{self.cause} {backend}: {text}".strip()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def module(name: str) -> ModuleType:
    """The study module `name` (one of `NAMES`)."""
    import importlib

    if name not in NAMES:
        raise ValueError(f"unknown study {name!r} (known: {', '.join(NAMES)})")
    return importlib.import_module(f"ipsec_lab.studies.{name}")


# --- helpers the studies share ----------------------------------------------------------


def ratio_verdict(ours: float | None, published: float, tolerance: float = 1.25) -> str:
    """For a finding "A is `published` x B": `holds` when ours is within a factor
    `tolerance` of it; else `holds, stronger` / `holds, weaker` when ours is on the same
    side of 1 and further from / nearer to it, `reversed` when on the other side."""
    if ours is None or not math.isfinite(ours) or ours <= 0:
        return NOT_MEASURED
    lo, lp = math.log(ours), math.log(published)
    if abs(lo - lp) <= math.log(tolerance):
        return HOLDS
    if lo * lp <= 0:
        return REVERSED
    return STRONGER if abs(lo) > abs(lp) else WEAKER


def claim_verdict(ok: bool | None) -> str:
    """A yes/no finding: `holds`, `reversed`, or `not measured` (None)."""
    if ok is None:
        return NOT_MEASURED
    return HOLDS if ok else REVERSED


def graded_verdict(ours: float | None, published: float, tolerance: float) -> str:
    """A finding "X is about `published`" where X > 0 is the effect's direction (a
    reduction, a share): `holds` within ± `tolerance`, stronger above, weaker between 0
    and it, `reversed` at or below 0."""
    if ours is None or not math.isfinite(ours):
        return NOT_MEASURED
    if abs(ours - published) <= tolerance:
        return HOLDS
    if ours <= 0:
        return REVERSED
    return STRONGER if ours > published else WEAKER


def chain(vals: list[float | None], reverse: bool = False, digits: int = 3) -> tuple[str, str]:
    """An order finding ("a < b < c", or "a > b > c" with `reverse`): the values printed
    with the relation each neighbouring pair really has, and the verdict from those same
    numbers — `holds` when every step is in order, `holds, weaker` when most are,
    `reversed` when most are not."""
    if not vals or any(v is None or not math.isfinite(v) for v in vals):
        return " / ".join(fmt(v, digits) for v in vals), NOT_MEASURED
    xs = [float(v) for v in vals if v is not None]
    text = fmt(xs[0], digits)
    good = 0
    for a, b in itertools.pairwise(xs):
        ok = a >= b if reverse else a <= b
        good += ok
        rel = ">" if a > b else "=" if a == b else "<"
        text += f" {rel} {fmt(b, digits)}"
    steps = len(xs) - 1
    if good == steps:
        return text, HOLDS
    return text, WEAKER if good * 2 > steps else REVERSED


# Student's t, two-sided 95 % (t_0.975) by degrees of freedom: with a handful of
# repetitions the interval is far wider than 2 standard errors (12.7 x for two).
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
         10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}  # fmt: skip


def t975(df: int) -> float:
    """The 95 % two-sided Student t factor for `df` degrees of freedom (df ≥ 1)."""
    for k in sorted(_T975):
        if df <= k:
            return _T975[k]
    return 1.96


def chain_noise(samples: list[list[float]], names: list[str], unit: str) -> str:
    """The steps of an order finding ("a < b < c") that this run's own repetitions do not
    tell apart: neighbours whose means differ by less than the 95 % interval of that
    difference (Welch's standard error, Student's t with the smaller sample's degrees of
    freedom — conservative for few repetitions). Empty when every step is resolved; says
    so when a value has a single measurement (its noise cannot be judged)."""
    flagged, single = [], False
    for a, b, na, nb in zip(samples, samples[1:], names, names[1:], strict=False):
        if len(a) < 2 or len(b) < 2:
            single = True
            continue
        se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
        half = t975(min(len(a), len(b)) - 1) * se
        d = statistics.mean(b) - statistics.mean(a)
        if abs(d) < half:
            flagged.append(f"{na} → {nb} {d:+.1f} ± {half:.1f} {unit}")
    if flagged:
        return (
            "within noise: " + "; ".join(flagged) + " (95 % intervals over the "
            "repetitions); the verdict may differ between runs"
        )
    if single:
        return "one measurement per configuration: the steps' noise cannot be judged"
    return ""


def fmt(v: float | None, digits: int = 3) -> str:
    if v is None or not math.isfinite(v):
        return "—"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}g}"


def ipsec_backends(backends: tuple[str, ...]) -> list[str]:
    return [b for b in backends if b != "none"]


def backends_toml(backends: tuple[str, ...], with_none: bool = True) -> str:
    names = (["none"] if with_none else []) + ipsec_backends(backends)
    return "[" + ", ".join(f'"{b}"' for b in names) + "]"


def median(xs: list[dict[str, Any]], field_: str) -> float | None:
    vals = [float(x[field_]) for x in xs if x.get(field_) is not None]
    return statistics.median(vals) if vals else None


def skipped(runs: Runs) -> dict[tuple[str, str], str]:
    """(backend, configuration) -> why it was skipped."""
    return {
        (r["backend"], r["configuration"]): r["reason"] or ""
        for r in runs
        if r["status"] == "skipped"
    }


def user_share(xs: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """Mean user and system+softirq shares of the busy CPU over a measurement's series."""
    us, ss = [], []
    for x in xs:
        for s in x.get("cpu_series") or []:
            busy = s["user"] + s["system"] + s["softirq"]
            if busy > 0:
                us.append(s["user"])
                ss.append(s["system"] + s["softirq"])
    if not us:
        return None, None
    return statistics.mean(us), statistics.mean(ss)


def stage_split(xs: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(per-packet ns, per-byte ns) summed over measurements' per-stage counters: the
    model's t_fix stages and its L_alg / R_alg stages (see crates/ipsec/src/stage.rs)."""
    from ipsec_lab.algorithms import PER_BYTE_STAGES as per_byte_stages

    fixed = byte = 0
    seen = False
    for x in xs:
        for stage, ns in (x.get("stage_ns") or {}).items():
            seen = True
            if stage in per_byte_stages:
                byte += ns
            else:
                fixed += ns
    return (fixed, byte) if seen and fixed + byte > 0 else None


def paired_noise(diffs: list[float], unit: str = "pp") -> tuple[float, str]:
    """The mean of paired differences (slow minus fast, per configuration, application
    and size) and, when that mean is within two standard errors of zero, a note saying
    so; fewer than three pairs are too few to judge and are reported as such."""
    m = statistics.mean(diffs)
    if len(diffs) < 3:
        # two pairs that happen to agree would look resolved: too few to judge
        n = "one pair" if len(diffs) == 1 else f"{len(diffs)} pairs"
        return m, f"{n} only ({m:+.1f} {unit}): too few to judge its noise"
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    if abs(m) < half:
        return m, (
            f"within noise: {m:+.1f} ± {half:.1f} {unit} (95 % interval over "
            f"{len(diffs)} pairs); the verdict may differ between runs"
        )
    return m, ""


def ratio_noise(
    num: list[float], den: list[float], verdict: Callable[[float], str], digits: int = 3
) -> str:
    """For a finding on the ratio of two measured means: empty when `verdict` is the same
    across the ratio's 95 % interval (the delta method on each mean's relative standard
    error, Student's t), else a note saying the verdict may differ between runs; says so
    when a side has a single measurement."""
    if len(num) < 2 or len(den) < 2:
        return "one measurement per configuration: the ratio's noise cannot be judged"
    mn, md = statistics.mean(num), statistics.mean(den)
    if mn <= 0 or md <= 0:
        return ""
    rel = math.sqrt(
        statistics.variance(num) / len(num) / mn**2 + statistics.variance(den) / len(den) / md**2
    )
    k = t975(min(len(num), len(den)) - 1) * rel
    r = mn / md
    lo, hi = r * math.exp(-k), r * math.exp(k)
    if len({verdict(lo), verdict(r), verdict(hi)}) == 1:
        return ""
    return (
        f"within noise: {fmt(r, digits)} x, {fmt(lo, digits)} to {fmt(hi, digits)} at 95 % over "
        "the repetitions; the verdict may differ between runs"
    )
