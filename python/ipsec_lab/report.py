"""The report: one self-contained HTML file (plots as inline SVG drawn by matplotlib, no
external resource: it opens offline), and the same tables as CSV and the analyses as
JSON, beside it.

    OUT/report.html     the studies' published figures beside ours, plots, the reading
    OUT/report.json     every analysis (tables, plot data, findings), for scripts
    OUT/tables/*.csv    each table
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

from ipsec_lab import environment
from ipsec_lab.studies import (
    HOLDS,
    NOT_MEASURED,
    REVERSED,
    STRONGER,
    VERDICTS,
    WEAKER,
    Analysis,
    Finding,
    Plot,
    Table,
)

VERDICT_CLASS = {HOLDS: "ok", STRONGER: "ok", WEAKER: "weak", REVERSED: "chg"}  # else "na"
HELD = (HOLDS, STRONGER, WEAKER)

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2.2em; border-bottom: 2px solid #ccd; }
h3 { font-size: 1.05em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .6em 0; font-size: .88em; }
th, td { border: 1px solid #ccd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #eef; } td.num { text-align: right; }
.ok { color: #075; font-weight: 600; } .chg { color: #b40; font-weight: 600; }
.weak { color: #a70; font-weight: 600; } .fail { color: #b00; }
.na { color: #777; } .note { color: #555; font-size: .88em; }
.wide { overflow-x: auto; max-width: 100%; }
figure.plot { margin: 1em 0; } figure.plot svg { max-width: 100%; height: auto; }
figcaption { font-size: .88em; color: #444; }
code, pre { background: #f4f4f8; padding: .1em .3em; }
"""

# Runs in the browser: checks that every plot drew (an <svg> with a non-empty box and
# marks in it) and records the outcome on <body> for the headless-browser test.
CHECK_JS = """
window.__errors = [];
window.addEventListener('error', e => { window.__errors.push(String(e.message)); });
window.addEventListener('load', () => {
  const figs = document.querySelectorAll('figure.plot');
  let ok = 0;
  figs.forEach(f => {
    const svg = f.querySelector('svg');
    if (!svg) { console.error('plot without svg: ' + f.id); return; }
    const box = svg.getBoundingClientRect();
    const marks = svg.querySelectorAll('path, rect, use, polyline, line').length;
    if (box.width > 50 && box.height > 50 && marks > 5) { ok += 1; }
    else { console.error('plot did not render: ' + f.id); }
  });
  document.body.dataset.plotsTotal = String(figs.length);
  document.body.dataset.plotsOk = String(ok);
  document.body.dataset.errors = String(window.__errors.length);
  // the page itself never scrolls sideways: a wide table scrolls in its own box
  const page = document.documentElement;
  document.body.dataset.pageWider = String(page.scrollWidth > page.clientWidth + 1);
});
"""


def _svg(p: Plot) -> str:
    fig, _ = _figure(p)
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline SVG


