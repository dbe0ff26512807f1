"""The book agrees with the code: the tables generated from the registries are current,
every link between pages leads somewhere, and the README stays a door (a short page
with a map), not the book."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ipsec_lab import backends, metrics, workloads

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _table(page: str, name: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    m = re.search(rf"<!-- table: {name} -->\n(.*?)<!-- end -->", text, re.S)
    assert m, f"docs/{page} has no {name} table"
    return m.group(1)


@pytest.mark.parametrize(
    "page, name, make",
    [
        ("lab.md", "metrics", metrics.markdown),
        ("backends.md", "backends", backends.markdown),
        ("scenarios.md", "workloads", workloads.markdown),
    ],
)
def test_generated_tables_are_current(page: str, name: str, make: object) -> None:
    want = make()  # type: ignore[operator]
    assert _table(page, name) == want, f"docs/{page} is stale; `python -m ...` prints:\n{want}"


def test_every_metric_and_backend_is_on_its_page() -> None:
    lab, bk = _table("lab.md", "metrics"), _table("backends.md", "backends")
    assert all(f"| `{m.key}` |" in lab for m in metrics.METRICS)
    assert all(f"| `{n}` |" in bk for n in backends.NAMES)
    wl = _table("scenarios.md", "workloads")
    assert all(f"| `{k}` |" in wl for k in workloads.KINDS)


def test_links_between_pages_lead_somewhere() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_the_readme_is_a_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in readme, f"the README's map does not name {page.name}"


def test_every_test_the_threat_model_cites_exists() -> None:
    """docs/security.md names a test for each promise: each must be there (`file::name`,
    or `::name` for the file named before it in the same cell; Rust `fn`s by file)."""
    text = (ROOT / "docs" / "security.md").read_text()
    files = {p.name: p for p in (ROOT / "tests").glob("*.py")}
    files |= {str(p.relative_to(ROOT)): p for p in (ROOT / "crates").rglob("*.rs")}
    files |= {p.name: p for p in (ROOT / "crates").rglob("*.rs") if p.name != "mod.rs"}
    missing, cited = [], 0
    for row in text.splitlines():
        last = None
        for ref in re.findall(r"`([\w/.]*)::(\w+)`", row):
            where, name = ref
            last = where or last
            path = files.get(last or "")
            cited += 1
            if path is None:
                missing.append(f"{last}::{name} (no such file)")
            elif not re.search(rf"\b(def|fn) {name}\b", path.read_text()):
                missing.append(f"{last}::{name}")
    assert missing == []
    assert cited >= 30, cited


def test_each_scenarios_stated_time_is_the_time_check_estimates() -> None:
    """A scenario's header (and the README's first experiment) says "about N minutes":
    N must be the estimate `ipsec-lab check` gives, to the minute (rounded either way).
    The VM's scenario is timed under TCG emulation, which the estimate does not model."""
    import math

    from ipsec_lab import preflight, scenario

    root = Path(__file__).resolve().parents[1]
    said = {}
    for f in sorted((root / "scenarios").glob("*.toml")):
        head = "".join(line for line in f.read_text().splitlines(True) if line.startswith("#"))
        m = re.search(r"about (\d+) minutes(?! under TCG)", head, re.I)
        if m:
            said[f.name] = (f, int(m.group(1)))
    readme = (root / "README.md").read_text()
    m = re.search(r"about\s+(\d+) minutes on 2 cores", readme)
    assert m, "the README's first experiment says how long it takes"
    said["README (ours.toml)"] = (root / "scenarios" / "ours.toml", int(m.group(1)))
    assert len(said) >= 5
    for name, (f, minutes) in said.items():
        est = preflight.forecast(scenario.load(f))["estimated_s"] / 60
        assert math.floor(est) <= minutes <= math.ceil(est), (name, minutes, est)


def test_every_file_the_architecture_map_names_exists() -> None:
    """docs/architecture.md names files (`dataplane/outbound.rs`, `meters.measure` aside):
    each must be a file of the tree, so the map cannot point at a file since moved."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "architecture.md").read_text()
    files = [str(p.relative_to(root)) for p in root.glob("**/*") if p.suffix in (".rs", ".py")
             and "target" not in p.parts and ".venv" not in p.parts]  # fmt: skip
    named = set(re.findall(r"`?([\w/.-]+\.(?:rs|py))\b", text))
    assert len(named) > 30
    missing = [n for n in named if not any(f == n or f.endswith("/" + n) for f in files)]
    assert not missing, missing
