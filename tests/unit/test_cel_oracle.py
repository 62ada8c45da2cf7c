"""Our CEL evaluator against cel-go with Kubernetes' environment (tests/support/celgo: the code
kube-apiserver v1.36 runs for a ValidatingAdmissionPolicy), expression by expression: the same
value, the same runtime error, or refused before evaluation where cel-go's parser or program
creation refuses it. The cluster tier compares with the real API server
(tests/cluster/test_cel_differential*.py); this runs the same library code in a second.

What only cel-go's type checker refuses (``1 == 1.0``, a wrong overload on literals) is lint's
business (the bundle's type check); here such a case may evaluate, and is reported, not judged.
"""
from __future__ import annotations

import base64
import math
import random
from pathlib import Path
from typing import Any

import pytest

from trainjob_admission.policies.cel.environment import (
    Budget, BudgetExceeded, CelCompileError, CelEvalError, compile_expression,
)
from trainjob_admission.policies.cel.values import (
    CelType, Duration, Optional, Timestamp, UInt, format_timestamp,
)
from tests.support import celgo, upstream

HERE = Path(__file__).parent
CORPUS = HERE / "cel_semantics.txt"
DATA = {
    "object": {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "llm-ft", "namespace": "team-a", "labels": {"team": "a", "kueue.x-k8s.io/queue-name": "q"},
                     "annotations": {"note": "héllo wörld", "empty": ""}, "creationTimestamp": "2024-05-01T10:20:30Z"},
        "spec": {"runtimeRef": {"name": "mpi-openmpi", "kind": "ClusterTrainingRuntime"},
                 "trainer": {"numNodes": 4, "numProcPerNode": 2, "image": "quay.io/acme-ml/train:4.1",
                             "command": ["mpirun", "python", "train.py"],
                             "env": [{"name": "HF_TOKEN", "value": "hf_x"}, {"name": "EPOCHS", "value": "3"},
                                     {"name": "LR", "value": "0.5"}],
                             "resourcesPerNode": {"limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "8Gi"},
                                                  "requests": {"cpu": "1500m", "memory": "8Gi"}}},
                 "suspend": False, "ratio": 0.25, "weights": [1.5, 2.5, 0.5], "empty": [], "nothing": None,
                 "big": 9223372036854775807, "neg": -3, "mixed": [1, 2.0, 3], "strings": ["b", "a", "c"],
                 "nested": [[1, 2], [3, [4, 5]]], "map": {"k": "v", "n": 1}},
    },
    "params": {"maxJobGpus": 16, "allowed": ["openmpi", "intel"], "prefix": "quay.io/", "ratio": 0.5,
               "limits": {"cpu": "4", "memory": "16Gi"}},
    "job": {"totals": {"gpus": 4, "cpu": 8000, "memory": 34359738368}, "numNodes": 4, "workers": 3,
            "images": ["quay.io/acme-ml/train:4.1"], "mpi": {"implementation": "OpenMPI"},
            "podSets": [{"name": "node", "count": 3, "gpus": 1}, {"name": "launcher", "count": 1, "gpus": 0}]},
    "request": {"operation": "CREATE", "namespace": "team-a", "userInfo": {"username": "alice", "groups": ["team-a"]}},
}


def tagged(value: Any) -> Any:
    """Our value as tests/support/celgo tags cel-go's."""
    kind = type(value)
    if value is None:
        return {"null": None}
    if kind is bool:
        return {"bool": value}
    if kind is UInt:
        return {"uint": str(int(value))}
    if kind is int:
        return {"int": str(value)}
    if kind is float:
        return {"double": value}
    if kind is str:
        return {"string": value}
    if kind is bytes:
        return {"bytes": base64.b64encode(value).decode()}
    if kind is Timestamp:
        return {"timestamp": format_timestamp(Timestamp(value.ns))}
    if kind is Duration:
        return {"duration": str(value.ns)}
    if kind is Optional:
        return {"optional": [tagged(value.value)] if value.present else None}
    if kind is CelType:
        return {"type": value.name}
    if isinstance(value, list):
        return {"list": [tagged(v) for v in value]}
    if isinstance(value, dict):
        return {"map": sorted(([tagged(k), tagged(v)] for k, v in value.items()), key=repr)}
    return {"other": value.cel_type.name}


