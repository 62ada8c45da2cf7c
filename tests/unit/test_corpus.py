"""The real-world job corpus (tests/unit/corpus/corpus.yaml) under the shipped default bundle:
every job in every namespace scenario decided as Kubernetes, Trainer, JobSet and mpi-operator
would have it, through the engine `review` and the webhook use (with the API server's strict
field validation first, as `review` runs it); and docs/corpus.md current."""
from __future__ import annotations

import dataclasses
import json

import pytest

from trainjob_admission.policies.bundle.load import default_bundles
from trainjob_admission.policies.bundle.schema import Mutations
from trainjob_admission.policies.decide import mutations
from trainjob_admission.policies.decide.decision import Effect
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.job import effective_job
from trainjob_admission.policies.k8s.fieldvalidation import Schemas
from trainjob_admission.policies.k8s.quantity import DEFAULT_ACCELERATORS
from tests.support import corpus, upstream

CASES = corpus.cases()
DOCS = corpus.CORPUS.parents[2] / "docs" / "corpus.md"


@pytest.fixture(scope="module")
def bundles():
    return default_bundles()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.id}-{c.scenario}" for c in CASES])
def test_corpus_decision(case: corpus.Case, bundles) -> None:
    try:
        job, state = case.job(), case.state()
    except upstream.UpstreamMissing as exc:
        pytest.skip(f"upstream source not available: {exc}")
    decision = evaluate(AdmissionInput(job), bundles, state, report_unchecked=True, schemas=Schemas.builtin())
    denying = {r.rule for r in decision.results if r.effect is Effect.DENY}
    assert case.expect.matches(decision.allowed, denying), (
        f"{case.describe()}\n"
        f"  expected: {case.expect.verdict}: {case.expect.why}\n"
        f"  actual:   {'allow' if decision.allowed else 'deny ' + ', '.join(sorted(denying))}\n"
        + "".join(f"  [{m['rule']}] {m['message']}\n" for m in decision.messages)
        + "".join(f"  warning: {w}\n" for w in decision.warnings)
        + "".join(f"  not checked: {u['check']} ({u['reason']})\n" for u in decision.unchecked))


def test_corpus_covers_every_scenario_and_source_kind() -> None:
    """Each job has an expectation for each scenario, and the corpus holds what issue 11 asks for."""
    doc = corpus.manifest()
    for entry in doc["jobs"]:
        assert set(entry["expect"]) == set(doc["scenarios"]), entry["id"]
    ids = [entry["id"] for entry in doc["jobs"]]
    assert len(ids) == len(set(ids)) >= 50
    modules = {entry["source"].get("module") for entry in doc["jobs"]}
    assert {"trainer", "mpi-operator"} <= modules
    assert any(entry["id"].startswith("sdk-") for entry in doc["jobs"])
    assert any(entry["id"].startswith("odh-") for entry in doc["jobs"])


def test_docs_table_is_current() -> None:
    """docs/corpus.md lists exactly the manifest's jobs and expectations (regenerate: see corpus.py)."""
    try:
        expected = corpus.table()
    except upstream.UpstreamMissing as exc:
        pytest.skip(f"upstream source not available: {exc}")
    assert DOCS.read_text() == expected, "docs/corpus.md is stale: .venv/bin/python -m tests.support.corpus > docs/corpus.md"


@pytest.mark.parametrize("text, allowed, denying, ok", [
    ("allow: fine", True, set(), True),
    ("allow: fine", False, {"quota"}, False),
    ("deny quota: over", False, {"quota"}, True),
    ("deny quota: over", False, {"quota", "pod-security"}, False),
    ("deny quota,pod-security: both", False, {"pod-security", "quota"}, True),
    ("deny job-model|limit-range: either", False, {"limit-range"}, True),
    ("deny job-model|limit-range,pod-security: either and one", False, {"job-model", "pod-security"}, True),
    ("deny job-model|limit-range,pod-security: either and one", False, {"job-model", "limit-range"}, False),
    ("deny job-model,?pod-security: may stop there", False, {"job-model"}, True),
    ("deny job-model,?pod-security: or go on", False, {"job-model", "pod-security"}, True),
    ("deny job-model,?pod-security: nothing else", False, {"job-model", "quota"}, False),
])
def test_expectation_matching(text: str, allowed: bool, denying: set[str], ok: bool) -> None:
    assert corpus.Expectation.parse(text).matches(allowed, denying) is ok


@pytest.mark.parametrize("text", ["allowed: x", "deny: no rule", "allow quota: x", "deny quota", "deny ?quota: optional only"])
def test_expectation_grammar_is_enforced(text: str) -> None:
    with pytest.raises(ValueError):
        corpus.Expectation.parse(text)


def test_the_mutated_job_without_a_rebuild_is_the_rebuilt_one() -> None:
    """The engine merges its own runtimePatch into the pods it already built
    (mutations.mutated_job) instead of building the mutated TrainJob again; on every real
    TrainJob, with every mutation on, that must be exactly what a build of the mutated object gives."""
    settings = Mutations.model_validate({"securityDefaults": {"enabled": True}, "istio": {"disableSidecar": True},
                                         "scheduling": {"queueLabel": "kueue.x-k8s.io/queue-name",
                                                        "defaultQueue": "default"},
                                         "costLabels": {"fromNamespaceLabels": ["cost-center"]},
                                         "nodeTargeting": {"accelerators": [{
                                             "resources": list(DEFAULT_ACCELERATORS),
                                             "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                                             "matchExpressions": [{"key": "gpu.present", "operator": "In", "values": ["true"]}],
                                             "productLabel": "gpu.product"}]}})
    compared, targeted = [], []
    for case in (c for c in CASES if c.scenario == "team"):
        try:
            job, state = case.job(), case.state()
            job.setdefault("metadata", {}).setdefault("annotations", {})[settings.nodeTargeting.productAnnotation] = "A100"
            planned_on = effective_job.build(job, state)
        except upstream.UpstreamMissing as exc:
            pytest.skip(f"upstream source not available: {exc}")
        except effective_job.JobModelError:
            continue  # a job-model denial: nothing is mutated
        _, mutated = mutations.plan(job, planned_on, settings, state.namespace(job["metadata"]["namespace"]))
        fast = mutations.mutated_job(planned_on, mutated)
        if fast is None:
            continue  # an MPIJob: its mutated templates are built again
        rebuilt = effective_job.build(mutated, state)
        assert fast.labels == rebuilt.labels, case.id
        assert [dataclasses.asdict(ps) for ps in fast.pod_sets] == [dataclasses.asdict(ps) for ps in rebuilt.pod_sets], case.id
        compared.append(case.id)
        targeted += [case.id] if any("tolerations" in json.dumps(p) for p in mutated["spec"]["runtimePatches"]
                                     if p.get("manager") == mutations.MANAGER) else []
    assert len(compared) >= 40, compared
    assert 5 <= len(targeted) < len(compared), targeted  # GPU jobs got tolerations and affinity, others none