def _figure(p: Plot) -> tuple[Any, dict[str, list[Any]]]:
    """The plot's matplotlib figure, and each bar series' rectangles (bars plots)."""
    import matplotlib

    matplotlib.rcParams["svg.hashsalt"] = "ipsec-lab"  # stable ids: same data, same file
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.add_subplot()
    drawn: dict[str, list[Any]] = {}
    if p.kind == "bars":
        n = max(len(p.series), 1)
        width = 0.8 / n
        xs = range(len(p.categories))
        for i, (name, vals) in enumerate(p.series.items()):
            ys = [math.nan if v is None else float(v) for v in vals]
            pos = [x + (i - (n - 1) / 2) * width for x in xs]
            drawn[name] = list(ax.bar(pos, ys, width, label=name))
            spans = p.errors.get(name) or []
            bars = [(x, y, e) for x, y, e in zip(pos, ys, spans, strict=False)
                    if e is not None and not math.isnan(y)]  # fmt: skip
            if bars:
                ax.errorbar([b[0] for b in bars], [b[1] for b in bars],
                            yerr=[[b[1] - b[2][0] for b in bars], [b[2][1] - b[1] for b in bars]],
                            fmt="none", ecolor="#222", capsize=3, linewidth=1)  # fmt: skip
        ax.set_xticks(list(xs), p.categories, rotation=20, ha="right", fontsize=8)
    elif p.kind == "lines":
        colors: dict[str, Any] = {}
        for name, (x, y) in p.lines.items():
            (line,) = ax.plot(x, y, label=name, linewidth=1.2)
            colors[name] = line.get_color()
        for name, (x, y) in p.points.items():
            ax.plot(x, y, "o", color=colors.get(name), markersize=5,
                    label=None if name in colors else name)  # fmt: skip
    elif p.kind == "area":
        names = list(p.lines)
        x = p.lines[names[0]][0]
        ax.stackplot(x, *[p.lines[k][1] for k in names], labels=names, alpha=0.8)
        ax.set_ylim(0, 1)
        ax.yaxis.set_major_formatter(lambda v, _pos: f"{100 * v:.0f} %")
    else:
        raise ValueError(f"plot kind {p.kind!r}")
    for i, (label, level) in enumerate(p.hlines.items()):
        ax.axhline(level, color="#444", linestyle=("--", ":", "-.")[i % 3], linewidth=1,
                   label=label)  # fmt: skip
    if p.logy:
        _decades(ax, p)
    ax.set_title(p.title, fontsize=10)
    ax.set_xlabel(p.xlabel)
    ax.set_ylabel(p.ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        n = len(ax.get_legend_handles_labels()[0])
        if p.kind == "bars":  # beside the axes: a legend inside would cover bars
            ax.legend(fontsize=8, ncols=2 if n > 12 else 1, loc="upper left",
                      bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # fmt: skip
        else:
            ax.legend(fontsize=8, ncols=2 if n > 4 else 1, framealpha=0.9)
    return fig, drawn


def _decades(ax: Any, p: Plot) -> None:
    """A log axis of whole decades, labelled at each power of 10 only — so that "each
    gridline 10x the one below" is what is drawn. A smallest value near its decade's floor
    gets a decade below it, so its bar does not read as none."""
    from matplotlib.ticker import LogLocator, NullFormatter

    ys = [float(v) for vs in p.series.values() for v in vs if v is not None and v > 0]
    ys += [float(y) for _, line in p.lines.items() for y in line[1] if y and y > 0]
    ys += [float(y) for _, pts in p.points.items() for y in pts[1] if y and y > 0]
    ys += [float(v) for v in p.hlines.values() if v > 0]
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=30))
    ax.yaxis.set_minor_formatter(NullFormatter())
    if ys:
        lo, hi = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
        if min(ys) < 2 * 10**lo:
            lo -= 1
        ax.set_ylim(10.0**lo, 10.0 ** max(hi, lo + 1))