def normal(tag: Any) -> Any:
    """cel-go's tagging made comparable: doubles as floats (NaN equal to NaN), maps unordered,
    library values by their type only."""
    if isinstance(tag, dict) and len(tag) >= 1:
        (key, value), *_ = tag.items()
        if key == "double":
            number = float(value.replace("+Inf", "inf").replace("-Inf", "-inf")) if isinstance(value, str) else value
            return ("double", "nan" if math.isnan(number) else number)
        if key == "list":
            return ("list", [normal(v) for v in value])
        if key == "map":
            return ("map", sorted(([normal(k), normal(v)] for k, v in value), key=repr))
        if key == "optional":
            return ("optional", None if value is None else normal(value[0]))
        if key == "other":
            return ("other", tag["other"])
        return (key, value)
    return tag


def ours(expression: str, data: dict) -> tuple:
    try:
        compiled = compile_expression(expression)
    except CelCompileError as exc:
        return ("compile_error", exc.message)
    try:
        return ("value", normal(tagged(compiled.evaluate(data, Budget()))))
    except BudgetExceeded as exc:
        return ("budget", str(exc))
    except CelEvalError as exc:
        return ("error", str(exc))


def theirs(result: dict) -> tuple:
    if "compile_error" in result:
        return ("compile_error", result["compile_error"], result["stage"])
    if "panic" in result:
        return ("panic", result["panic"])
    if "error" in result:
        return ("error", result["error"])
    return ("value", normal(result["value"]))


def corpus() -> list[str]:
    return [line.strip() for line in CORPUS.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def listed_exception(mine: tuple, go: tuple) -> bool:
    """docs/cel-conformance.md "Exceptions of ours": a list, map or optional as a map key is an
    error here where cel-go builds the map (fail-closed; where cel-go then refuses the expression
    for using that map as an index, we refuse it when it runs)."""
    return mine[0] == "error" and mine[1].startswith("unsupported key type") and go[0] in ("value", "compile_error")


def differences(expressions: list[str], data: dict = DATA) -> tuple[list[str], list[str]]:
    """(disagreements, cases only cel-go's type checker refuses and we evaluate)."""
    wrong, typed = [], []
    for expression, result in zip(expressions, celgo.evaluate([(e, data) for e in expressions])):
        mine, go = ours(expression, data), theirs(result)
        if listed_exception(mine, go):
            continue
        if go[0] == "compile_error":
            if mine[0] != "compile_error":
                (typed if go[2] == "check" else wrong).append(f"{expression}\n    cel-go: {go}\n    ours:   {mine}")
            continue
        if go[0] == "panic":
            if mine[0] not in ("error", "compile_error"):
                wrong.append(f"{expression}\n    cel-go panics ({go[1]}), ours: {mine}")
            continue
        if mine[0] != go[0] or (go[0] == "value" and mine[1] != go[1]):
            wrong.append(f"{expression}\n    cel-go: {go}\n    ours:   {mine}")
    return wrong, typed


@pytest.fixture(scope="module")
def oracle() -> None:
    try:
        celgo.binary()
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))


def test_the_corpus_agrees_with_cel_go(oracle) -> None:
    expressions = corpus()
    assert len(expressions) > 300
    wrong, _ = differences(expressions)
    assert not wrong, f"{len(wrong)} of {len(expressions)} disagree:\n" + "\n".join(wrong)


# --- generated expressions ---------------------------------------------------------------------

LITERALS = ["0", "1", "-1", "2", "7", "9223372036854775807", "-9223372036854775808", "1u", "0u",
            "18446744073709551615u", "1.5", "0.0", "-2.5", "1e300", "'a'", "''", "'ab'", '"b"', "r'\\d'", "b'ab'",
            "true", "false", "null", "[]", "{}", "[1, 2, 3]", "['a', 'b']", "{'a': 1}",
            "[1.0, 2.5]", "duration('1h')", "timestamp(0)", "optional.of(1)", "optional.none()"]
FIELDS = ["object", "object.a", "object.b", "object.n", "object.s", "object.l", "object.m", "object.m.a",
          "object.m.l", "object.f", "object.u", "params", "params.a", "params.l", "job.a.b.n", "object.?a",
          "object.?m.?a", "object.l[0]", "object.l[?9]"]
