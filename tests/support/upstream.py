"""Upstream files read where they are, in the Go module cache, never copied into this repository.

A source names one object: ``{"module": KEY, "path": P}`` (KEY as in hack/cluster/cluster.py
MODULES, e.g. ``trainer``; ``"stack": "oldest"`` for the oldest stack's version of it, e.g. Trainer
v2.2.0 or Kueue v0.14.0), with ``document: N`` for the Nth object of a multi-document YAML file
or ``block: N`` for the Nth fenced yaml block of a Markdown page; or ``{"file": P}``, a file of
ours (relative to the directory the caller passes), whose ``source:`` comment names what it follows.

    objects(source, here)   # the objects the source names (one, or every document of a file)
    version("trainer")      # "github.com/kubeflow/trainer/v2@v2.3.0"
    version("trainer", "oldest")  # "github.com/kubeflow/trainer/v2@v2.2.0"

The modules come from the Go module cache (``go mod download`` fetches one that is missing);
without Go and without the module, :class:`UpstreamMissing` says which, so a test can skip.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml

from .service import cluster  # hack/cluster/cluster.py: the pinned versions and module_dir()

YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.S | re.M)


class UpstreamMissing(RuntimeError):
    """A pinned module that is neither in the module cache nor downloadable here."""


def version(key: str, stack: str = "newest") -> str:
    return f"{cluster.MODULES[key]}@{cluster.stack_versions(stack)[key]}"


@functools.cache
def module_dir(key: str, stack: str = "newest") -> Path:
    try:
        return cluster.module_dir(key, stack)
    except (RuntimeError, OSError, ValueError) as exc:
        raise UpstreamMissing(f"{version(key, stack)}: {exc}") from exc


def _documents(text: str, markdown: bool) -> list[list[dict]]:
    """Each YAML document (or, in Markdown, each yaml block: a list of its documents)."""
    if markdown:
        return [[d for d in yaml.safe_load_all(block) if d] for block in YAML_BLOCK.findall(text)]
    return [[d] for d in yaml.safe_load_all(text) if d]


def objects(source: dict, here: Path) -> list[dict]:
    """The objects ``source`` names, fresh copies each call."""
    if "file" in source:
        path = here / source["file"]
        markdown = False
    else:
        path = module_dir(source["module"], source.get("stack", "newest")) / source["path"]
        markdown = path.suffix == ".md"
    docs = _documents(path.read_text(), markdown)
    for key in ("document", "block"):
        if key in source:
            index = source[key]
            if index >= len(docs):
                raise LookupError(f"{describe(source)}: the file has {len(docs)} {key}s")
            return list(docs[index])
    return [obj for doc in docs for obj in doc]


def describe(source: dict) -> str:
    """One line naming the source, e.g. ``github.com/kubeflow/trainer/v2@v2.3.0 examples/yaml/05-multi-step.yaml#1``."""
    if "file" in source:
        return source["file"]
    where = f"{version(source['module'], source.get('stack', 'newest'))} {source['path']}"
    if "document" in source:
        where += f" document {source['document']}"
    if "block" in source:
        where += f" yaml block {source['block']}"
    return where