def log_ticks(p: Plot) -> list[tuple[float, str]]:
    """The labelled gridlines of a log plot as drawn: (value, label)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, _ = _figure(p)
    FigureCanvasAgg(fig).draw()  # type: ignore[no-untyped-call]
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    out = [(float(t.get_position()[1]), t.get_text()) for t in ax.get_yticklabels()]
    out += [(float(t.get_position()[1]), t.get_text()) for t in ax.get_yticklabels(minor=True)]
    return sorted((v, t) for v, t in out if t and lo <= v <= hi)


def _cell(v: Any) -> str:
    s = html.escape(str(v))
    return (
        f'<td class="num">{s}</td>'
        if re.fullmatch(r"[-+]?[\d.,]+( %)?", str(v))
        else f"<td>{s}</td>"
    )


def _table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(_cell(v) for v in r) + "</tr>" for r in t.rows)
    note = f'<p class="note">{html.escape(t.note)}</p>' if t.note else ""
    empty = '<p class="na">(no rows: nothing measured)</p>' if not t.rows else ""
    return (f'<h3>{html.escape(t.title)}</h3><div class="wide"><table><tr>{head}</tr>{body}'
            f"</table></div>{empty}{note}")  # fmt: skip


def reading(analyses: list[Analysis]) -> list[str]:
    """The report's summary sentences, one per study, from its findings (counted on the
    verdict scale) and, when its campaigns had failed runs, what failed and why."""
    out = []
    for an in analyses:
        n = {v: [f for f in an.findings if f.verdict == v] for v in VERDICTS}
        held = len(n[HOLDS]) + len(n[STRONGER]) + len(n[WEAKER])
        s = f"{an.title.split(' — ')[0]}: {held} of {len(an.findings)} findings hold"
        several = len(an.backends()) > 1

        def who(f: Finding, several: bool = several) -> str:
            return f"{f.backend}: " if several else ""  # with --compare: whose finding

        parts = [f"{len(n[v])} {v.removeprefix('holds, ')}" for v in (STRONGER, WEAKER) if n[v]]
        if parts:
            s += " (" + ", ".join(parts) + ")"
        if several:  # each backend's own count: the total alone mixes them
            s += "; by backend: " + ", ".join(
                f"{b} {sum(f.verdict in HELD for f in an.findings if f.backend == b)} of "
                f"{sum(f.backend == b for f in an.findings)}"
                for b in an.backends()
            )
        firm = [f for f in n[REVERSED] if not f.noise]
        if firm:
            s += "; reversed: " + "; ".join(f"{who(f)}{f.claim} (here {f.ours})" for f in firm)
        noisy = [f for f in an.findings if f.noise]
        if noisy:
            s += "; within this run's noise, so the verdict may differ between runs: " + (
                "; ".join(f"{who(f)}{f.claim} ({f.verdict})" for f in noisy)
            )
        if n[NOT_MEASURED]:
            s += f"; {len(n[NOT_MEASURED])} not measured"
            if an.failures:
                s += " because runs failed: " + "; ".join(an.failures[:3])
                if len(an.failures) > 3:
                    s += f"; and {len(an.failures) - 3} more"
            else:
                s += " (why: in the findings table)"
        elif an.failures:
            s += f"; {len(an.failures)} failed run groups (see the study's section)"
        out.append(s + ".")
    return out


def bar_heights(p: Plot) -> dict[tuple[str, str], float]:
    """Each bar of a bars plot as drawn: (series, category) -> height in pixels at the
    report's size, for a measured value (so a test can see every measured bar shows)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, bars = _figure(p)
    FigureCanvasAgg(fig).draw()  # type: ignore[no-untyped-call]
    out = {}
    for name, patches in bars.items():
        for cat, patch, v in zip(p.categories, patches, p.series[name], strict=True):
            if v is not None:
                box = patch.get_window_extent()
                out[(name, cat)] = float(box.height)
    return out