BINARY = ["+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "in"]
METHODS = ["contains", "startsWith", "endsWith", "matches", "lowerAscii", "upperAscii", "split", "join", "indexOf",
           "size", "charAt", "substring", "replace", "trim", "lastIndexOf", "orValue", "hasValue", "value", "sum",
           "min", "max", "isSorted", "reverse", "distinct", "sort", "flatten", "first", "last", "find", "findAll"]
# not lists.range: cel-go builds lists.range(9223372036854775807) before it counts the cost (VAP refuses a
# constant one when the policy is created, by its estimated cost; the corpus has small ones)
FUNCTIONS = ["size", "int", "uint", "double", "string", "bool", "type", "dyn", "bytes", "quantity", "isQuantity",
             "optional.of", "optional.ofNonZeroValue", "strings.quote"]
MACROS = ["all", "exists", "exists_one", "map", "filter"]
LISTS = ["object.l", "object.m.l", "params.l", "object.u", "[1, 2, 3]", "['a', 'b']", "[]", "[1.0, 2.5]"]
GENERATED_DATA = [
    {"object": {"a": 1, "b": "x", "n": -7, "s": "AbÄ/01", "l": [3, 1, 2], "m": {"a": 2, "l": ["b", "a"]},
                "f": 2.5, "u": [1, 2.0]}, "params": {"a": "a", "l": [1, "a", None]}, "job": {"a": {"b": {"n": 4}}}},
    {"object": {"a": "1", "b": None, "n": 9223372036854775807, "s": "", "l": [], "m": {}, "f": -0.0,
                "u": [[1], [2, [3]]]}, "params": {"a": 0.5, "l": []}, "job": {"a": {}}},
]


def generate(rng: random.Random, depth: int = 0, bound: tuple[str, ...] = ()) -> str:
    """A random expression over the constructs above (cel-go says which are well typed)."""
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(LITERALS + FIELDS + list(bound))
    choice = rng.randrange(10)
    inner = lambda: generate(rng, depth + 1, bound)  # noqa: E731
    if choice == 0:
        return f"({inner()} {rng.choice(BINARY)} {inner()})"
    if choice == 1:
        return f"{rng.choice(['!', '-'])}({inner()})"
    if choice == 2:
        return f"({inner()} ? {inner()} : {inner()})"
    if choice == 3:
        return f"has({rng.choice(['object.a', 'object.m.a', 'object.m.z', 'job.a.b', 'object.n.x'])})"
    if choice == 4:
        args = ", ".join(inner() for _ in range(rng.randrange(3)))
        return f"({inner()}).{rng.choice(METHODS)}({args})"
    if choice == 5:
        return f"{rng.choice(FUNCTIONS)}({inner()})"
    if choice == 6:
        return f"[{', '.join(inner() for _ in range(rng.randrange(4)))}]"
    if choice == 7:
        return f"({inner()})[{inner()}]"
    if choice == 8:  # over lists only: cel-go iterates a map in no fixed order
        variable = "x" if "x" not in bound else "y"
        body = generate(rng, depth + 1, (*bound, variable))
        return f"({rng.choice(LISTS)}).{rng.choice(MACROS)}({variable}, {body})"
    return f"{{{inner()}: {inner()}}}"


def test_generated_expressions_agree_with_cel_go(oracle) -> None:
    """Random expressions (fixed seeds): what cel-go evaluates, we evaluate to the same value or an
    error; what its parser or program creation refuses, we refuse."""
    rng = random.Random(27)
    expressions = sorted({generate(rng) for _ in range(3000)})
    wrong = []
    for data in GENERATED_DATA:
        found, _ = differences(expressions, data)
        wrong += found
    assert not wrong, f"{len(wrong)} disagree:\n" + "\n".join(wrong[:40])


def sort_cases() -> list[str]:
    """sortBy over lists with many equal keys, in the shapes that take each path of Go's pdqsort:
    short (insertion sort), sorted and reversed runs (partial insertion sort, reversal), few distinct
    keys (equal partitions), shuffled (ninther pivots, pattern breaking)."""
    rng = random.Random(2027)
    shapes = {
        "shuffled": lambda n: [rng.randrange(max(1, n // 4)) for _ in range(n)],
        "few keys": lambda n: [rng.randrange(3) for _ in range(n)],
        "ascending": lambda n: sorted(rng.randrange(n) for _ in range(n)),
        "descending": lambda n: sorted((rng.randrange(n) for _ in range(n)), reverse=True),
        "organ pipe": lambda n: [min(i, n - i) // 2 for i in range(n)],
        "one swap": lambda n: [i // 3 for i in range(n)][::-1][:2] + [i // 3 for i in range(n)][2:],
    }
    expressions = []
    for n in (5, 12, 13, 20, 49, 50, 64, 100, 257):
        for make in shapes.values():
            pairs = ", ".join(f"[{key}, {i}]" for i, key in enumerate(make(n)))
            expressions.append(f"[{pairs}].sortBy(p, p[0]).map(p, p[1])")
    return expressions


def test_sort_orders_equal_keys_as_go_does(oracle) -> None:
    """cel-go sorts with Go's sort.Slice, which is not stable: equal keys end where pdqsort puts them."""
    expressions = sort_cases()
    wrong, _ = differences(expressions)
    assert not wrong, f"{len(wrong)} of {len(expressions)} disagree:\n" + "\n".join(wrong[:3])
