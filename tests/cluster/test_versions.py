"""What the cluster runs, learned from the real API server, and decisions that depend on it; on both
stacks (the newest: Kubernetes 1.36, Trainer v2.3, Kueue v0.19 serving v1beta2; the oldest:
Kubernetes 1.33, Trainer v2.2, Kueue v0.14 serving only v1beta1).

- The service reports what it discovered: /readyz?verbose, the cluster_info metric, the
  decision record's ``cluster``; ``review --kubeconfig`` says the same, and alice (a namespace
  user) can read it all: discovery needs no RBAC of ours.
- Pod Security by namespace label and version: for each namespace labelling (a level and an
  ``enforce-version``) a twin namespace with the same labels and no webhook of ours is the
  oracle: the API server's own Pod Security admission refuses the job's pods there exactly when
  the service refuses the job.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
import uuid

import pytest

from tests.support import kueue
from tests.support.objects import edit_binding, trainjob
from tests.support.serve import CLI
from tests.support.service import REPO, cluster, default_bundle_for, scratch_namespace, service_as_installed
from trainjob_admission.policies.k8s.versions import parse_minor
from trainjob_admission.webhook.kube.discovery import discover

pytestmark = [pytest.mark.cluster, pytest.mark.oldest]

LABEL = "trainjob-admission.io/versions-test"
PSA = "pod-security.kubernetes.io"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


def expected(control_plane) -> str:
    v = control_plane.versions
    major, minor = parse_minor(v["trainer"], "trainer")
    return (f"cluster: Kubernetes {v['kubernetes']}, Trainer v{major}.{minor}, Kueue API "
            f"{kueue.API_VERSION}")


@pytest.fixture(scope="module")
def env(control_plane, policybundle_crd, tmp_path_factory):
    with scratch_namespace("versions", LABEL) as (ns, run):
        cluster.apply_objects([edit_binding(ns, "alice"), default_bundle_for(ns, LABEL, run)])
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", REPO / "examples/runtimes/mpi-openmpi.yaml")
        with service_as_installed(tmp_path_factory.mktemp("versions"), ns, [ns], f"{LABEL}={run}") as svc:
            yield ns, run, svc


def test_the_service_says_what_the_cluster_runs(env, control_plane, tmp_path):
    ns, _, svc = env
    code, text = svc.call("/readyz?verbose", base=svc.probe_url)
    assert code == 200 and expected(control_plane) in text.splitlines(), text
    assert "kubernetes from: discovered" in text and "warning:" not in text  # inside the tested matrix
    code, metrics = svc.call("/metrics", base=svc.probe_url)
    assert re.search(rf'trainjob_admission_cluster_info\{{kubernetes="{control_plane.versions["kubernetes"]}",'
                     rf'kueue="{kueue.API_VERSION}",source="discovered",tested="true",trainer="v2\.[23]"\}} 1\.0',
                     metrics), metrics
    name = f"v-{uuid.uuid4().hex[:6]}"
    created = cluster.kubectl("create", "-f", "-", input=json.dumps(trainjob(name, ns, nodes=2, gpus=0)),
                              kubeconfig=cluster.USER_A_KUBECONFIG, check=False)
    assert created.returncode == 0, created.stderr
    records = [r for r in svc.records() if r.get("name") == name]
    assert records and all(r["cluster"]["kubernetes"] == control_plane.versions["kubernetes"]
                           and r["cluster"]["kueue"] == kueue.API_VERSION for r in records), records
    # review --kubeconfig: the same facts; alice, with her rights only, discovers them too
    job = tmp_path / "job.json"
    job.write_text(json.dumps(trainjob(f"{name}-review", ns, nodes=2, gpus=0)))
    review = subprocess.run([str(CLI), "review", "-f", str(job), "--kubeconfig", str(cluster.ADMIN_KUBECONFIG),
                             "--bundle", "builtin:default", "-o", "json"], capture_output=True, text=True, timeout=120)
    assert review.returncode == 0, review.stderr
    assert json.loads(review.stdout)["cluster"] == records[-1]["cluster"]
    assert "note: judged as" not in review.stderr
    assert discover(str(cluster.USER_A_KUBECONFIG)).summary() == records[-1]["cluster"]


# -- Pod Security by namespace label and version: the API server's own admission is the oracle ------

def psa_namespaces(run: str, suffix: str, level: str, version: str) -> tuple[str, str]:
    """(judged, twin): the same Pod Security labels; our webhook selects only the first."""
    labels = {f"{PSA}/enforce": level, f"{PSA}/enforce-version": version}
    judged, twin = f"psa-{run}-{suffix}", f"psa-{run}-{suffix}-twin"
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": n, "labels": {**labels, LABEL: run}}} for n in (judged, twin)])
    return judged, twin


def api_server_refuses(ns: str, job: dict, timeout: float = 240) -> bool:
    """Create ``job`` where no webhook of ours looks; True once its pods are refused by Pod Security
    (the Job controller's FailedCreate event), False once they exist."""
    name = job["metadata"]["name"]
    cluster.kubectl("create", "-f", "-", input=json.dumps({**job, "metadata": {**job["metadata"], "namespace": ns}}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", f"{JOBSET_NAME}={name}", "-o", "json").stdout)
        if pods["items"]:
            return False
        events = json.loads(cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
        # this job's own (its Jobs are <name>-<replicated job>-<index>), not an earlier job's in ns
        if any("violates PodSecurity" in e.get("message", "")
               and e.get("involvedObject", {}).get("name", "").startswith(f"{name}-") for e in events):
            return True
        time.sleep(1)
    seen = [(e.get("involvedObject", {}).get("kind"), e.get("reason"), e.get("message")) for e in events]
    raise TimeoutError(f"neither pods nor a Pod Security refusal for {ns}/{name}; events: {seen}")


def node_security(name: str, security_context: dict) -> dict:
    """A job whose runtimePatch sets the node container's ``security_context`` (merged into the
    runtime's: examples/runtimes/mpi-openmpi.yaml sets allowPrivilegeEscalation false, drops ALL)."""
    job = trainjob(name, nodes=2, gpus=0)
    job["spec"]["runtimePatches"] = [{"manager": "trainjob-admission.test/psa", "trainingRuntimeSpec": {"template": {
        "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {"containers": [
            {"name": "node", "securityContext": security_context}]}}}}}]}}}}]
    return job


