"""The house rules a newcomer relies on, checked: no import cycle among the Python
package's modules or among a Rust crate's modules, and no file so long that it holds
several concerns (Python modules ~600 lines, Rust sources ~700 lines before their tests),
and no Rust message split over lines without its `\\`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY_MAX = 600
RS_MAX = 700


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _related(a: str, b: str) -> bool:
    """A package and its own submodule (the package's door, not a cycle)."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def python_graph() -> dict[str, set[str]]:
    """ipsec_lab's modules and what each imports — at the top, in a function, or for
    type checking only: any of them ties the two modules together."""
    src = ROOT / "python"
    mods = {}
    for p in (src / "ipsec_lab").rglob("*.py"):
        name = ".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for n in names:
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n and n != m and not _related(m, n):
                    graph[m].add(n)
    return graph


def rust_graph(crate: Path) -> dict[str, set[str]]:
    """A crate's modules (by file) and the modules each names with `crate::` or `super::`."""
    src = crate / "src"
    mods: dict[str, Path] = {}
    for p in src.rglob("*.rs"):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        mods["::".join(["crate", *parts])] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        text = re.sub(r"(?s)#\[cfg\(test\)\]\s*mod tests.*", "", p.read_text())
        text = re.sub(r"//[^\n]*", "", text)
        # one level of braces: `use super::{state::x, mac::y}` names both
        text = re.sub(r"\b((?:crate|super)(?:::\w+)*)::\{([^{}]*)\}",
                      lambda g: " ".join(f"{g[1]}::{x.strip()}" for x in g[2].split(",")
                                         if x.strip()), text)  # fmt: skip
        for path in re.findall(r"\b((?:crate|super)(?:::\w+)+)", text):
            # `super` is the module's parent, whether the module is a file or a mod.rs
            here = m
            while path.startswith("super::"):
                here, path = here.rpartition("::")[0], path[len("super::") :]
            if here != m:
                path = f"{here}::{path}"
            while path and path not in mods:
                path = path.rpartition("::")[0]
            if path and path != m and not _related(m.replace("::", "."), path.replace("::", ".")):
                graph[m].add(path)
    return graph


def test_no_python_import_cycle() -> None:
    assert _sccs(python_graph()) == []


def test_no_rust_module_cycle() -> None:
    for crate in sorted((ROOT / "crates").iterdir()):
        assert _sccs(rust_graph(crate)) == [], crate.name


def test_the_cycle_finder_finds_one() -> None:
    """The check above can fail: a two-module loop is found."""
    assert _sccs({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


@pytest.mark.parametrize(
    "a_says, b_says",
    [("use super::b::x;", "use super::a::y;"),  # file modules naming their siblings
     ("use super::{b::x, c};", "use crate::m::a::y;"),  # braces, and crate:: paths
     ("use super::super::m::b::x;", "use super::{a::y};")],  # super of super
)  # fmt: skip
def test_the_rust_graph_sees_a_loop_between_sibling_files(
    tmp_path: Path, a_says: str, b_says: str
) -> None:
    """`super::` in m/a.rs is m, not the crate: a loop between two files of one directory
    module (crypto/mac.rs <-> crypto/state.rs was one) is found."""
    src = tmp_path / "src" / "m"
    src.mkdir(parents=True)
    (tmp_path / "src" / "lib.rs").write_text("pub mod m;\n")
    (src / "mod.rs").write_text("pub mod a;\npub mod b;\npub mod c;\n")
    (src / "a.rs").write_text(f"{a_says}\npub fn y() {{}}\n")
    (src / "b.rs").write_text(f"{b_says}\npub fn x() {{}}\n")
    (src / "c.rs").write_text("")
    assert _sccs(rust_graph(tmp_path)) == [["crate::m::a", "crate::m::b"]]


def test_no_file_holds_several_concerns() -> None:
    long_py = [
        (p.relative_to(ROOT).as_posix(), n)
        for p in (ROOT / "python" / "ipsec_lab").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > PY_MAX
    ]
    long_rs = []
    for p in (ROOT / "crates").rglob("src/**/*.rs"):
        lines = p.read_text().splitlines()
        body = next((i for i, x in enumerate(lines) if x.startswith("#[cfg(test)]")), len(lines))
        if body > RS_MAX:
            long_rs.append((p.relative_to(ROOT).as_posix(), body))
    assert long_py == [] and long_rs == []


# A string literal split over lines without its `\` keeps the next line's indentation:
# "whatever                      the protocols" (a config error printed so for months).
# Indentation after an escaped newline (nft's ruleset text) is meant.
SPLIT_WITHOUT_CONTINUATION = re.compile(r'"[^"\n]*(?<=[^\s"])(?<!\\n) {4,}\S[^"\n]*"')


def test_no_rust_message_carries_a_lost_line_continuation() -> None:
    found = [
        f"{p.relative_to(ROOT).as_posix()}:{i}"
        for p in (ROOT / "crates").rglob("src/**/*.rs")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if not line.lstrip().startswith("//") and SPLIT_WITHOUT_CONTINUATION.search(line)
    ]
    assert found == []


def test_the_lost_continuation_check_sees_one() -> None:
    line = '"a key serves one SA, whatever                      the protocols"'
    assert SPLIT_WITHOUT_CONTINUATION.search(line)
    assert not SPLIT_WITHOUT_CONTINUATION.search('"a key serves one SA, whatever \\')
    assert not SPLIT_WITHOUT_CONTINUATION.search('"  chain local {\\n    type filter"')


# `make lint` runs clippy in the release profile (it then shares the release build's build
# scripts' outputs): code compiled only without `--release` would go unlinted.
ONLY_IN_DEBUG = re.compile(r"\bdebug_assertions\b")


def test_no_rust_code_is_compiled_only_in_one_profile() -> None:
    found = [
        f"{p.relative_to(ROOT).as_posix()}:{i}"
        for top in ("crates", "fuzz/fuzz_targets", "benchmarks")
        for p in (ROOT / top).rglob("*.rs")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if ONLY_IN_DEBUG.search(line)
    ]
    assert found == []
    assert ONLY_IN_DEBUG.search("#[cfg(not(debug_assertions))]")
    assert ONLY_IN_DEBUG.search("#[cfg_attr(any(test, debug_assertions), derive(Debug))]")
    assert not ONLY_IN_DEBUG.search("debug_assert!(len <= space);")
