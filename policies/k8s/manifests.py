"""YAML manifests read with bounds, before anything walks them: a "billion laughs" file, a
recursive alias, an oversized document or one nested deeper than nesting.MAX_DEPTH is refused with
its line instead of being built. Bundles, runtime snapshots and every file the CLI reads (jobs,
cluster state, policy test cases, serve's --config) go through it.

Aliases share one parsed node, but everything after parsing (a schema, a digest, redaction)
walks the document expanded: a 690-byte bundle once killed the server. So each document is
composed (aliases still shared), measured, and only then built.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

import yaml

from .. import PolicyError
from .nesting import MAX_DEPTH, depth_ok

MAX_SOURCE_CHARS = 8 * 1024 * 1024  # one file or object text, before parsing
MAX_DOCUMENT_CHARS = 2 * 1024 * 1024  # one document (etcd stores at most 1.5 MiB per object)
MAX_ALIAS_NODES = 10_000  # nodes that aliases may add to one document, all together


class DuplicateKeys(dict):
    """A mapping whose text named some keys more than once (the last value kept, as a decoder
    keeps it): strict field validation (policies/k8s/fieldvalidation.py) refuses them by path."""

    duplicates: tuple[str, ...] = ()


def _construct_map(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
    """SafeLoader's mapping, a DuplicateKeys where a key is written twice (merge keys aside)."""
    seen: set[tuple[str, str]] = set()
    repeated: list[str] = []
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            if (key.tag, key.value) in seen and key.value not in repeated:
                repeated.append(key.value)
            seen.add((key.tag, key.value))
    data: dict = DuplicateKeys() if repeated else {}
    if repeated:
        data.duplicates = tuple(repeated)  # type: ignore[attr-defined]
    yield data
    data.update(loader.construct_mapping(node))


class _Loader(yaml.SafeLoader):
    """SafeLoader that remembers repeated keys."""


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)


class ManifestError(PolicyError, ValueError):
    """A source that cannot be read as YAML documents, with where (1-based; None: the whole source)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


def parse_nodes(text: str, what: str = "a manifest") -> list[tuple[Any, yaml.Node]]:
    """Each document of ``text`` with its composed node (where each value was written); ``what``
    names the kind of source in messages ("a bundle")."""
    if len(text) > MAX_SOURCE_CHARS:
        raise ManifestError(f"{len(text)} characters, more than the {MAX_SOURCE_CHARS} {what} source may have")
    loader = _Loader(text)
    documents = []
    try:
        while loader.check_node():
            node = loader.get_node()
            _check_document(node, what)
            document = loader.construct_document(node)
            if not depth_ok(document):
                raise ManifestError(f"not valid YAML for {what}: nested deeper than {MAX_DEPTH} levels",
                                    node.start_mark.line + 1, node.start_mark.column + 1)
            if document is not None:
                documents.append((document, node))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise ManifestError(f"not valid YAML: {getattr(exc, 'problem', exc)}", line, column) from None
    except RecursionError:
        raise ManifestError("not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    return documents


def read_text(source: Path | TextIO) -> str:
    """The text of a file (or of an open stream such as stdin), but never more than one character
    past what :func:`parse_nodes` takes, so that a huge file is refused without being read whole."""
    if isinstance(source, Path):
        with open(source, encoding="utf-8") as stream:
            return stream.read(MAX_SOURCE_CHARS + 1)
    return source.read(MAX_SOURCE_CHARS + 1)


def parse_documents(text: str, what: str = "a manifest") -> list[Any]:
    """The YAML documents in ``text``, refused (:class:`ManifestError`) as :func:`parse_nodes` says."""
    return [document for document, _ in parse_nodes(text, what)]


def _check_document(root: yaml.Node, what: str) -> None:
    """Size and alias expansion of one composed document, walked without recursion (post-order,
    each shared node counted once per use but visited once)."""
    line, column = root.start_mark.line + 1, root.start_mark.column + 1
    written = root.end_mark.index - root.start_mark.index
    if written > MAX_DOCUMENT_CHARS:
        raise ManifestError(f"document of {written} characters, more than {MAX_DOCUMENT_CHARS}", line, column)
    sizes: dict[int, int] = {}  # id(node) -> nodes it stands for, expanded
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        children = [n for item in node.value for n in (item if isinstance(item, tuple) else (item,))] \
            if isinstance(node, yaml.CollectionNode) else []
        if finished:
            on_path.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            continue
        if id(node) in sizes:
            continue
        if id(node) in on_path:
            raise ManifestError(f"not valid YAML for {what}: an alias refers to a node that contains it (a recursive "
                                "structure)", node.start_mark.line + 1, node.start_mark.column + 1)
        on_path.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children)
    added = sizes[id(root)] - len(sizes)
    if added > MAX_ALIAS_NODES:
        raise ManifestError(f"YAML aliases expand this document by {added} nodes, more than {MAX_ALIAS_NODES} "
                            "(a YAML bomb?); write the values out instead", line, column)