JOBS = {"restricted-as-written": lambda n: trainjob(n, nodes=2, gpus=0),  # examples/runtimes/mpi-openmpi.yaml
        # restricted forbids allowPrivilegeEscalation: true; baseline allows it
        "escalating": lambda n: node_security(n, {"allowPrivilegeEscalation": True}),
        # baseline forbids privileged. It must escalate too: the runtime's allowPrivilegeEscalation
        # false with privileged true is refused by pod validation (core/validation
        # ValidateSecurityContext) when JobSet creates the Job, before Pod Security sees a pod.
        "privileged": lambda n: node_security(n, {"privileged": True, "allowPrivilegeEscalation": True})}


@pytest.mark.parametrize("level, version", [("restricted", "own"), ("baseline", "latest"), ("restricted", "v1.30")])
def test_pod_security_by_namespace_label_and_version_is_the_api_servers(control_plane, policybundle_crd, tmp_path,
                                                                         level, version):
    run = uuid.uuid4().hex[:6]
    if version == "own":  # the cluster's own minor, as a pinned label
        major, minor = parse_minor(control_plane.versions["kubernetes"], "kubernetes")
        version = f"v{major}.{minor}"
    judged, twin = psa_namespaces(run, level, level, version)
    try:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", REPO / "examples/runtimes/mpi-openmpi.yaml")
        cluster.apply_objects([default_bundle_for(judged, LABEL, run)])
        with service_as_installed(tmp_path, f"psa-{run}", [judged], f"{LABEL}={run}"):
            verdicts = {}
            for case, make in JOBS.items():
                ours = cluster.kubectl("create", "-f", "-", input=json.dumps(
                    {**make(case), "metadata": {"name": case, "namespace": judged}}), check=False)
                refused = api_server_refuses(twin, make(case))
                verdicts[case] = (ours.returncode != 0, refused)
                assert (ours.returncode != 0) == refused, (case, level, version, ours.stderr, verdicts)
                if refused:
                    assert f'violates Pod Security "{level}' in ours.stderr, ours.stderr
            # not vacuous: the labelling splits the jobs
            assert {ours for ours, _ in verdicts.values()} == {True, False}, verdicts
    finally:
        cluster.kubectl("delete", "namespace", judged, twin, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "policybundle", judged, "--ignore-not-found", "--wait=false", check=False)
