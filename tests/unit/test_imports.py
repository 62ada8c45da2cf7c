"""The packages' import graph: no cycle, and every arrow one that its package allows.

Each package (and each module at the top of webhook/) says in its docstring, on a line
``May import: a, b.c, ...``, which of our packages it may use; like Kubernetes'
``.import-restrictions``, this test holds every import to that line and names the rule a wrong
import breaks. A package may always use itself and the error root of its top package. Imports
inside functions and under ``TYPE_CHECKING`` count as much as those at the top of a module, so
no deferred import can hide a cycle or an upward arrow."""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("webhook", "policies", "certs")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that ``name`` imports anywhere in its file (``from pkg import mod`` counts as
    the submodule; a package's __init__ is not implied)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_the_walk_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_sees_relative_and_local_imports() -> None:
    edges = graph()
    assert "webhook.decisionlog.lines" in edges["webhook.decisionlog.verify"]
    assert "policies.checks.quota" in edges["policies.checks.registry"]
    assert "webhook.startup" in edges["webhook.cli.commands"]  # inside a function


def test_policies_never_import_the_webhook() -> None:
    leaks = {name: sorted(t for t in targets if t.startswith(("webhook", "certs")))
             for name, targets in graph().items() if name.startswith("policies")}
    assert {name: found for name, found in leaks.items() if found} == {}


LAYERED = ("policies", "webhook")  # their subpackages and top modules are the layers; certs is one unit


def unit(module: str) -> str:
    """The unit a rule is written for: a subpackage of a layered package (``policies.k8s``), a
    module at its top (``webhook.metrics``), the package itself for its ``__init__``, or certs."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] in LAYERED else parts[0]


def rules() -> dict[str, tuple[str, ...]]:
    """Unit -> what it may import, read from the ``May import:`` line of its docstring."""
    found: dict[str, tuple[str, ...]] = {}
    for name in sorted({unit(m) for m in modules()}):
        path = ROOT / name.replace(".", "/")
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        doc = " ".join((ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split())
        match = re.search(r"May import: (.*?)\.?$", doc)
        assert match, f"{path.relative_to(ROOT)}: no 'May import:' line at the end of its docstring"
        text = match.group(1).strip()
        found[name] = () if text.startswith("nothing") else tuple(t.strip() for t in text.split(","))
    return found


def allowed(source: str, target: str, table: dict[str, tuple[str, ...]]) -> bool:
    own, theirs = unit(source), unit(target)
    if own == theirs or target == source.split(".")[0]:  # itself, or its top package's error root
        return True
    return any(target == rule or target.startswith(rule + ".") for rule in table[own])


def test_every_unit_says_what_it_may_import() -> None:
    table = rules()
    for name, targets in table.items():
        assert all(t.split(".")[0] in PACKAGES for t in targets), (name, targets)


def test_every_import_is_one_its_package_allows() -> None:
    table = rules()
    broken = sorted(f"{source} imports {target}, but {unit(source)} may import only "
                    f"{', '.join(table[unit(source)]) or 'nothing else of ours'}"
                    for source, targets in graph().items() for target in targets
                    if not allowed(source, target, table))
    assert broken == []


def test_the_rules_catch_an_upward_import() -> None:
    table = {"policies.k8s": (), "policies.job": ("policies.k8s",)}
    assert allowed("policies.job.phases", "policies.k8s.quantity", table)
    assert not allowed("policies.k8s.quantity", "policies.job.phases", table)
    assert allowed("policies.k8s.quantity", "policies", table)  # the error root


def test_the_top_levels_stay_small() -> None:
    """At most ten entries at the top of policies/ and webhook/ (issue 26): a newcomer sees the
    layers, not a corridor of modules."""
    for package in ("policies", "webhook"):
        entries = [p for p in (ROOT / package).iterdir() if p.name != "__pycache__"]
        assert len(entries) <= 10, sorted(p.name for p in entries)


def test_the_wheel_lists_every_package() -> None:
    """The distribution installs each folder under trainjob_admission (pyproject.toml lists them:
    setuptools cannot find packages under a mapped directory)."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = sorted("trainjob_admission." + ".".join(init.parent.relative_to(ROOT).parts)
                     for package in PACKAGES for init in (ROOT / package).rglob("__init__.py"))
    assert sorted(listed) == folders


def test_nothing_imports_a_top_level_name_the_wheel_does_not_have() -> None:
    """Every import of ours goes through trainjob_admission (or is relative): ``import webhook``
    would work in the repository, where pytest puts the root on sys.path, and fail installed."""
    bare = []
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py"), *modules().values()]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bare += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in PACKAGES]
    assert bare == []
