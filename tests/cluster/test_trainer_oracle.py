"""The transcription of Trainer's webhook test tables (tests/unit/fixtures/trainer-webhook-cases.yaml),
judged by the real Trainer v2.3.0 and kube-apiserver of the test control plane: each CREATE case's
runtime is created and its TrainJob submitted with --dry-run=server, so Trainer's own webhooks (and
the API server's schema validation) decide; the verdict must be the one the case expects, which
the unit tier requires of the engine, or, where the fixture records that the real Trainer decides
otherwise (`trainer`, with `because`), that one: so a Trainer release that changes either way
shows here. A case whose runtime is refused is a refusal, with the runtime's error."""
from __future__ import annotations

import json

import pytest

from tests.support import trainercases

pytestmark = pytest.mark.cluster

CREATES = [c for c in trainercases.cases() if "old" not in c]
CLUSTER_SCOPED = ("TestValidateCreate/deprecated runtime referenced", "TestClusterTrainingRuntimeValidateCreate/support=deprecated")


def _apply(kubectl, obj: dict, *extra: str):
    return kubectl("create", "-f", "-", *extra, input=json.dumps(obj), check=False)


def test_trainer_decides_each_transcribed_case_as_the_case_says(control_plane, kubectl, namespace):
    disagreements = []
    for case in CREATES:
        kind = "ClusterTrainingRuntime" if case["test"] in CLUSTER_SCOPED else "TrainingRuntime"
        created = []
        try:
            for pc in trainercases.priority_classes(case):
                if _apply(kubectl, pc).returncode == 0:
                    created.append(("priorityclass", pc["metadata"]["name"], None))
            runtime = trainercases.runtime(case, kind, None if kind == "ClusterTrainingRuntime" else namespace)
            unsupported = case["test"] == "TestValidateCreate/unsupported runtime"  # its runtime must not exist
            runtime_answer = None if unsupported else _apply(kubectl, runtime)
            made = runtime_answer is None or runtime_answer.returncode == 0
            if made and not unsupported:
                created.append((kind.lower(), runtime["metadata"]["name"], runtime["metadata"].get("namespace")))
            job = trainercases.trainjob(case, case.get("job") or {}, kind, namespace)
            answer = _apply(kubectl, job, "--dry-run=server") if made else None
            allowed = answer is not None and answer.returncode == 0
            shown = answer or runtime_answer
            said = f"{shown.stdout.strip()} {shown.stderr.strip()}" if answer else f"its runtime was refused: {shown.stderr}"
            if allowed is not (case.get("trainer", case["expect"]) == "allow"):
                disagreements.append(f"{case['test']}: Trainer {'admitted' if allowed else 'refused'} it: {said}")
            elif "warning" in case and case["warning"] not in said:
                disagreements.append(f"{case['test']}: no warning {case['warning']!r} in {said!r}")
        finally:
            for resource, name, ns in reversed(created):
                kubectl("delete", resource, name, *(["-n", ns] if ns else []), "--wait=false", check=False)
    assert not disagreements, f"{len(disagreements)} of {len(CREATES)}:\n" + "\n".join(disagreements)


def test_the_api_server_refuses_the_unknown_fields_review_names(control_plane, kubectl, namespace):
    """The corpus' typo'd jobs: the API server (kubectl's default --validate=strict) names the same
    unknown fields as review's field validation, which adds the name meant."""
    from trainjob_admission.policies.k8s.fieldvalidation import Schemas, problems
    from tests.support import corpus

    typos = [c for c in corpus.cases() if c.id.startswith("shape-typo-") and c.scenario == "team"]
    assert len(typos) >= 2
    for case in typos:
        job = case.job()
        job["metadata"]["namespace"] = namespace
        ours = [message.split(" (did you mean")[0] for message, _ in problems(job, Schemas.builtin())]
        answer = _apply(kubectl, job, "--dry-run=server")
        assert answer.returncode != 0 and "strict decoding error" in answer.stderr, answer.stderr
        assert ours and all(field in answer.stderr for field in ours), (ours, answer.stderr)
