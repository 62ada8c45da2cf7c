"""Kubeflow Trainer v2.3.0's own webhook test tables, replayed through the engine `review` uses
(policies/job/trainerwebhook.py mirrors the checks). The tables are Go structs, so each case is
transcribed into tests/unit/fixtures/trainer-webhook-cases.yaml naming its Go test; the case
names themselves are read from the _test.go files in the Go module cache at test time, so a case
upstream adds (or one transcribed under a wrong name) fails here until it is replayed or skipped
with a reason."""
from __future__ import annotations

import re

import pytest

from trainjob_admission.policies.bundle.compile import compile_document
from trainjob_admission.policies.bundle.schema import API_VERSION, KIND
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.k8s.clusterstate import ClusterState
from trainjob_admission.policies.k8s.fieldvalidation import Schemas
from tests.support import trainercases, upstream

TABLES = {  # the _test.go (under pkg/) and the test functions whose tables are the webhooks' checks
    "webhooks/trainjob_webhook_test.go": ("TestDefault", "TestValidateCreate"),
    "webhooks/trainingruntime_webhook_test.go": ("TestValidateReplicatedJobs",),
    "webhooks/clustertrainingruntime_webhook_test.go": ("TestClusterTrainingRuntimeValidateCreate",),
    "runtime/framework/core/framework_test.go": ("TestRunCustomValidationPlugins",),
    "runtime/framework/plugins/jobset/jobset_test.go": ("TestValidate",),
    "runtime/framework/plugins/mpi/mpi_test.go": ("TestValidate",),
    "runtime/framework/plugins/torch/torch_test.go": ("TestTorchValidate",),
    "runtime/framework/plugins/xgboost/xgboost_test.go": ("TestXGBoostValidate",),
    "runtime/framework/plugins/flux/flux_test.go": ("TestValidate",),
    "runtime/framework/plugins/volcano/volcano_test.go": ("TestValidate",),
}
CASE_NAME = re.compile(r'^\t\t"(.+)": \{', re.M)


def upstream_cases() -> set[tuple[str, str]]:
    """(file, FUNCTION/case) of every case of the tables, read from the module cache."""
    try:
        root = upstream.module_dir("trainer") / "pkg"
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))
    found = set()
    for file, functions in TABLES.items():
        text = (root / file).read_text()
        for function in functions:
            body = text.split(f"\nfunc {function}(", 1)[1].split("\nfunc ", 1)[0]
            found |= {(file, f"{function}/{name.strip()}") for name in CASE_NAME.findall(body)}
    return found


def test_every_upstream_case_is_replayed_or_skipped_with_a_reason():
    replayed = {(c["file"], c["test"]) for c in trainercases.cases()}
    skipped = {(s["file"], s["test"]) for s in trainercases.fixtures()["skipped"] if s.get("why")}
    wildcards = {(f, t[:-1]) for f, t in skipped if t.endswith("/*")}
    wanted = {(f, t) for f, t in upstream_cases() if not any(f == wf and t.startswith(wt) for wf, wt in wildcards)}
    assert wanted - replayed - skipped == set(), "upstream cases neither replayed nor skipped"
    assert replayed - upstream_cases() == set(), "transcribed cases upstream does not have (renamed?)"
    assert len(replayed) >= 70 and not replayed & skipped



def _decision(case: dict):
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
    state = ClusterState.from_objects([trainercases.runtime(case), namespace, *trainercases.priority_classes(case)])
    old = trainercases.trainjob(case, case["old"]) if "old" in case else None
    request = AdmissionInput(trainercases.trainjob(case, case.get("job") or {}), operation="UPDATE" if old else "CREATE",
                             old_object=old)
    bundle = compile_document({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "replay"}, "spec": {}},
                              "<replay>")
    return evaluate(request, [bundle], state, schemas=Schemas.builtin())


@pytest.mark.parametrize("case", trainercases.cases(), ids=lambda c: c["test"])
def test_trainers_own_webhook_cases_decide_as_trainer(case):
    decision = _decision(case)
    messages = " | ".join(m["message"] for m in decision.messages)
    assert decision.allowed is (case["expect"] == "allow"), f"{case['file']} {case['test']}: {messages or 'allowed'}"
    if "trainer" in case:  # the real Trainer decides otherwise (the cluster tier holds it): say why we do not follow
        assert case["trainer"] != case["expect"] and len(case.get("because", "")) > 40, case
    if "message" in case:
        assert case["message"] in messages, messages
    if "warning" in case:
        assert any(case["warning"] in w for w in decision.warnings), decision.warnings
    else:
        assert not any("deprecated" in w for w in decision.warnings), decision.warnings
