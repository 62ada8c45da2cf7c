"""paramRef and the CEL authorizer on the real control plane, with `trainjob-admission serve` holding
only the service's roles (manifests/base/rbac.yaml: list/watch on ConfigMaps, create on
SubjectAccessReviews). A bundle takes maxWorkers from a labelled ConfigMap in the job's namespace
and a change to it decides once the watch delivers it; a rule admits alice (`edit`: she may create
Secrets) and refuses carol, who may create TrainJobs but not Secrets, through real
SubjectAccessReviews.
"""
from __future__ import annotations

import json
import uuid

import pytest

from tests.support.objects import edit_binding, trainjob
from tests.support.service import REPO, cluster, service_as_installed

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/paramref-test"
PARAMS_LABEL = "trainjob-admission.io/params"


def kc(*args, kubeconfig=None, input=None):
    return cluster.kubectl(*args, kubeconfig=kubeconfig or cluster.ADMIN_KUBECONFIG, check=False, input=input)


def bundle(name: str, ns: str, run: str, spec: dict) -> dict:
    return {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
            "metadata": {"name": name, "labels": {LABEL: run}}, "spec": {"match": {"namespaces": [ns]}, **spec}}


class Setup:
    def __init__(self, ns: str):
        self.ns = ns

    def limit(self, workers: int) -> None:
        configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "job-limits", "namespace": self.ns, "labels": {PARAMS_LABEL: "true"}},
                     "data": {"maxWorkers": str(workers)}}
        assert kc("apply", "-f", "-", input=json.dumps(configmap)).returncode == 0

    def submit(self, job: dict, *extra: str, kubeconfig=None):
        return kc("create", "--dry-run=server", *extra, "-f", "-", kubeconfig=kubeconfig or cluster.USER_A_KUBECONFIG,
                  input=json.dumps(job))


@pytest.fixture(scope="module")
def setup(control_plane, policybundle_crd, tmp_path_factory):
    run = uuid.uuid4().hex[:8]
    ns = f"pref-{run}"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", REPO / "examples/runtimes/mpi-openmpi.yaml")
    submitter = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": {"name": "trainjob-submitter", "namespace": ns},
                 "rules": [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"],
                            "verbs": ["create", "get", "list"]}]}
    carol = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "carol-submitter", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainjob-submitter"},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}]}
    params = bundle(f"{ns}-params", ns, run, {
        "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
        "paramRef": {"name": "job-limits", "parameterNotFoundAction": "Deny"},
        "validations": [{"name": "max-workers", "expression": "job.workers <= int(params.maxWorkers)",
                         "messageExpression": "'at most ' + params.maxWorkers + ' workers here'"}]})
    secrets = bundle(f"{ns}-authz", ns, run, {"validations": [{
        "name": "may-create-secrets",
        "expression": "authorizer.group('').resource('secrets').namespace(object.metadata.namespace)"
                      ".check('create').allowed()",
        "message": "only members allowed to create Secrets here may submit"}]})
    try:
        cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                               edit_binding(ns, "alice"), submitter, carol, params, secrets])
        with service_as_installed(tmp_path_factory.mktemp("paramref"), ns, [ns], f"{LABEL}={run}"):
            yield Setup(ns)
    finally:
        kc("delete", "policybundle", f"{ns}-params", f"{ns}-authz", "--ignore-not-found", "--wait=false")
        kc("delete", "namespace", ns, "--ignore-not-found", "--wait=false")


def test_params_configmap_in_the_jobs_namespace_decides_and_its_change_is_watched(setup, wait_for):
    job = trainjob("sweep", setup.ns, nodes=4, gpus=0)
    # no params ConfigMap yet: Deny names it (once the service serves the bundles)
    p = wait_for("the params denial", lambda: (p := setup.submit(job)) and "there is none" in p.stderr and p)
    assert p.returncode != 0 and f"ConfigMap {setup.ns}/job-limits labelled {PARAMS_LABEL}=true" in p.stderr, p.stderr

    setup.limit(8)
    wait_for("the ConfigMap to reach the service", lambda: setup.submit(job).returncode == 0, 30)
    setup.limit(1)
    refused = wait_for("its change to reach the service", lambda: (p := setup.submit(job)).returncode != 0 and p, 30)
    assert "at most 1 workers here" in refused.stderr, refused.stderr


def test_authorizer_admits_who_may_create_secrets_and_refuses_who_may_not(setup, wait_for):
    setup.limit(8)
    job = trainjob("probe", setup.ns, nodes=2, gpus=0)
    wait_for("alice admitted", lambda: setup.submit(job).returncode == 0, 30)
    assert kc("auth", "can-i", "create", "trainjobs.trainer.kubeflow.org", "-n", setup.ns,
              "--as=carol").stdout.strip() == "yes"
    p = setup.submit(job, "--as=carol", kubeconfig=cluster.ADMIN_KUBECONFIG)
    assert p.returncode != 0 and "only members allowed to create Secrets here may submit" in p.stderr, p.stderr
