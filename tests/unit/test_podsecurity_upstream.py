"""Pod Security admission's own fixtures, every one of them: test/testdata/{baseline,restricted}/
v1.N/{pass,fail}/*.yaml of k8s.io/pod-security-admission (the version pinned in
hack/cluster/cluster.py), read from the Go module cache at test time, never copied here.

Each fixture pod is shipped as a user would ship it: as the pod template of a
ClusterTrainingRuntime's trainer job, which a TrainJob names, in a namespace labelled with the
fixture's level and ``enforce-version``. The whole decision runs (the engine `review` uses, the
shipped default bundle) and its pod-security result must be what upstream says: a denial for
every fail fixture, none for every pass fixture, at every version directory upstream has.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.bundle.load import default_bundles
from trainjob_admission.policies.decide.decision import Result
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.k8s import podsecurityadmission as psa
from trainjob_admission.policies.k8s.clusterstate import ClusterState
from tests.support import upstream
from tests.support.service import cluster

MODULE = "pod-security-admission"
LEVELS = ("baseline", "restricted")
NAMESPACE = "psa-fixtures"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 4,241 fixtures
bundles = functools.cache(default_bundles)


def _testdata() -> Path:
    try:
        return upstream.module_dir(MODULE) / "test" / "testdata"
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))


def _runtime(pod: dict) -> dict:
    """The fixture pod as the pod template of a runtime's replicated job, its labels and
    annotations kept (the seccomp and AppArmor annotations of the old versions live there). No
    trainer-ancestor label: Trainer's runtime webhook would require a container named "node" in
    such a job, and the fixtures' containers are container1 and initcontainer1."""
    meta = pod.get("metadata") or {}
    template = {"metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta}, "spec": pod["spec"]}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "psa-fixture"},
        "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": template}}}]}}},
    }


def _trainjob(name: str) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"runtimeRef": {"name": "psa-fixture"}}}


def _namespace(level: str, version: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": version}}}


def _pod_security(fixture: Path, level: str, version: str) -> tuple[bool, list[str]]:
    """Whether the default bundle's pod-security check denies the fixture, and its messages and
    any job-model denial (which would stop the checks). The bundle's other rules (job-shape's
    minimum cpu of fixture pods that request none) are not Pod Security's to agree with."""
    pod = yaml.load(fixture.read_text(), Loader=LOADER)
    name = "psa-" + re.sub(r"[^a-z0-9-]", "-", fixture.stem)
    state = ClusterState.from_objects([_namespace(level, version), _runtime(pod)])
    decision = evaluate(AdmissionInput(_trainjob(name)), bundles(), state)
    (result,) = [r for r in decision.results if r.rule == "pod-security"]
    refused = [f"{r.rule}: {m}" for r in decision.results if r.rule in ("pod-security", "job-model") for m in r.messages]
    return result.result is Result.FAIL, refused


def test_the_version_directories_are_those_the_model_knows():
    """v1.0 to the newest, and no newer one: a directory upstream adds fails here first."""
    testdata = _testdata()
    for level in LEVELS:
        assert sorted(d.name for d in (testdata / level).iterdir()) == \
            sorted(f"v1.{minor}" for minor in range(psa.LATEST + 1)), level
    assert cluster.VERSIONS[MODULE] == cluster.staging_version()  # the kubernetes release's own policy


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("minor", range(psa.LATEST + 1))
def test_every_upstream_fixture_decides_as_pod_security_admission(level, minor):
    version = f"v1.{minor}"
    directory = _testdata() / level / version
    disagreements = []
    count = 0
    for verdict in ("pass", "fail"):
        for fixture in sorted((directory / verdict).glob("*.yaml")):
            count += 1
            denied, refused = _pod_security(fixture, level, version)
            if denied != (verdict == "fail") or any(r.startswith("job-model") for r in refused):
                disagreements.append(f"{verdict}/{fixture.name}: {refused or 'admitted'}")
    assert count >= 40  # 11 pass and 29 fail at baseline v1.0, the fewest
    assert not disagreements, f"{level} {version}: {len(disagreements)} of {count} disagree:\n" + "\n".join(disagreements)


@pytest.mark.parametrize("label, expected", [
    ("v1.24", 24), ("v1.0", 0), ("latest", None), ("v1.99", 99), ("1.24", None), ("v1.024", None), ("v2.1", None),
    ("", None),
])
def test_enforce_version_is_parsed_as_pod_security_admission_parses_it(label, expected):
    """api/helpers.go ParseVersion: v1.N or latest; anything else is latest (with its error)."""
    assert psa.parse_version(label) == expected
