"""Type-checking at lint (policies/cel/checker.py, policies/bundle/typecheck.py): what the API
server refuses when a ValidatingAdmissionPolicy is created, or its type checking warns about
against the CRD schema, never loads in a bundle; the declared types follow upstream (the CRD
schemas from the Go module cache; the function registry's signatures are held to cel-go's by
tests/unit/test_cel_library.py) and our own model (``job``). The cluster tier
(tests/cluster/test_cel_differential.py) holds the same verdicts to the real API server.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.bundle.compile import BundleError, compile_document
from trainjob_admission.policies.bundle.load import load_bundles
from trainjob_admission.policies.cel import checker
from trainjob_admission.policies.cel.environment import VARIABLES, CelCompileError, compile_expression
from trainjob_admission.policies.cel.types import DYN, Type, format_type
from trainjob_admission.policies.job import effective_job
from trainjob_admission.policies.job.celtype import job_type
from tests.support import celcorpus, celgo, corpus, crdtypes, upstream
from tests.unit.test_cel_oracle import corpus as oracle_corpus

ROOT = Path(__file__).resolve().parents[2]


def bundle(*rules: str, variables: tuple = (), kinds: list | None = None, params: dict | None = None,
           messages: dict | None = None) -> dict:
    spec: dict = {"validations": [{"name": f"r{i}", "expression": e, "message": "m"} for i, e in enumerate(rules)]}
    for i, text in (messages or {}).items():
        spec["validations"][i]["messageExpression"] = text
    if variables:
        spec["variables"] = [{"name": n, "expression": e} for n, e in variables]
    if kinds:
        spec["match"] = {"kinds": kinds}
    if params is not None:
        spec["params"] = params
    return {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
            "metadata": {"name": "typed"}, "spec": spec}


def problems(document: dict) -> list[str]:
    try:
        compile_document(document, "typed.yaml")
    except BundleError as exc:
        return [str(p) for p in exc.problems]
    return []


@pytest.mark.parametrize("rule, expected", [
    ("job.totals.gpu <= 8", "undefined field 'gpu' (did you mean 'gpus'? job.totals has: "),
    ("1 == 1.0", "found no matching overload for '_==_' applied to '(int, double)' (numbers of different types"),
    ("job.totals.gpus", "must evaluate to bool but got int"),
    ("object.spec.trainer.numNodes", "must evaluate to bool but got dyn"),
    ("'abc'.startsWith(1)", "found no matching overload for 'startsWith' applied to 'string.(int)'"),
    ("quantity('1').isLessThan(2)", "found no matching overload for 'isLessThan' applied to 'kubernetes.Quantity.(int)'"),
    ("[1, 'a'].size() == 2", "expected type 'int' but found 'string'"),
    ("object.spec.trainer.numNode <= 8", "undefined field 'numNode' (did you mean 'numNodes'?"),
    ("object.spec.trainer.numNodes == 4.0", "applied to '(int, double)'"),
    ("job.numNodes == '4'", "applied to '(int, string)'"),
    ("request.userInfo.name == 'x'", "undefined field 'name'"),
    ("namespaceObject.metadata.uid != ''", "undefined field 'uid'"),
    ("'%d'.format([object.metadata.name]) == ''", "decimal clause can only be used on integers, was given string"),
    ("object.spec.trainer.env.map(e, e.name).sum() == ''", "found no matching overload for 'sum' applied to 'list(string).()'"),
    ("[object.metadata.name, 1].size() == 2", "expected type 'string' but found 'int'"),
    ("object.spec.trainer.env.exists(e, e.value)", "expected type 'bool' but found 'string'"),
    ("job.podSets.filter(p, p.count).size() == 1", "found no matching overload for '_?_:_' applied to '(int, "),
    ("object.spec.trainer.numNodes.x == 1", "type 'int' does not support field selection"),
    ("object.spec.trainer.image.all(c, c == 'a')", "expression of type 'string' cannot be range of a comprehension"),
    # sortBy is range.@sortByAssociatedKeys(keys): keys of a type with no ordering are refused, and the
    # result keeps the range's element type
    ("[[1], [2]].sortBy(x, x).size() == 2",
     "found no matching overload for '@sortByAssociatedKeys' applied to 'list(list(int)).(list(list(int)))'"),
    ("object.spec.trainer.env.sortBy(e, e).size() == 1", "found no matching overload for '@sortByAssociatedKeys'"),
    ("object.spec.trainer.env.sortBy(e, e.name)[0].nme == 'A'", "undefined field 'nme' (did you mean 'name'?"),
])
def test_what_the_api_server_refuses_never_loads(rule, expected):
    found = problems(bundle("true", rule))
    assert len(found) == 1 and expected in found[0], found
    assert re.match(r"typed\.yaml: bundle typed: rule r1: expression: ", found[0]), found


def test_a_type_error_is_located_at_its_file_line_and_column(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(bundle("job.totals.gpus <= 8", "job.totals.gpu <= 8"), sort_keys=False))
    with pytest.raises(BundleError) as caught:
        load_bundles([str(path)])
    (problem,) = caught.value.problems
    line = path.read_text().splitlines()[problem.line - 1]
    assert line[problem.column - 1:].startswith("gpu <= 8"), (problem, line)
    assert problem.rule == "r1"


@pytest.mark.parametrize("rule", [
    "job.totals.gpus <= 8",
    "object.spec.trainer.numNodes < 4.5",  # int < double: cel-go's cross-type comparison
    "object.spec.trainer.numNodes == 4",
    "dyn(object.spec.trainer.numNodes) == 4.0",
    "object.spec.trainer.env.exists(e, e.name == 'HF_TOKEN')",
    "object.spec.mpiReplicaSpecs.Worker.replicas <= 8",  # an MPIJob field: fine in a bundle that matches MPIJobs
    "!has(object.spec.trainer.numProcPerNode) || object.spec.trainer.numProcPerNode <= 8",
    "timestamp(object.metadata.creationTimestamp) > timestamp('2024-01-01T00:00:00Z')",
    "type(job.numNodes) == int",
    "job.podSets.all(p, p.pod.spec.containers.all(c, c.image.startsWith('quay.io/')))",
    "job.launcher == null || job.launcher.count == 1",
    "request.userInfo.groups.exists(g, g == 'admins') && request.operation == 'CREATE'",
    "namespaceObject.metadata.labels['team'] == object.metadata.labels['team']",
    "sets.contains(['a', 'b'], job.images)",
    "object.spec.trainer.resourcesPerNode.limits.all(k, v, isQuantity(v))",
    "optional.of(1).orValue(2) == 1",
    "object.spec.trainer.env.sortBy(e, e.name)[0].name == 'A'",
    "[2, 1].sortBy(x, -x)[0] == 2",
])
def test_what_the_api_server_accepts_loads(rule):
    assert problems(bundle(rule)) == []


def test_an_error_counts_only_when_it_holds_for_every_kind_the_bundle_matches():
    trainjob_only = "object.spec.trainer.numNodes <= 8"
    assert problems(bundle(trainjob_only)) == []
    assert problems(bundle(trainjob_only, kinds=["TrainJob"])) == []
    (found,) = problems(bundle(trainjob_only, kinds=["MPIJob"]))
    assert "undefined field 'trainer'" in found


def test_variables_params_and_messages_are_typed():
    assert problems(bundle("variables.gpus <= 8", variables=[("gpus", "job.totals.gpus")])) == []
    (found,) = problems(bundle("variables.gpus == '8'", variables=[("gpus", "job.totals.gpus")]))
    assert "applied to '(int, string)'" in found
    assert problems(bundle("params.maxGpus >= 1.5", params={"maxGpus": 8})) == []  # int >= double: cross-type
    (found,) = problems(bundle("params.maxGpus == 1.5", params={"maxGpus": 8}))
    assert "applied to '(int, double)'" in found
    assert problems(bundle("params.maxGpus >= job.totals.gpus", params={"maxGpus": 8})) == []
    (found,) = problems(bundle("false", messages={0: "'GPUs: ' + job.totals.gpus"}))
    assert "messageExpression: found no matching overload for '_+_' applied to '(string, int)'" in found
    (found,) = problems(bundle("false", messages={0: "job.totals.gpus"}))
    assert "messageExpression: must evaluate to string but got int" in found


def test_the_bundles_we_ship_and_document_load():
    paths = [ROOT / "policies/bundle/builtin", ROOT / "examples/bundles"]
    assert load_bundles([str(p) for p in paths if p.exists()])


# --- the declared types follow upstream --------------------------------------------------------

def _module(key: str) -> Path:
    try:
        return upstream.module_dir(key)
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))


def test_the_crd_schema_table_is_generated_from_the_module_cache():
    _module("trainer")
    assert (ROOT / "policies/k8s/crdschemas.json").read_text() == crdtypes.text(), (
        "regenerate: .venv/bin/python -m tests.support.crdtypes > policies/k8s/crdschemas.json")


def test_the_checker_refuses_what_cel_gos_checker_refuses_and_types_alike():
    """cel-go's own checker (tests/support/celgo, every variable dyn) on the unit oracle's corpus and
    the differential's: what it refuses when checking, the checker refuses (what cel-go refuses
    without types, the compiler does), and the output types agree."""
    texts = [t for t in dict.fromkeys(oracle_corpus() + [t for c in celcorpus.cases()
                                                         for t in (c.expression, c.message_expression) if t])
             if "authorizer" not in t]  # the oracle declares no authorizer
    try:
        results = celgo.evaluate([(text, {}) for text in texts])
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))
    dynamic = checker.Environment({name: DYN for name in VARIABLES})
    differ, checked = [], 0
    for text, theirs in zip(texts, results):
        try:
            tree = compile_expression(text).tree
        except CelCompileError:
            continue  # refused before types (test_cel_oracle.py judges those)
        found, checked = checker.check(tree, dynamic), checked + 1
        if (theirs.get("stage") == "check") != bool(found.issues):
            differ.append((text, theirs.get("compile_error"), [i.message for i in found.issues]))
        elif "type" in theirs and theirs["type"] != format_type(found.type):
            differ.append((text, theirs["type"], format_type(found.type)))
    assert checked > 1000 and not differ, differ[:20]


# --- job: the declared type follows the model ----------------------------------------------------

def _conforms(value, t: Type, path: str) -> list[str]:
    """Where ``value`` (as_cel's plain JSON) is not of type ``t``."""
    if value is None:
        return [] if t.kind in ("struct", "null_type", "dyn", "opaque") else [f"{path}: null, declared {format_type(t)}"]
    if t.kind == "dyn":
        return []
    if t.kind == "struct":
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, declared {format_type(t)}"]
        found = [f"{path}.{k}: not declared" for k in value if k not in (t.fields or {})]
        for name, sub in (t.fields or {}).items():
            if name in value:
                found += _conforms(value[name], sub, f"{path}.{name}")
        return found
    if t.kind == "map":
        return [] if isinstance(value, dict) and all(not _conforms(v, t.params[1], path) for v in value.values()) else [
            f"{path}: not a {format_type(t)}"]
    if t.kind == "list":
        return [] if isinstance(value, list) else [f"{path}: not a list"]
    python = {"int": int, "string": str, "bool": bool, "double": float}[t.kind]
    ok = isinstance(value, python) and (t.kind == "bool" or not isinstance(value, bool))
    return [] if ok else [f"{path}: {value!r} is not {t.kind}"]


def test_the_job_type_declares_every_field_of_the_effective_job_with_its_type():
    seen = set()
    for case in corpus.cases():
        if case.id in seen:
            continue
        seen.add(case.id)
        try:
            job = effective_job.build(case.job(), case.state())
        except effective_job.JobModelError:
            continue
        value = job.as_cel()
        value["podSets"] = value["podSets"][:1]  # each pod set has the same shape
        assert not _conforms({k: v for k, v in value.items() if k not in ("launcher", "worker")}, job_type(), "job")
        for pod_set in job.pod_sets:
            found = _conforms({k: v for k, v in pod_set.as_cel().items() if k != "pod"},
                              job_type().fields["worker"], f"{case.id} podSet")
            assert not found, found
    assert set(job_type().fields) == set(job.as_cel())
