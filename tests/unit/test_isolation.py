"""The NetworkPolicies of network isolation as rendered (policies/decide/injections.py,
webhook/inject/isolation.py), and the guard that lets the service write exactly those names."""
from __future__ import annotations

from pathlib import Path

import yaml

from trainjob_admission.policies.bundle.schema import NetworkPolicyInjection
from trainjob_admission.policies.decide import injections
from trainjob_admission.policies.job.effective_job import EffectiveJob
from trainjob_admission.webhook.inject.isolation import job_policy

GUARD = Path(__file__).resolve().parents[2] / "manifests" / "base" / "guard.yaml"


def job(kind: str = "TrainJob") -> EffectiveJob:
    return EffectiveJob(kind=kind, name="bert", namespace="team-a", labels={}, runtime={}, mpi={}, pod_sets=[object()],
                        pod_selector={"jobset.sigs.k8s.io/jobset-name": "bert"})


def test_the_namespace_policy_selects_every_pod_of_its_kind_and_admits_nothing() -> None:
    for kind, labels in (("TrainJob", {"jobset.sigs.k8s.io/jobset-name": "any"}),
                         ("MPIJob", {"training.kubeflow.org/operator-name": "mpi-operator",
                                     "training.kubeflow.org/job-name": "any"})):
        policy = injections.isolation_policy("team-a", kind)
        assert policy["metadata"]["labels"] == {injections.MANAGED_BY_LABEL: injections.MANAGED_BY}
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in policy["spec"]
        assert selects(policy["spec"]["podSelector"], labels)
        assert not selects(policy["spec"]["podSelector"], {"app": "web"})


def selects(selector: dict, labels: dict) -> bool:
    """A label selector's matchExpressions (Exists, In) against ``labels``, as the API server reads them."""
    for expression in selector["matchExpressions"]:
        if expression["key"] not in labels:
            return False
        if expression["operator"] == "In" and labels[expression["key"]] not in expression["values"]:
            return False
    return True


def test_the_jobs_policy_follows_the_template_and_names_its_submission() -> None:
    body = job_policy(job(), NetworkPolicyInjection(template="restricted"), "5b0c1c0e-3b1a-4c55-9a66-0d3f0e6f2a11")
    assert body["metadata"]["name"] == "bert-mpi-isolation"
    assert body["metadata"]["annotations"] == {injections.JOB_ANNOTATION: "TrainJob/bert",
                                               injections.ADMISSION_ANNOTATION: "5b0c1c0e-3b1a-4c55-9a66-0d3f0e6f2a11"}
    assert [p["port"] for p in body["spec"]["ingress"][0]["ports"]] == [2222, 30000]
    assert body["spec"]["podSelector"] == {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "bert"}}


def test_the_guard_lets_the_service_write_the_names_it_uses() -> None:
    """manifests/base/guard.yaml's name rule, against the names the code writes."""
    policy = next(d for d in yaml.safe_load_all(GUARD.read_text()) if d["kind"] == "ValidatingAdmissionPolicy"
                  and d["metadata"]["name"] == "trainjob-admission-managed-objects-only")
    names = next(v["expression"] for v in policy["spec"]["validations"] if "endsWith('-mpi-isolation')" in v["expression"])
    for name, _ in injections.ISOLATION_POLICIES.values():
        assert f"'{name}'" in names
    for suffix in injections.NAME_SUFFIXES.values():
        assert f"endsWith('{suffix}')" in names
