"""UPDATEs are judged against the runtime the real Trainer runs the job with: the
`<job>-runtime-snapshot` ConfigMap it writes when it first builds the job. The service runs as
`serve` with only the roles of manifests/base/rbac.yaml (so `get` on configmaps is proven enough).
After the ClusterTrainingRuntime is edited so that a new job on it is denied (a privileged
container, under the default bundle's baseline Pod Security level), the existing job can still be
labelled, suspended (what Kueue does to preempt) and patched while suspended (runtimePatches: the
only spec that changes, spec.trainer is immutable): each is judged against the snapshot, and a
change the policy forbids is still refused."""
from __future__ import annotations

import json
import uuid

import pytest
import yaml

from tests.support import objects
from tests.support.service import REPO, cluster, service_as_installed

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/snapshot-test"
def add_patch(manager: str, node_template: dict) -> str:
    """A JSON patch appending a runtimePatch of the node pods (the webhook's own Istio patch stays)."""
    entry = {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": node_template}}}]}}}}
    return json.dumps([{"op": "add", "path": "/spec/runtimePatches/-", "value": entry}])


PRIVILEGED_NODE = [{"op": "replace", "path": "/spec/template/spec/replicatedJobs/0/template/spec/template/spec/"
                                            "containers/0/securityContext", "value": {"privileged": True}}]


def kc(*args: str, input: str | None = None):
    return cluster.kubectl(*args, check=False, input=input)


@pytest.fixture
def service(control_plane, policybundle_crd, namespace, tmp_path):
    """(runtime name) with the service registered for ``namespace``, deciding by the default bundle."""
    run = uuid.uuid4().hex[:8]
    runtime, hook = f"snapshot-{run}", f"snapshot-{run}"
    bundle = yaml.safe_load((REPO / "policies/bundle/builtin/default.yaml").read_text())
    bundle["metadata"] = {"name": hook, "labels": {LABEL: run}}
    bundle["spec"]["match"] = {"namespaces": [namespace]}
    cluster.apply_objects([objects.runtime(runtime), bundle])
    try:
        with service_as_installed(tmp_path, hook, [namespace], f"{LABEL}={run}"):
            yield runtime
    finally:
        kc("delete", "policybundle", hook, "--ignore-not-found", "--wait=false")
        kc("delete", "clustertrainingruntime", runtime, "--ignore-not-found", "--wait=false")


def test_updates_are_judged_against_trainers_snapshot_not_the_edited_runtime(service, namespace, get_json, wait_for):
    runtime, name = service, "snap"
    created = kc("create", "-f", "-", input=json.dumps(objects.trainjob(name, namespace, runtime=runtime, nodes=2)))
    assert created.returncode == 0, created.stderr
    uid = get_json("trainjob", name, "-n", namespace)["metadata"]["uid"]
    snapshot = wait_for("Trainer's runtime snapshot", lambda: json.loads(
        kc("get", "configmap", f"{name}-runtime-snapshot", "-n", namespace, "-o", "json").stdout or "null"))
    assert [o["uid"] for o in snapshot["metadata"]["ownerReferences"] if o.get("controller")] == [uid]
    frozen = yaml.safe_load(snapshot["data"]["runtime"])
    assert (frozen["kind"], frozen["metadata"]["name"]) == ("ClusterTrainingRuntime", runtime)

    patched = kc("patch", "clustertrainingruntime", runtime, "--type", "json", "-p", json.dumps(PRIVILEGED_NODE))
    assert patched.returncode == 0, patched.stderr
    fresh = kc("create", "-f", "-", input=json.dumps(objects.trainjob("fresh", namespace, runtime=runtime, nodes=2)))
    assert fresh.returncode != 0 and "privileged" in fresh.stderr, "the edited runtime must deny a new job"

    # a label edit and Kueue's suspend: admitted
    labelled = kc("label", "trainjob", name, "-n", namespace, "team=vision")
    assert labelled.returncode == 0, labelled.stderr
    suspended = kc("patch", "trainjob", name, "-n", namespace, "--type", "merge", "-p", '{"spec":{"suspend":true}}')
    assert suspended.returncode == 0, suspended.stderr
    # Trainer's own webhook refuses a patch while any replicated job of the JobSet is still active
    # (plugins/jobset/jobset.go checkRuntimePatchesImmutability): wait for the suspension to land.
    wait_for("the suspended JobSet's jobs to stop", lambda: all(
        not status.get("active") for status in
        (get_json("jobsets.jobset.x-k8s.io", name, "-n", namespace).get("status") or {}).get("replicatedJobsStatus", [])))
    # a runtimePatch while suspended: judged with the unprivileged snapshot (the live runtime would deny), admitted
    relabelled = kc("patch", "trainjob", name, "-n", namespace, "--type", "json", "-p",
                    add_patch("trainjob-admission.test/labels", {"metadata": {"labels": {"team": "vision"}}}))
    assert relabelled.returncode == 0, relabelled.stderr
    # and still judged: a privileged node container is refused
    privileged = kc("patch", "trainjob", name, "-n", namespace, "--type", "json", "-p",
                    add_patch("trainjob-admission.test/privileged",
                              {"spec": {"containers": [{"name": "node", "securityContext": {"privileged": True}}]}}))
    assert privileged.returncode != 0 and "denied the request" in privileged.stderr, privileged.stderr
    assert "privileged" in privileged.stderr
    job = get_json("trainjob", name, "-n", namespace)
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["team"] == "vision"
    assert [p["manager"] for p in job["spec"]["runtimePatches"]][-1] == "trainjob-admission.test/labels"