def code(text: str) -> str:
    """`text` escaped for HTML, with `command` spans as <code> (no literal backticks)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")[:80]


def render(analyses: list[Analysis], env: dict[str, Any], lab: Path) -> str:
    gen = environment.describe()
    studies = [an for an in analyses if an.findings]
    title = (
        "ipsec-lab: the seed studies, reproduced on this machine"
        if studies and len(studies) == len(analyses)
        else "ipsec-lab: campaigns measured on this machine"
    )
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{html.escape(title)}</title>",
        f"<style>{CSS}</style><script>{CHECK_JS}</script></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<p>"
        + (
            "Each study's published figures beside today's measurement, with the findings "
            "that still hold and those that changed; each "
            if studies
            else "Each "
        )
        + "campaign's throughput, CPU effort and wire bytes per backend and configuration. "
        "Ratios and medians are what to compare: absolute figures depend on this machine "
        "and its neighbours.</p>",
    ]
    if studies:
        parts += [
            "<h2 id=reading>Reading</h2><ul>",
            *(f"<li>{html.escape(s)}</li>" for s in reading(studies)),
            "</ul>",
            "<p class=note>Verdicts: "
            + "; ".join(
                f"<span class={VERDICT_CLASS.get(k, 'na')}>{html.escape(k)}</span> = "
                f"{html.escape(v)}"
                for k, v in VERDICTS.items()
            )
            + ".</p>",
        ]
    if any(an.quick for an in analyses):
        parts.append('<p class="note">Some studies ran with <code>--quick</code>: fewer '
                     "configurations, sizes and seconds — a first look, not the full "
                     "experiment.</p>")  # fmt: skip
    n = 0
    for an in analyses:
        parts.append(f"<h2 id={an.study}>{html.escape(an.title)}</h2>")
        if list(an.campaigns) == ["campaign"]:  # a campaign of one's own: its id is its name
            parts.append(f'<p class="note">{code(an.source)}.</p>')
        else:
            parts.append(f'<p class="note">{code(an.source)}. Campaigns: ' + ", ".join(
                f"{html.escape(r)}: {c}" for r, c in an.campaigns.items()) + "</p>")  # fmt: skip
        if an.terms:
            parts.append(f'<p class="note"><b>Terms.</b> {code(an.terms)}</p>')
        # with --compare each backend has its own rows: say whose
        several = len(an.backends()) > 1
        if an.findings:
            parts.append("<h3>Findings</h3><table><tr>" + "<th>backend</th>" * several +
                         "<th>finding</th><th>published</th>"
                         "<th>this machine</th><th>verdict</th></tr>")  # fmt: skip
        for f in an.findings:
            cls = VERDICT_CLASS.get(f.verdict, "na")
            noise = f"<br><small class=na>{html.escape(f.noise)}</small>" if f.noise else ""
            backend = f"<td>{html.escape(f.backend)}</td>" if several else ""
            parts.append(
                f"<tr>{backend}<td>{html.escape(f.claim)}</td><td>{html.escape(f.published)}</td>"
                f"<td>{html.escape(f.ours)}</td><td class={cls}>{html.escape(f.verdict)}"
                f"{noise}</td></tr>"
            )
        if an.findings:
            parts.append("</table>")
        if an.failures:
            items = "".join(f"<li class=fail>{code(x)}</li>" for x in an.failures)
            parts.append(
                f"<h3>Failed runs</h3><ul>{items}</ul><p class=note>Each failed run's whole "
                "reason, with the tail of the failing program's own log: "
                + ", ".join(
                    f"<code>ipsec-lab results {c} --lab {html.escape(shlex.quote(str(lab)))}</code>"
                    for c in sorted(set(an.campaigns.values()))
                )
                + ".</p>"
            )
        if an.cause:
            parts.append(f"<p><b>Why (the model's terms):</b> {code(an.cause)}</p>")
        for p in an.plots:
            n += 1
            # The plot carries its title; the caption adds what the title does not say.
            caption = code(p.note or p.title)
            parts.append(
                f"<figure class=plot id=plot-{n}>{_svg(p)}"
                f"<figcaption>{caption}</figcaption></figure>"
            )
        parts += [_table(t) for t in an.tables]
    parts.append("<h2 id=environment>Environment and how to re-run</h2><table>")
    for k, v in {**env, "report written by": gen.get("ipsec_lab"),
                 "git revision (report)": gen.get("git")}.items():  # fmt: skip
        if v is None or v == "":
            continue  # not known, or not used (no VM): nothing to say
        parts.append(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>")
    parts.append("</table>")
    lab_q = html.escape(shlex.quote(str(lab)))
    if studies:
        parts.append(
            f"<p>Re-run the studies: <code>ipsec-lab reproduce all --lab {lab_q}</code> "
            "(as root; add <code>--quick</code> for a first look, <code>--compare "
            "ours,strongswan</code> for another implementation beside ours), then "
            f"<code>ipsec-lab report --lab {lab_q}</code>.</p>"
        )
    own = [an for an in analyses if an.rerun]
    if own:
        parts.append("<p>Continue or re-run a campaign (as root; <code>--resume</code> keeps "
                     "its finished runs and does the rest):</p><ul>"
                     + "".join(f"<li>campaign {', '.join(map(str, an.campaigns.values()))}: "
                               f"<code>{html.escape(an.rerun)}</code></li>" for an in own)
                     + "</ul>")  # fmt: skip
    ids = " ".join(str(c) for an in analyses for c in an.campaigns.values())
    parts.append(
        "<p>The campaigns above are in the lab's <code>results.sqlite</code>: "
        f"<code>ipsec-lab results --lab {lab_q}</code> lists them; this report again: "
        f"<code>ipsec-lab report {ids} --lab {lab_q}</code>.</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def write(analyses: list[Analysis], env: dict[str, Any], lab: Path, out: Path) -> Path:
    """Write report.html, report.json and tables/*.csv into `out`; return the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    page = out / "report.html"
    page.write_text(render(analyses, env, lab))
    (out / "report.json").write_text(
        json.dumps(
            {
                "environment": env,
                "reading": reading([an for an in analyses if an.findings]),
                "studies": [a.to_json() for a in analyses],
            },
            indent=1,
        )
    )
    tables = out / "tables"
    tables.mkdir(exist_ok=True)
    for old in tables.glob("*.csv"):
        old.unlink()
    for an in analyses:
        for i, t in enumerate(an.tables, 1):
            # one table: named after its study or campaign alone (campaign-1.csv)
            name = an.study if len(an.tables) == 1 else f"{an.study}-{i:02d}-{_slug(t.title)}"
            with open(tables / f"{name}.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(t.columns)
                w.writerows(t.rows)
    return page
