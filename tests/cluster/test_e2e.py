"""End to end on the real control plane: the API server calls `trainjob-admission serve` (running
on the host as its own user with only the roles of manifests/base/rbac.yaml, bound as installed, reading the
cluster through its kubeconfig) on real submissions made with kubectl, the Kubeflow SDK and the
kubernetes client, and the real Trainer, JobSet, KWOK and garbage collector act on what it admitted.

One service and two namespaces serve the whole module (starting them is the slow part); each
test uses its own job names. The webhook configurations select only this module's namespaces,
and the PolicyBundles the service enforces carry a label only this module's service selects
(--bundle-selector), so other servers on the shared control plane are unaffected.
"""
from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.net import refused_at_tls
from tests.support.objects import GPU, edit_binding, example_job, trainjob
from tests.support.serve import CLI, Serve
from tests.support.service import (REPO, cluster, delete_bindings, register, service_kubeconfig, start_service,
                                   unregister)
from trainjob_admission.policies.decide import injections
from trainjob_admission.webhook.inject import keys

pytestmark = [pytest.mark.cluster,  # the Kubeflow SDK 0.4.0 still uses pydantic's class-based config
              pytest.mark.filterwarnings("ignore:Support for class-based `config` is deprecated")]

E2E_LABEL = "trainjob-admission.io/e2e"
MANAGER = "trainjob-admission.io/webhook"  # policies.decide.mutations.MANAGER
ISTIO = "sidecar.istio.io/inject"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED_BY = ("app.kubernetes.io/managed-by", "trainjob-admission")
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
QUOTA_GPUS = 32
RUNTIMES = ("examples/runtimes/mpi-openmpi.yaml", "examples/runtimes/mpi-privileged.yaml")
BULK_KEY_TYPE = yaml.safe_load((REPO / "policies/bundle/builtin/default.yaml").read_text())["spec"]["injections"]["sshKey"]["type"]


@dataclass(frozen=True)
class E2E:
    """What the module fixture set up."""
    ns: str  # quota of QUOTA_GPUS GPUs; alice has `edit` here
    bulk_ns: str  # no quota: the concurrent submissions
    svc: Serve
    hook: str  # name of the webhook configurations
    admin: Path
    alice: Path


def kc(*args, kubeconfig=None, input=None, timeout=120):
    """kubectl without raising: the tests look at returncode/stdout/stderr themselves."""
    return cluster.kubectl(*args, kubeconfig=kubeconfig or cluster.ADMIN_KUBECONFIG, check=False,
                           input=input, timeout=timeout)


def get(kind, name, ns, kubeconfig=None) -> dict | None:
    p = kc("get", kind, name, "-n", ns, "-o", "json", kubeconfig=kubeconfig)
    if p.returncode != 0:
        assert "NotFound" in p.stderr, p.stderr
        return None
    return json.loads(p.stdout)


