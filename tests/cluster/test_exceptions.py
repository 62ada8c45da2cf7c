"""PolicyExceptions on the real control plane: the CRD from manifests/base, the exception-admin role
from manifests/base/people.yaml, and `trainjob-admission serve` holding only the service's roles
(it watches PolicyExceptions with list/watch alone). alice (`edit` in the namespace) cannot grant
one; an admin can, and then alice's over-quota job is admitted with a warning naming it, the
decision record names it, and once it expires the same job is refused again.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from tests.support.objects import edit_binding, trainjob
from tests.support.service import REPO, cluster, default_bundle_for, scratch_namespace, service_as_installed

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/exceptions-test"
CRD_FILE = REPO / "manifests/base/policyexception-crd.yaml"
CRD = "policyexceptions.policy.trainjob-admission.io"
ROLE = "trainjob-admission-exception-admin"  # manifests/base/people.yaml
QUOTA_GPUS = 8


def kc(*args, kubeconfig=None, input=None):
    return cluster.kubectl(*args, kubeconfig=kubeconfig or cluster.ADMIN_KUBECONFIG, check=False, input=input)


def wait(what, pred, timeout=60.0, interval=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if last := pred():
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def exception(name: str, ns: str, job: str, expiry: datetime) -> dict:
    return {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyException",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"match": {"names": [job]}, "rules": ["quota"], "reason": "launch run, approved in OPS-1234",
                     "expiry": expiry.strftime("%Y-%m-%dT%H:%M:%SZ")}}


class Setup:
    def __init__(self, ns: str, svc, admin: tuple[str, ...], group: str):
        self.ns, self.svc, self.admin, self.group = ns, svc, admin, group

    def submit(self, job: dict, *extra: str):
        return kc("create", *extra, "-f", "-", kubeconfig=cluster.USER_A_KUBECONFIG, input=json.dumps(job))

    def record(self, name: str, *, dry_run: bool = False) -> dict:
        return [r for r in self.svc.records() if r["endpoint"] == "validate" and r.get("name") == name
                and bool(r.get("dryRun")) == dry_run][-1]


@pytest.fixture(scope="module")
def setup(control_plane, policybundle_crd, tmp_path_factory):
    cluster.apply_objects(yaml.safe_load_all(CRD_FILE.read_text()), server_side=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", REPO / "examples/runtimes/mpi-openmpi.yaml")
    role = next(d for d in yaml.safe_load_all((REPO / "manifests/base/people.yaml").read_text())
                if d["kind"] == "ClusterRole" and d["metadata"]["name"] == ROLE)
    with scratch_namespace("pex", LABEL) as (ns, run):
        group = f"pex-admins-{run}"
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": group, "labels": {LABEL: run}},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]}
        try:
            cluster.apply_objects([role], server_side=True)
            cluster.apply_objects([
                {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": ns},
                 "spec": {"hard": {"requests.cpu": "64", "requests.memory": "256Gi",
                                   "requests.nvidia.com/gpu": str(QUOTA_GPUS)}}},
                edit_binding(ns, "alice"), binding, default_bundle_for(ns, LABEL, run)])
            wait("quota status", lambda: json.loads(kc("get", "resourcequota", "compute", "-n", ns, "-o", "json").stdout
                                                    ).get("status", {}).get("hard"))
            with service_as_installed(tmp_path_factory.mktemp("exceptions"), ns, [ns], f"{LABEL}={run}") as svc:
                yield Setup(ns, svc, ("--as=adam", f"--as-group={group}"), group)
        finally:
            kc("delete", "clusterrolebinding", group, "--ignore-not-found")


def test_alice_cannot_grant_an_exception(setup):
    resource = "policyexceptions.policy.trainjob-admission.io"
    for verb in ("create", "patch", "delete"):
        p = kc("auth", "can-i", verb, resource, "-n", setup.ns, kubeconfig=cluster.USER_A_KUBECONFIG)
        assert p.stdout.strip() == "no", (verb, p.stdout, p.stderr)
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    p = kc("create", "-f", "-", kubeconfig=cluster.USER_A_KUBECONFIG,
           input=json.dumps(exception("mine", setup.ns, "anything", later)))
    assert p.returncode != 0 and "forbidden" in p.stderr.lower() and "policyexceptions" in p.stderr, p.stderr
    assert kc("auth", "can-i", "create", resource, "-n", setup.ns, *setup.admin).stdout.strip() == "yes"


def test_crd_refuses_a_waiver_of_a_safety_rule(setup):
    obj = exception("unsafe", setup.ns, "job", datetime.now(timezone.utc) + timedelta(hours=1))
    obj["spec"]["rules"] = ["default/job-model"]
    p = kc("create", "-f", "-", *setup.admin, input=json.dumps(obj))
    assert p.returncode != 0 and "safety rules" in p.stderr, p.stderr


def test_exception_admits_the_named_job_and_an_expired_one_does_not(setup):
    ns, name = setup.ns, "big-run"
    job = trainjob(name, ns, nodes=3, gpus=4)  # 12 GPUs or more against a quota of 8
    p = setup.submit(job)
    assert p.returncode != 0 and "denied the request" in p.stderr and f"allows {QUOTA_GPUS}" in p.stderr, p.stderr

    # an admin grants an exception for this job name alone
    expiry = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    until = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
    created = kc("create", "-f", "-", *setup.admin, input=json.dumps(exception("launch", ns, name, expiry)))
    assert created.returncode == 0, created.stderr
    # the service sees it through its watch: a server dry run admits the job once it does
    wait("the service to see the exception", lambda: setup.submit(job, "--dry-run=server").returncode == 0, 30)
    other = setup.submit(trainjob("other-run", ns, nodes=3, gpus=4), "--dry-run=server")
    assert other.returncode != 0 and "denied the request" in other.stderr, "the exception names one job only"

    p = setup.submit(job)
    assert p.returncode == 0, p.stderr
    assert f"rule {ns}/quota waived by PolicyException {ns}/launch until {until}" in p.stderr, p.stderr
    record = setup.record(name)
    assert record["allowed"] is True and record["decision"] == "warn"
    assert record["facts"]["exceptions"] == [{"exception": f"{ns}/launch", "rule": f"{ns}/quota", "status": "applied",
                                              "expiry": until, "reason": "launch run, approved in OPS-1234"}]
    (quota,) = [r for r in record["rules"] if r["rule"] == "quota"]
    assert (quota["result"], quota["effect"], quota["exception"]) == ("excepted", "allow", f"{ns}/launch")
    assert kc("delete", "trainjob", name, "-n", ns, "--wait=true", "--timeout=60s").returncode == 0

    # replaced by one that expires a few seconds from now: once it has, the same job is refused
    # again, and the record says which exception ran out
    assert kc("delete", "policyexception", "launch", "-n", ns, *setup.admin).returncode == 0
    expiry = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=3)
    until = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
    created = kc("create", "-f", "-", *setup.admin, input=json.dumps(exception("short", ns, name, expiry)))
    assert created.returncode == 0, created.stderr
    wait("the expiry", lambda: datetime.now(timezone.utc) > expiry + timedelta(seconds=1), 30)

    def refused_naming_the_expired_one() -> dict | None:
        p = setup.submit(job)
        assert p.returncode != 0 and f"allows {QUOTA_GPUS}" in p.stderr, p.stderr
        record = setup.record(name)
        return record if (record.get("facts") or {}).get("exceptions") else None  # once the watch has delivered it

    record = wait("a refusal naming the expired exception", refused_naming_the_expired_one, 30)
    assert record["allowed"] is False
    assert record["facts"]["exceptions"][0] | {"reason": ""} == {"exception": f"{ns}/short", "rule": f"{ns}/quota",
                                                                 "status": "expired", "expiry": until, "reason": ""}
    assert any(f"PolicyException {ns}/short expired at {until}" in w for w in record["warnings"]), record["warnings"]
