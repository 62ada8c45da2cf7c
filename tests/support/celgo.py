"""cel-go as kube-apiserver v1.36 runs it for a ValidatingAdmissionPolicy: the oracle the unit tier
compares our CEL evaluator with (tests/support/celgo/main.go, built from the Go module cache).

    results = evaluate([("object.spec.x == 4.0", {"object": {...}}), ...])
    # each {"compile_error": str} | {"type": str, "value": tagged} | {"type": str, "error": str}
    functions()   # [(name, overload id, member?, (arg types...), result type)]

The binary is built once per source (keyed by its hash) into the user's cache; without Go,
:class:`upstream.UpstreamMissing` says so and the tests skip. The cluster tier compares with the
real kube-apiserver (tests/cluster/test_cel_differential*.py); this oracle runs the same cel-go
and Kubernetes library code in milliseconds, without a control plane.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import resource
import subprocess
from pathlib import Path
from typing import Any, Iterable

from .service import cluster
from .upstream import UpstreamMissing

SOURCE = Path(__file__).with_name("celgo")
BUILD_TIMEOUT = 900  # a cold build compiles cel-go and the apiserver's CEL packages: about 70 s here
MEMORY = 4 << 30  # the oracle's address space: cel-go builds some values before it counts their cost


@functools.cache
def binary() -> Path:
    """The oracle's executable, built when its source changed."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainjob-admission"
    target = cache / f"celgo-{digest.hexdigest()[:16]}"
    if target.is_file():
        return target
    go = cluster.find_go()
    if go is None:
        raise UpstreamMissing("the cel-go oracle needs Go (none found)")
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}")
    result = subprocess.run([go, "build", "-o", str(partial), "."], cwd=SOURCE, env=cluster.go_env(go),
                            capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if result.returncode != 0:
        raise UpstreamMissing(f"building the cel-go oracle failed: {result.stderr[-2000:]}")
    partial.replace(target)
    return target


def evaluate(cases: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """What cel-go gives for each (expression, variables) case, in order."""
    lines = "".join(json.dumps({"expr": expr, "vars": variables}) + "\n" for expr, variables in cases)
    result = subprocess.run([str(binary())], input=lines, capture_output=True, text=True, timeout=600, check=True,
                            preexec_fn=_limit_memory)
    return [json.loads(line) for line in result.stdout.splitlines()]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


@functools.cache
def functions() -> list[tuple[str, str, bool, tuple[str, ...], str]]:
    """Every function overload of the environment (macros as ("macro", name, receiver?, (args,), ""))."""
    result = subprocess.run([str(binary()), "functions"], capture_output=True, text=True, timeout=60, check=True)
    rows = []
    for line in result.stdout.splitlines():
        cells = line.split("\t")
        if cells[0] == "macro":
            rows.append(("macro", cells[1], cells[3] == "true", (cells[2],), ""))
        else:
            rows.append((cells[0], cells[1], cells[2] == "true", _types(cells[3]), cells[4]))
    return rows


def _types(text: str) -> tuple[str, ...]:
    """``map(K, V), K`` -> ("map(K, V)", "K"): commas inside parentheses belong to the type."""
    found, depth, start = [], 0, 0
    for i, c in enumerate(text + ","):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == "," and depth == 0:
            if text[start:i].strip():
                found.append(text[start:i].strip())
            start = i + 1
    return tuple(found)
