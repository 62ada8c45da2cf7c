"""Reading bundles: files, directories and ``builtin:NAME`` (package data in builtin/), every
problem of every source in one ``BundleError``; the YAML bounded as policies/k8s/manifests.py
bounds every manifest."""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..k8s import manifests
from ..k8s.versions import NEWEST, Versions
from .compile import Bundle, BundleError, CelSites, Problem, compile_document

BUILTIN_PREFIX = "builtin:"

def parse_nodes(text: str, source: str) -> list[tuple[Any, yaml.Node]]:
    """Each document of a bundle source with its composed node (policies/bundle/yamlpos.py reads
    where each value was written), read within the bounds of policies/k8s/manifests.py."""
    try:
        return manifests.parse_nodes(text, "a bundle")
    except manifests.ManifestError as exc:
        raise BundleError([Problem(source, exc.message, line=exc.line, column=exc.column)]) from None


def parse_documents(text: str, source: str) -> list[Any]:
    """The documents of a bundle source; a problem is a located :class:`BundleError`."""
    return [document for document, _ in parse_nodes(text, source)]


def bundle_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
    return [path]

def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("trainjob_admission.policies.bundle").joinpath("builtin").iterdir() if p.name.endswith(".yaml"))

def read_source(spec: str) -> list[tuple[str, str]]:
    """(source name, text) pairs for a file, a directory or ``builtin:NAME``."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        resource = resources.files("trainjob_admission.policies.bundle").joinpath("builtin", f"{name}.yaml")
        if not resource.is_file():
            raise BundleError([Problem(spec, f"no built-in bundle {name!r} (built-in: {', '.join(builtin_names())})")])
        return [(spec, resource.read_text(encoding="utf-8"))]
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(spec)
    out = []
    for file in bundle_files(path):
        try:
            out.append((str(file), manifests.read_text(file)))
        except (OSError, UnicodeDecodeError) as exc:
            raise BundleError([Problem(str(file), f"cannot read: {exc}")]) from None
    return out

def load_bundles(specs: list[str], versions: Versions = NEWEST) -> list[Bundle]:
    """Load and compile every bundle in files/directories/builtins; all problems in one error.
    ``versions``: the cluster's (its CEL library level), the newest when not known."""
    bundles: list[Bundle] = []
    problems: list[Problem] = []
    sites: list[CelSites] = []
    for spec in specs:
        for source, text in read_source(spec):
            try:
                documents = parse_nodes(text, source)
            except BundleError as exc:
                problems.extend(exc.problems)
                continue
            for document, node in documents:
                try:
                    bundles.append(compile_document(document, source, node, versions))
                except BundleError as exc:
                    problems.extend(exc.problems)
                    sites.extend(exc.sites)
    names = [b.name for b in bundles]
    for duplicate in sorted({n for n in names if names.count(n) > 1}):
        problems.append(Problem(", ".join(b.source for b in bundles if b.name == duplicate), "bundle name used twice", duplicate))
    if problems:
        raise BundleError(problems, sites + [b.cel for b in bundles if b.cel is not None])
    return order(bundles)

def order(bundles: list[Bundle]) -> list[Bundle]:
    return sorted(bundles, key=lambda b: (b.spec.priority, b.name))

def default_bundles() -> list[Bundle]:
    return load_bundles([BUILTIN_PREFIX + "default"])