def wait(what, pred, timeout=60.0, interval=0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


def mpijob(name: str, ns: str, *, privileged: bool = False) -> dict:
    """The legacy MPIJob of examples/jobs/legacy-mpijob.yaml, optionally with a privileged launcher."""
    obj = example_job("legacy-mpijob.yaml")
    obj["metadata"] = {"name": name, "namespace": ns}
    if privileged:
        launcher = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        launcher["securityContext"] = {"privileged": True}
    return obj


def submit(obj: dict, *, verb: str = "create", kubeconfig=None, extra=()):
    return kc(verb, *extra, "-f", "-", kubeconfig=kubeconfig, input=json.dumps(obj))


def denial(p) -> str:
    """kubectl's stderr for a request our validating webhook refused."""
    assert p.returncode != 0, f"expected a denial, got: {p.stdout}"
    assert "denied the request" in p.stderr, p.stderr
    return p.stderr


def label_selector_matches(selector: dict, labels: dict) -> bool:
    """LabelSelector semantics (matchLabels + matchExpressions), as the network plugin applies them."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def nothing_created(ns: str, name: str, kind: str = "trainjob") -> None:
    for k, n in ((kind, name), ("secret", f"{name}-mpi-ssh-auth"), ("networkpolicy", f"{name}-mpi-isolation"),
                 ("jobset", name)):
        assert get(k, n, ns) is None, f"{k}/{n} exists after a refused or dry-run submission"


# ---------------------------------------------------------------------------------------------
# The module's service
# ---------------------------------------------------------------------------------------------
def _bundle(name: str, run: str, namespace: str, key_type: str | None = None) -> dict:
    """The built-in default bundle as a PolicyBundle resource for one of our namespaces."""
    doc = yaml.safe_load((REPO / "policies/bundle/builtin/default.yaml").read_text())
    doc["metadata"] = {"name": name, "labels": {E2E_LABEL: run}}
    doc["spec"]["match"] = {"namespaces": [namespace]}
    if key_type:
        doc["spec"]["injections"]["sshKey"]["type"] = key_type
    return doc


@pytest.fixture(scope="module")
def e2e(control_plane, policybundle_crd, tmp_path_factory):
    run = uuid.uuid4().hex[:8]
    ns, bulk, hook = f"e2e-{run}", f"e2e-{run}-bulk", f"e2e-{run}"
    work = tmp_path_factory.mktemp("e2e")
    svc, bindings = None, []
    try:
        cluster.install_mpijob_crd()
        for f in RUNTIMES:
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", REPO / f)
        objs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": {E2E_LABEL: run}}}
                for n in (ns, bulk)]
        objs.append({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": ns},
                     "spec": {"hard": {"requests.cpu": "128", "requests.memory": "512Gi",
                                       f"requests.{GPU}": str(QUOTA_GPUS), "pods": "100"}}})
        objs.append(edit_binding(ns, "alice"))
        objs.append(_bundle(f"e2e-{run}", run, ns, key_type="rsa-4096"))
        # The main namespace asks for RSA-4096, unlike Trainer's own P-521, so a mounted key is
        # provably ours; the burst namespace keeps the default bundle's key type.
        objs.append(_bundle(f"e2e-{run}-bulk", run, bulk))
        cluster.apply_objects(objs)
        wait("quota status", lambda: (get("resourcequota", "compute", ns) or {}).get("status", {}).get("hard"))

        # the service runs as its own user holding exactly the roles of manifests/base/rbac.yaml, the
        # injector bound only in the namespaces it injects into
        kubeconfig, bindings = service_kubeconfig(work, f"e2e-webhook-{run}", [ns, bulk])
        svc = start_service(work, kubeconfig, cluster.issue_serving_cert(work / "certs", name="e2e-webhook"),
                            namespaces=[ns, bulk], args=("--bundle-selector", f"{E2E_LABEL}={run}"))
        register(svc, hook, [ns, bulk])
        yield E2E(ns=ns, bulk_ns=bulk, svc=svc, hook=hook, admin=cluster.ADMIN_KUBECONFIG,
                  alice=cluster.USER_A_KUBECONFIG)
    finally:
        unregister(hook)
        if svc:
            svc.stop()
        delete_bindings(bindings)
        kc("delete", "policybundle", f"e2e-{run}", f"e2e-{run}-bulk", "--ignore-not-found", "--wait=false")
        kc("delete", "namespace", ns, bulk, "--ignore-not-found", "--wait=false")


# ---------------------------------------------------------------------------------------------
# kubectl apply: admitted, mutated, injected, used by the real Trainer, garbage-collected
# ---------------------------------------------------------------------------------------------
def _job_pods(ns: str, job: str) -> list[dict]:
    p = kc("get", "pods", "-n", ns, "-l", f"{JOBSET_NAME}={job}", "-o", "json")
    return json.loads(p.stdout)["items"] if p.returncode == 0 else []


@pytest.mark.oldest
def test_apply_admits_mutates_and_injects_what_trainer_uses(e2e):
    ns, name = e2e.ns, "resnet-allreduce"
    p = submit(trainjob(name, ns), verb="apply")
    assert p.returncode == 0, p.stderr
    tj = get("trainjob", name, ns)

    # the mutating webhook's patch is in the stored object: Istio off in our runtimePatch; no queue
    # label, since this namespace has no LocalQueue "default" (Kueue would hold the job for ever)
    assert QUEUE_LABEL not in (tj["metadata"].get("labels") or {})
    ours = [rp for rp in tj["spec"].get("runtimePatches", []) if rp.get("manager") == MANAGER]
    assert len(ours) == 1, tj["spec"].get("runtimePatches")
    patched = {rj["name"]: rj["template"]["spec"]["template"]["metadata"]
               for rj in ours[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]}
    assert set(patched) == {"node", "launcher"}
    for meta in patched.values():
        assert meta["labels"][ISTIO] == "false" and meta["annotations"][ISTIO] == "false"

    # the Secret is ours: our labels and annotation, our key type (RSA-4096; Trainer makes P-521)
    secret = wait("the injected Secret", lambda: get("secret", f"{name}-mpi-ssh-auth", ns))
    assert secret["type"] == "kubernetes.io/ssh-auth"
    assert secret["metadata"]["labels"][MANAGED_BY[0]] == MANAGED_BY[1]
    assert secret["metadata"]["annotations"]["trainjob-admission.io/job"] == f"TrainJob/{name}"
    key = serialization.load_pem_private_key(base64.b64decode(secret["data"]["ssh-privatekey"]), None)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 4096
    pub = base64.b64decode(secret["data"]["ssh-publickey"])
    assert pub.startswith(b"ssh-rsa ") and pub.endswith(b"\n")
    fp = secret["metadata"]["annotations"]["trainjob-admission.io/ssh-key-fingerprint"]
    assert fp == keys.fingerprint(pub)
    logged = [i for r in e2e.svc.records() if r["endpoint"] == "validate" and r["name"] == name
              for i in r["injections"] if i["kind"] == "Secret"]
    assert logged == [{"kind": "Secret", "name": f"{name}-mpi-ssh-auth", "namespace": ns, "status": "created",
                       "keyType": "rsa-4096", "fingerprint": fp}], logged

    # the real Trainer built the JobSet around our Secret (mounted, not replaced)
    js = wait("the JobSet", lambda: get("jobset", name, ns))
    mounted = {v["secret"]["secretName"] for rj in js["spec"]["replicatedJobs"]
               for v in rj["template"]["spec"]["template"]["spec"].get("volumes", []) if "secret" in v}
    assert f"{name}-mpi-ssh-auth" in mounted, mounted
    for rj in js["spec"]["replicatedJobs"]:  # Trainer applied our runtimePatch to the pod templates
        assert rj["template"]["spec"]["template"]["metadata"]["labels"][ISTIO] == "false"
    # Trainer builds the hostfile after the Secret: once it exists, Trainer has passed the point
    # where it would have written its own keys.
    wait("the hostfile ConfigMap", lambda: get("configmap", f"{name}-mpi-hostfile", ns))
    after = get("secret", f"{name}-mpi-ssh-auth", ns)
    assert after["data"] == secret["data"], "the Secret's key data changed after the JobSet appeared"

    # once the TrainJob exists, the reconciler makes it the owner, so the GC can remove the Secret
    uid = tj["metadata"]["uid"]
    for kind, obj in (("secret", f"{name}-mpi-ssh-auth"), ("networkpolicy", f"{name}-mpi-isolation")):
        wait(f"{kind} owned by the TrainJob", lambda: any(
            o["uid"] == uid for o in (get(kind, obj, ns) or {}).get("metadata", {}).get("ownerReferences", [])), 30)

    # the NetworkPolicy selects exactly this job's pods (KWOK runs them), and not another job's
    other = "other-job"
    assert submit(trainjob(other, ns, nodes=2, gpus=0)).returncode == 0
    pods = wait("4 pods of the job", lambda: (lambda ps: len(ps) >= 4 and ps)(_job_pods(ns, name)), 90)
    other_pods = wait("pods of the other job", lambda: _job_pods(ns, other), 90)
    netpol = get("networkpolicy", f"{name}-mpi-isolation", ns)
    assert netpol["metadata"]["labels"][MANAGED_BY[0]] == MANAGED_BY[1]
    sel = netpol["spec"]["podSelector"]
    everyone = json.loads(kc("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    selected = {p["metadata"]["name"] for p in everyone if label_selector_matches(sel, p["metadata"]["labels"])}
    assert selected == {p["metadata"]["name"] for p in pods}, (sel, selected)
    assert not any(label_selector_matches(sel, p["metadata"]["labels"]) for p in other_pods)
    peers = netpol["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert peers == sel
    assert all(p["metadata"]["labels"].get(ISTIO) == "false" for p in pods)

    # deleting the TrainJob: the garbage collector removes the Secret and the NetworkPolicy
    d = kc("delete", "trainjob", name, "-n", ns, "--wait=true", "--timeout=60s", timeout=90)
    assert d.returncode == 0, d.stderr
    for kind, obj in (("secret", f"{name}-mpi-ssh-auth"), ("networkpolicy", f"{name}-mpi-isolation")):
        wait(f"{kind}/{obj} garbage-collected", lambda: get(kind, obj, ns) is None, 60)
    kc("delete", "trainjob", other, "-n", ns, "--wait=false")


# ---------------------------------------------------------------------------------------------
# Denied: kubectl prints our message (the numbers and the fix); nothing is created
# ---------------------------------------------------------------------------------------------
DENIED = {
    # 9 nodes x 4 GPUs = 36 GPUs against a quota of 32
    "over-quota": (lambda ns: trainjob("over-quota", ns, nodes=9, gpus=4),
                   [f"quota \"compute\" in {{ns}} allows {QUOTA_GPUS}", "36", "set spec.trainer.numNodes to"]),
    "too-many-gpus": (lambda ns: trainjob("too-many-gpus", ns, nodes=1, gpus=9),
                      ["requests 9 nvidia.com/gpu; the limit is 8 per node", "to 8 or less"]),
    "privileged": (lambda ns: trainjob("privileged", ns, nodes=2, gpus=0, runtime="mpi-privileged"),
                   ['violates Pod Security "baseline"', "privileged is true", ": remove privileged: true"]),
}


@pytest.mark.oldest
@pytest.mark.parametrize("case", sorted(DENIED))
def test_denied_with_our_message_and_nothing_created(e2e, case):
    make, expected = DENIED[case]
    obj = make(e2e.ns)
    err = denial(submit(obj))
    for text in expected:
        assert text.format(ns=e2e.ns) in err, err
    nothing_created(e2e.ns, obj["metadata"]["name"])


def test_one_record_per_answer_and_deletions_recorded(e2e):
    """Issue 31: the /mutate record of a refused submission says what /mutate answered (allowed, no
    message), so `decisions query` counts the refusal once; a deletion is recorded by the DELETE
    entry with who deleted the job and where it stood."""
    refused, kept = "counted-once", "deleted-by-alice"
    err = denial(submit(trainjob(refused, e2e.ns, nodes=9, gpus=4), kubeconfig=e2e.alice))
    assert "quota" in err
    assert submit(trainjob(kept, e2e.ns, nodes=2, gpus=0), kubeconfig=e2e.alice).returncode == 0
    d = kc("delete", "trainjob", kept, "-n", e2e.ns, "--wait=false", kubeconfig=e2e.alice)
    assert d.returncode == 0, d.stderr
    mine = wait("the deletion's record", lambda: (lambda rs: rs if any(r.get("operation") == "DELETE" for r in rs)
                                                  else None)([r for r in e2e.svc.records()
                                                               if r.get("name") in (refused, kept)]), 30)
    by = {(r["name"], r["endpoint"], r["operation"]): r for r in mine}
    assert by[(refused, "mutate", "CREATE")]["allowed"] is True and by[(refused, "mutate", "CREATE")]["messages"] == []
    assert by[(refused, "validate", "CREATE")]["decision"] == "deny"
    deleted = by[(kept, "validate", "DELETE")]
    assert deleted["user"] == "alice" and deleted["allowed"] is True and deleted["kind"] == "TrainJob"
    assert deleted["jobStatus"]["state"] in ("Pending", "Running"), deleted  # KWOK may have started its pods
    log = e2e.svc.decision_log
    counted = subprocess.run([str(CLI), "decisions", "query", "--log", str(log), "--name", refused, "-o", "json"],
                             capture_output=True, text=True, timeout=60)
    assert [r["endpoint"] for r in json.loads(counted.stdout)] == ["validate"], counted.stdout + counted.stderr
    deletions = subprocess.run([str(CLI), "decisions", "query", "--log", str(log), "--operation", "DELETE",
                                "--name", kept, "-o", "json"], capture_output=True, text=True, timeout=60)
    # The API server asks /validate again when the job changed between its cached read and the delete
    # (Trainer writing its status): etcd3's conditionalDelete re-runs the deletion's validation on the
    # current object. Each ask is its own answer and its own record; all of them name alice.
    users = [r["user"] for r in json.loads(deletions.stdout)]
    assert users and set(users) == {"alice"}, deletions.stdout + deletions.stderr


def test_server_dry_run_of_an_allowed_job_creates_nothing(e2e):
    name = "dry-run"
    before = len(e2e.svc.records())
    p = submit(trainjob(name, e2e.ns), extra=("--dry-run=server", "-o", "json"))
    assert p.returncode == 0, p.stderr
    shown = json.loads(p.stdout)
    assert any(rp.get("manager") == MANAGER for rp in shown["spec"]["runtimePatches"])  # mutated in the dry run too
    nothing_created(e2e.ns, name)
    recs = [r for r in e2e.svc.records()[before:] if r.get("name") == name]
    assert recs and all(r.get("dryRun") for r in recs), recs


def test_only_the_api_servers_client_certificate_reaches_the_webhook(e2e):
    """The service runs with --client-ca (start_service); kube-apiserver presents its webhook client
    certificate (hack/cluster/cluster.py's AdmissionConfiguration). Its calls are answered and
    recorded as authenticated; a caller without a certificate, or with alice's cluster client
    certificate (another CA), is refused in the TLS handshake and leaves no record."""
    name = "mtls-caller"
    before = len(e2e.svc.records())
    p = submit(trainjob(name, e2e.ns))
    assert p.returncode == 0, p.stderr
    recs = [r for r in e2e.svc.records()[before:] if r.get("name") == name]
    assert {r["endpoint"] for r in recs} == {"mutate", "validate"}, recs
    assert {(r["caller"]["authenticated"], r["caller"]["subject"]) for r in recs} == {
        (True, cluster.WEBHOOK_CLIENT_CN)}
    alice = (cluster.RUN / "pki/user-a.crt", cluster.RUN / "pki/user-a.key")  # signed by the cluster's CA
    assert alice[0].exists(), "cluster.py no longer writes alice's client certificate there"

    def client(cert: tuple[Path, Path] | None):
        def make() -> ssl.SSLContext:
            ctx = ssl.create_default_context(cadata=e2e.svc.ca_pem.decode())
            if cert:
                ctx.load_cert_chain(*cert)
            return ctx
        return make

    before = len(e2e.svc.records())
    for cert in (None, alice):
        refused_at_tls(e2e.svc.port, client(cert))
    assert len(e2e.svc.records()) == before
    # the kubelet's probes need no certificate: the probe port
    with urllib.request.urlopen(f"{e2e.svc.probe_url}/readyz", context=client(None)(), timeout=10) as reply:
        assert reply.status == 200


# ---------------------------------------------------------------------------------------------
# The Kubeflow SDK (TrainerClient, Kubernetes backend) as alice: the same decisions as kubectl
# ---------------------------------------------------------------------------------------------
def _sdk_client(e2e):
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    return TrainerClient(backend_config=KubernetesBackendConfig(namespace=e2e.ns, config_file=str(e2e.alice)))


def _sdk_train(client, name: str, *, nodes: int, gpus: int, options=()):
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import Name

    res = {"cpu": "1", "memory": "2Gi"} | ({"gpu": gpus} if gpus else {})
    trainer = CustomTrainerContainer(image="quay.io/acme-ml/horovod-resnet:0.28", num_nodes=nodes,
                                     resources_per_node=res)
    return client.train(runtime="mpi-openmpi", trainer=trainer, options=[Name(name=name), *options])


def _privileged_launcher():
    from kubeflow.trainer.options.kubernetes import (
        ContainerPatch, JobSetSpecPatch, JobSetTemplatePatch, JobSpecPatch, JobTemplatePatch, PodSpecPatch,
        PodTemplatePatch, ReplicatedJobPatch, RuntimePatch, TrainingRuntimeSpecPatch)

    container = ContainerPatch(name="node", security_context={"privileged": True})
    launcher = ReplicatedJobPatch(name="launcher", template=JobTemplatePatch(spec=JobSpecPatch(
        template=PodTemplatePatch(spec=PodSpecPatch(containers=[container])))))
    return RuntimePatch(training_runtime_spec=TrainingRuntimeSpecPatch(
        template=JobSetTemplatePatch(spec=JobSetSpecPatch(replicated_jobs=[launcher]))))


@pytest.mark.oldest
def test_sdk_train_is_admitted_and_injected(e2e):
    client = _sdk_client(e2e)
    name = _sdk_train(client, "sdk-ok", nodes=4, gpus=1)
    assert name == "sdk-ok"
    tj = get("trainjob", name, e2e.ns)
    managers = [rp["manager"] for rp in tj["spec"]["runtimePatches"]]
    assert MANAGER in managers
    secret = wait("the injected Secret", lambda: get("secret", f"{name}-mpi-ssh-auth", e2e.ns))
    assert secret["metadata"]["labels"][MANAGED_BY[0]] == MANAGED_BY[1]
    assert get("networkpolicy", f"{name}-mpi-isolation", e2e.ns) is not None
    assert [j.name for j in client.list_jobs()].count(name) == 1  # the SDK reads back what it made
    client.delete_job(name)


SDK_DENIED = {
    "over-quota": (dict(nodes=9, gpus=4), (), [f"allows {QUOTA_GPUS}", "36", "set spec.trainer.numNodes to"]),
    "too-many-gpus": (dict(nodes=1, gpus=9), (), ["requests 9 nvidia.com/gpu; the limit is 8 per node"]),
    "privileged": (dict(nodes=2, gpus=0), "privileged", ['violates Pod Security "baseline"', "privileged is true"]),
}


@pytest.mark.oldest
@pytest.mark.parametrize("case", sorted(SDK_DENIED))
def test_sdk_train_denied_carries_our_message(e2e, case):
    from kubernetes.client.exceptions import ApiException

    shape, extra, expected = SDK_DENIED[case]
    name = f"sdk-{case}"
    options = (_privileged_launcher(),) if extra == "privileged" else ()
    with pytest.raises(RuntimeError) as info:
        _sdk_train(_sdk_client(e2e), name, options=options, **shape)
    # TrainerClient wraps the API error: RuntimeError("Failed to create TrainJob ...") from ApiException
    cause = info.value.__cause__
    assert isinstance(cause, ApiException), repr(cause)
    body = json.loads(cause.body)
    assert body["reason"] != "AlreadyExists" and "denied the request" in body["message"], body
    for text in expected:
        assert text in body["message"], body["message"]
    nothing_created(e2e.ns, name)


# ---------------------------------------------------------------------------------------------
# RBAC: an ordinary user (alice, `edit` in the job namespace) cannot touch bundles or decisions
# ---------------------------------------------------------------------------------------------
def test_alice_cannot_edit_bundles_or_read_decisions(e2e):
    bundle = f"e2e-{e2e.ns.removeprefix('e2e-')}"
    for verb in ("create", "patch", "delete"):
        p = kc("auth", "can-i", verb, "policybundles.policy.trainjob-admission.io", kubeconfig=e2e.alice)
        assert p.stdout.strip() == "no", (verb, p.stdout, p.stderr)
    assert kc("auth", "can-i", "create", "trainjobs", "-n", e2e.ns, kubeconfig=e2e.alice).stdout.strip() == "yes"

    mine = yaml.safe_load((REPO / "policies/bundle/builtin/default.yaml").read_text())
    mine["metadata"] = {"name": f"{bundle}-alice"}
    mine["spec"]["mode"] = "audit"
    p = submit(mine, kubeconfig=e2e.alice)
    assert p.returncode != 0 and "Forbidden" in p.stderr and "policybundles" in p.stderr, p.stderr
    p = kc("patch", "policybundle", bundle, "--type=merge", "-p", '{"spec":{"mode":"audit"}}', kubeconfig=e2e.alice)
    assert p.returncode != 0 and "Forbidden" in p.stderr, p.stderr
    assert get("policybundle", f"{bundle}-alice", "default") is None
    assert json.loads(kc("get", "policybundle", bundle, "-o", "json").stdout)["spec"]["mode"] == "enforce"

    # the decision log of every namespace is the service's output, in the service namespace
    for what in (("pods", "--subresource=log"), ("pods",)):
        p = kc("auth", "can-i", "get", *what, "-n", "trainjob-admission", kubeconfig=e2e.alice)
        assert p.stdout.strip() == "no", (what, p.stdout)
    p = kc("logs", "-n", "trainjob-admission", "deployment/trainjob-admission", kubeconfig=e2e.alice)
    assert p.returncode != 0 and "Forbidden" in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------------
# Legacy kubeflow.org/v2beta1 MPIJob (CRD from the mpi-operator module)
# ---------------------------------------------------------------------------------------------
def test_legacy_mpijob_gets_the_policies_and_a_deprecation_warning(e2e):
    bad = denial(submit(mpijob("legacy-bad", e2e.ns, privileged=True)))
    assert "privileged is true" in bad and "spec.mpiReplicaSpecs.Launcher.template" in bad, bad
    nothing_created(e2e.ns, "legacy-bad", kind="mpijob")

    p = submit(mpijob("legacy-ok", e2e.ns))
    assert p.returncode == 0, p.stderr
    assert "Warning:" in p.stderr and "kubeflow.org/v2beta1 MPIJob is deprecated" in p.stderr, p.stderr
    stored = get("mpijob", "legacy-ok", e2e.ns)
    assert QUEUE_LABEL not in (stored["metadata"].get("labels") or {})  # no LocalQueue "default" here
    for role in ("Launcher", "Worker"):
        meta = stored["spec"]["mpiReplicaSpecs"][role]["template"]["metadata"]
        assert meta["labels"][ISTIO] == "false", meta
    kc("delete", "mpijob", "legacy-ok", "-n", e2e.ns, "--wait=false")


# ---------------------------------------------------------------------------------------------
# 50 submissions at once: every one decided as expected and in the decision log, which verifies
# ---------------------------------------------------------------------------------------------
def test_fifty_concurrent_submissions_all_decided_and_logged(e2e):
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    conf = client.Configuration()
    config.load_kube_config(config_file=str(e2e.admin), client_configuration=conf)
    conf.connection_pool_maxsize = 50  # one connection per thread: all 50 really in flight at once
    api = client.CustomObjectsApi(client.ApiClient(conf))
    ns, run = e2e.bulk_ns, uuid.uuid4().hex[:4]
    jobs = {}
    for i in range(50):
        bad = i % 5 == 0  # 10 of 50: 9 GPUs per node
        jobs[f"burst-{run}-{i:02d}"] = trainjob(f"burst-{run}-{i:02d}", ns, nodes=2, gpus=9 if bad else 1,
                                                suspend=True)

    def create(obj):
        try:
            api.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", obj,
                                                _request_timeout=60)
            return "allowed", ""
        except ApiException as exc:
            return "denied", exc.body or str(exc)

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=50) as pool:
        results = dict(zip(jobs, pool.map(create, jobs.values())))
    elapsed = time.monotonic() - t0
    wrong = {}
    for name, (outcome, body) in results.items():
        want = "denied" if jobs[name]["spec"]["trainer"]["resourcesPerNode"]["limits"][GPU] == "9" else "allowed"
        if outcome != want or (want == "denied" and "the limit is 8 per node" not in body):
            wrong[name] = json.loads(body)["message"][-300:] if body.startswith("{") else body[-300:]
    assert not wrong, f"{len(wrong)} of 50 not decided as expected in {elapsed:.1f} s: {json.dumps(wrong, indent=1)}"
    print(f"\n50 concurrent submissions decided in {elapsed:.1f} s")

    # every submission has its /validate decision in the log, with the outcome the client saw
    validate = {r["name"]: r for r in e2e.svc.records() if r["endpoint"] == "validate" and r["name"] in jobs}
    assert set(validate) == set(jobs)
    for name, rec in validate.items():
        assert rec["allowed"] == (results[name][0] == "allowed"), rec
        assert rec["namespace"] == ns and rec["user"] == "kubernetes-admin"
        if rec["allowed"]:  # no writes at admission: the key type is Trainer's own, the policy follows the job
            assert {(i["kind"], i["status"]) for i in rec["injections"]} == {
                ("Secret", "left-to-trainer" if BULK_KEY_TYPE == injections.TRAINER_KEY_TYPE else "created"),
                ("NetworkPolicy", "deferred")}, rec["injections"]
    # every admitted job gets its NetworkPolicy once stored, owned by it from its creation
    admitted = {name: get("trainjob", name, ns)["metadata"]["uid"] for name, (outcome, _) in results.items()
                if outcome == "allowed"}

    def unowned() -> list[str]:
        owners = {p["metadata"]["name"]: [r["uid"] for r in p["metadata"].get("ownerReferences") or []]
                  for p in json.loads(kc("get", "networkpolicy", "-n", ns, "-o", "json").stdout)["items"]}
        return [name for name, uid in admitted.items() if owners.get(f"{name}-mpi-isolation") != [uid]]
    wait("every admitted job's NetworkPolicy, owned by its job", lambda: not unowned(), timeout=60)
    p = subprocess.run([str(CLI), "decisions", "verify", "--log", str(e2e.svc.decision_log)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
