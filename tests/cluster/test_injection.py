"""Injection against the real control plane: our webhook (in-process, real TLS, registered with
the apiserver for the test namespace only) creates the SSH key Secret on `kubectl create` when the
bundle's key type is not Trainer's own, and the real Trainer controller uses it; with Trainer's own
type Trainer makes it and a planted one denies the job. The job's NetworkPolicy is created once the
job is stored, owned by it; the reconciler owner-references the Secret to the TrainJob and the
garbage collector deletes both with it; orphans go after a grace period; a Secret the service did
not make for the job denies it (unless the bundle adopts it), and dry runs, denied jobs and forged
copies are left alone."""
from __future__ import annotations

import asyncio
import base64
import functools
import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.k8s.clusterstate import ClusterState
from tests.support import objects
from trainjob_admission.webhook.admission.config import ServerConfig
from trainjob_admission.webhook.admission.server import WebhookServer
from trainjob_admission.webhook.decisionlog import DecisionLog
from trainjob_admission.policies.decide.engine import injection_plan
from trainjob_admission.webhook.inject import injector as injector_module
from trainjob_admission.webhook.inject.existing import ExistingObjects, age
from trainjob_admission.webhook.inject.injector import Injector
from trainjob_admission.webhook.inject.isolation import Isolation
from trainjob_admission.webhook.inject.keys import fingerprint, generate
from trainjob_admission.webhook.inject.provenance import ANNOTATION, Provenance
from trainjob_admission.webhook.inject.reconciler import Reconciler
from trainjob_admission.webhook.kube import watch as kube_watch
from trainjob_admission.webhook.kube.client import api_client

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BUNDLE = REPO / "policies" / "bundle" / "builtin" / "default.yaml"
RUNTIME_FILE = REPO / "examples" / "runtimes" / "mpi-openmpi.yaml"
MANAGED_BY = ("app.kubernetes.io/managed-by", "trainjob-admission")
PROVENANCE = Provenance([b"cluster-tier provenance key, 32+ bytes"])  # the harness's and the reconcilers'


# A TrainJob on mpi-openmpi: 4 nodes, each requesting 1 CPU and 1Gi, limited to 1 GPU; privileged:
# the node container asks for privileged through a runtimePatch.
trainjob = functools.partial(objects.trainjob, memory="1Gi", manager="trainjob-admission.test/privileged")


class Harness:
    """The webhook server as serve composes it (the watches of what exists under our names, the
    NetworkPolicies' maker; with ``reconciler``, that and the maker run) on its own event loop in a
    thread, for ``namespace`` only."""

    def __init__(self, tmp_path: Path, cert: Path, key: Path, api, namespace: str,
                 reconciler: Reconciler | None = None, adopt: bool = False, key_type: str = "ed25519"):
        runtime = objects.runtime()  # examples/runtimes/mpi-openmpi.yaml
        self.log_path = tmp_path / "decisions.jsonl"
        # By default Ed25519 keys: unlike Trainer's own P-521, the service creates them, so a mounted key is provably ours.
        bundle = yaml.safe_load(DEFAULT_BUNDLE.read_text())
        bundle["spec"]["injections"]["sshKey"]["type"] = key_type
        bundle["spec"]["injections"]["sshKey"]["adoptExisting"] = adopt
        (tmp_path / "bundle.yaml").write_text(yaml.safe_dump(bundle))
        config = ServerConfig(host="127.0.0.1", port=0, cert_file=cert, key_file=key, decision_log=self.log_path,
                              bundle_specs=[str(tmp_path / "bundle.yaml")])
        config.reviewer.timeout_seconds = 10
        config.reviewer.webhook_timeout_seconds = 20  # as registered (the webhook fixture)
        state = ClusterState.from_objects([runtime])
        state.replace("LocalQueue", [])  # as its watch finds them here: none, so no queue label
        self.existing = ExistingObjects(api, [namespace])
        for watcher in self.existing.watchers:
            watcher.start()
        for watcher in self.existing.watchers:
            assert watcher.synced.wait(30), f"{watcher.resource.plural} never listed"
        self.isolation = Isolation(api, PROVENANCE, self.existing, wanted=lambda: None,
                                   planner=lambda job: injection_plan(job, list(self.server.registry.active), state))
        self.server = WebhookServer(config, state, injector=Injector(api, PROVENANCE, timeout=5.0, existing=self.existing,
                                                                     isolation=self.isolation),
                                    decision_log=DecisionLog(self.log_path, stdout=None))
        self.reconciler = reconciler
        if reconciler is not None:
            reconciler.isolation = self.isolation
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._tasks: list[asyncio.Task] = []
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.port = self.loop.run_until_complete(self.server.start())
            if reconciler is not None:
                self._tasks = [self.loop.create_task(reconciler.run()), self.loop.create_task(self.isolation.run())]
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(30), "webhook server did not start"

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        async def shutdown() -> None:
            for task in self._tasks:
                task.cancel()
            await self.server.stop()
        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        for watcher in self.existing.watchers:
            watcher.close()


@pytest.fixture(scope="module")
def mpi_runtime(control_plane):
    control_plane.module.kubectl("apply", "-f", str(RUNTIME_FILE))
    return "mpi-openmpi"


@pytest.fixture
def api(control_plane):
    return api_client(str(control_plane.admin_kubeconfig))


@pytest.fixture
def webhook(mpi_runtime, namespace, serving_cert, register_webhook, api, tmp_path):
    """start(reconciler=None, adopt=False, key_type="ed25519") -> Harness registered as the webhook
    for `namespace` only; ``adopt`` sets the bundle's sshKey.adoptExisting."""
    harnesses = []

    def start(reconciler: Reconciler | None = None, adopt: bool = False, key_type: str = "ed25519") -> Harness:
        cert, key, ca_pem = serving_cert()
        harness = Harness(tmp_path, cert, key, api, namespace, reconciler, adopt, key_type)
        harnesses.append(harness)
        register_webhook(f"inject-{namespace}", f"https://127.0.0.1:{harness.port}", ca_pem,
                         side_effects="NoneOnDryRun", timeout_seconds=20,
                         namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}})
        return harness

    yield start
    for harness in harnesses:
        harness.stop()


def exists(kubectl, kind: str, name: str, ns: str) -> bool:
    result = kubectl("get", kind, name, "-n", ns, check=False)
    if result.returncode != 0 and "NotFound" not in result.stderr:
        raise AssertionError(result.stderr)
    return result.returncode == 0


def create(kubectl, obj: dict, *args: str, check: bool = True):
    return kubectl("create", "-f", "-", *args, input=json.dumps(obj), check=check)


def secret_fingerprint(secret: dict) -> str:
    return fingerprint(base64.b64decode(secret["data"]["ssh-publickey"]))


def owned_by(obj: dict, uid: str) -> bool:
    return any(r["uid"] == uid and r["kind"] == "TrainJob" and r.get("controller")
               for r in obj["metadata"].get("ownerReferences") or [])


def test_injected_objects_are_used_by_trainer_owned_by_the_job_and_collected(
        webhook, namespace, kubectl, get_json, wait_for, api, monkeypatch):
    ns = namespace
    # No sweep and no grace period end during the test: the ownerReference must come from the
    # watches (the jobs' and our objects'), which expire every second here and must resume each time.
    monkeypatch.setattr(kube_watch, "WATCH_SECONDS", 1)
    reconciler = Reconciler(api, PROVENANCE, grace_seconds=3600, interval=3600, namespace=ns)
    harness = webhook(reconciler, key_type="rsa-4096")  # an RSA key: provably ours, not Trainer's EC one
    time.sleep(3)
    create(kubectl, trainjob("resnet", ns))
    job = get_json("trainjob", "resnet", "-n", ns)
    uid = job["metadata"]["uid"]
    assert any(rp.get("manager") == "trainjob-admission.io/webhook"  # our mutation reached storage
               for rp in job["spec"]["runtimePatches"])

    secret = get_json("secret", "resnet-mpi-ssh-auth", "-n", ns)
    meta = secret["metadata"]
    assert meta["labels"][MANAGED_BY[0]] == MANAGED_BY[1]
    assert meta["labels"]["jobset.sigs.k8s.io/jobset-name"] == "resnet"
    assert meta["annotations"]["trainjob-admission.io/job"] == "TrainJob/resnet"
    # made for this submission: the admission id /mutate put on the job, where the creations began
    admission = job["metadata"]["annotations"]["trainjob-admission.io/admission-id"]
    assert meta["annotations"]["trainjob-admission.io/admission-id"] == admission
    mutated = next(r for r in harness.records() if r["id"] == admission)
    assert mutated["endpoint"] == "mutate" and {i["status"] for i in mutated["injections"]} == {"started"}
    assert meta["annotations"]["trainjob-admission.io/ssh-key-type"] == "rsa-4096"
    assert secret["type"] == "kubernetes.io/ssh-auth" and secret["immutable"] is True
    private = base64.b64decode(secret["data"]["ssh-privatekey"])
    assert private.startswith(b"-----BEGIN RSA PRIVATE KEY-----")  # Trainer's own would be an EC P-521 key
    public = base64.b64decode(secret["data"]["ssh-publickey"])
    assert public.startswith(b"ssh-rsa ") and public.endswith(b"\n") and len(public.split()) == 2
    fp = secret_fingerprint(secret)
    assert meta["annotations"]["trainjob-admission.io/ssh-key-fingerprint"] == fp

    record = next(r for r in harness.records() if r["endpoint"] == "validate" and r["name"] == "resnet")
    assert record["decision"] == "allow"
    by_name = {i["name"]: i for i in record["injections"]}
    secret_record = by_name["resnet-mpi-ssh-auth"]
    assert secret_record["status"] == "created" and secret_record["fingerprint"] == fp
    assert secret_record["keyType"] == "rsa-4096" and by_name["resnet-mpi-isolation"]["status"] == "deferred"
    # the first job in the namespace found it without its isolating NetworkPolicy: admission made it
    assert by_name["trainjob-admission-trainjob-isolation"]["status"] == "created"
    isolating = get_json("networkpolicy", "trainjob-admission-trainjob-isolation", "-n", ns)
    assert isolating["spec"] == {"podSelector": {"matchExpressions": [
        {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}, "policyTypes": ["Ingress"]}
    assert b"PRIVATE KEY" not in harness.log_path.read_bytes()

    # The real Trainer builds the JobSet, mounts <job>-mpi-ssh-auth and leaves our keys alone.
    jobset = wait_for("JobSet resnet", lambda: exists(kubectl, "jobset", "resnet", ns)
                      and get_json("jobset", "resnet", "-n", ns), 60)
    volumes = [v for rj in jobset["spec"]["replicatedJobs"] for v in rj["template"]["spec"]["template"]["spec"]["volumes"]]
    assert {v["secret"]["secretName"] for v in volumes if "secret" in v} == {"resnet-mpi-ssh-auth"}
    wait_for("hostfile ConfigMap (Trainer finished the MPI objects)",
             lambda: exists(kubectl, "configmap", "resnet-mpi-hostfile", ns), 60)
    after = get_json("secret", "resnet-mpi-ssh-auth", "-n", ns)
    assert after["metadata"]["uid"] == meta["uid"] and after["data"] == secret["data"]
    assert secret_fingerprint(after) == fp
    # Had Trainer's cache missed our Secret, its forced server-side apply of fresh keys is refused.
    theirs = generate("ecdsa-p521")
    forced = kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=trainer", "-f", "-", check=False,
                     input=json.dumps({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
                                       "metadata": {"name": "resnet-mpi-ssh-auth", "namespace": ns},
                                       "immutable": True, "data": {
                                           "ssh-privatekey": base64.b64encode(theirs.private_pem).decode(),
                                           "ssh-publickey": base64.b64encode(theirs.public_openssh).decode()}}))
    assert forced.returncode != 0 and "immutable" in forced.stderr, forced.stdout + forced.stderr
    assert get_json("secret", "resnet-mpi-ssh-auth", "-n", ns)["data"] == secret["data"]

    # The reconciler adopts the Secret, and creates the NetworkPolicy owned, as soon as the TrainJob appears.
    for kind, name in (("secret", "resnet-mpi-ssh-auth"), ("networkpolicy", "resnet-mpi-isolation")):
        wait_for(f"{kind} {name} owned by the TrainJob", lambda: exists(kubectl, kind, name, ns)
                 and owned_by(get_json(kind, name, "-n", ns), uid), 30)

    # A second `kubectl create` of the same name: its objects belong to the running job, so our
    # webhook refuses it (storage would too) and the running job's keys survive.
    again = create(kubectl, trainjob("resnet", ns), check=False)
    assert again.returncode != 0 and f"Secret {ns}/resnet-mpi-ssh-auth already exists and belongs to TrainJob " \
        f"resnet (uid {uid})" in again.stderr and "rename the job, or delete TrainJob resnet first" in again.stderr, \
        again.stderr
    assert get_json("secret", "resnet-mpi-ssh-auth", "-n", ns)["data"] == secret["data"]
    record = [r for r in harness.records() if r["endpoint"] == "validate" and r["name"] == "resnet"][-1]
    assert {i["name"]: i["status"] for i in record["injections"]} == {
        "resnet-mpi-ssh-auth": "refused", "resnet-mpi-isolation": "deferred"}, record["injections"]

    # The NetworkPolicy selects exactly the job's pods: every pod of its Jobs, and nothing else.
    policy = get_json("networkpolicy", "resnet-mpi-isolation", "-n", ns)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    # The launcher Job dependsOn the node Job being ready, so JobSet creates it second.
    def both_jobs():
        items = get_json("jobs", "-n", ns)["items"]
        names = {j["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] for j in items}
        return items if names == {"node", "launcher"} else None
    jobs = wait_for("the JobSet's node and launcher Jobs", both_jobs, 90)
    for j in jobs:
        labels = j["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), (selector, labels)
    stranger = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stranger", "namespace": ns,
                                                                 "labels": {"app": "other"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    create(kubectl, stranger)
    pods = wait_for("the job's pods", lambda: [p for p in get_json("pods", "-n", ns)["items"]
                                              if p["metadata"]["name"] != "stranger"], 60)
    job_names = {j["metadata"]["name"] for j in jobs}
    for pod in get_json("pods", "-n", ns)["items"]:
        selected = selector.items() <= (pod["metadata"].get("labels") or {}).items()
        of_job = any(r["kind"] == "Job" and r["name"] in job_names for r in pod["metadata"].get("ownerReferences") or [])
        assert selected == of_job, pod["metadata"]
    assert pods

    # Deleting the TrainJob: the garbage collector removes both.
    kubectl("delete", "trainjob", "resnet", "-n", ns, "--wait=true", "--timeout=60s", timeout=90)
    for kind, name in (("secret", "resnet-mpi-ssh-auth"), ("networkpolicy", "resnet-mpi-isolation")):
        wait_for(f"{kind} {name} garbage-collected", lambda: not exists(kubectl, kind, name, ns), 90)


def test_an_owner_reference_that_only_names_the_job_is_replaced_by_the_jobs(webhook, namespace, kubectl, get_json,
                                                                             wait_for, api, monkeypatch):
    """Issue 30: the reconciler took any ownerReference of the job's kind and name for the job's.
    One naming a look-alike (another API group: the garbage collector cannot resolve it, so it
    never deletes the object for it) made it skip the object for good, and the object outlived its
    job. Now owned means by the job's uid: the policy is made again, owned by the job (deleted and
    created: the service has no patch on NetworkPolicies)."""
    ns = namespace
    monkeypatch.setattr(kube_watch, "WATCH_SECONDS", 1)
    webhook(Reconciler(api, PROVENANCE, grace_seconds=3600, interval=3600, namespace=ns))
    time.sleep(3)
    create(kubectl, trainjob("lookalike", ns))
    uid = get_json("trainjob", "lookalike", "-n", ns)["metadata"]["uid"]
    name = "lookalike-mpi-isolation"
    wait_for("the NetworkPolicy owned by the TrainJob", lambda: owned_by(get_json("networkpolicy", name, "-n", ns), uid),
             30)
    impostor = {"apiVersion": "example.com/v1", "kind": "TrainJob", "name": "lookalike",
                "uid": "00000000-0000-0000-0000-000000000001", "controller": True}
    kubectl("patch", "networkpolicy", name, "-n", ns, "--type=json", "-p", json.dumps([
        {"op": "replace", "path": "/metadata/ownerReferences", "value": [impostor]}]))
    def owned_by_the_job() -> bool:
        found = kubectl("get", "networkpolicy", name, "-n", ns, "-o", "json", check=False)
        if found.returncode != 0:  # deleted, not made again yet
            return False
        refs = json.loads(found.stdout)["metadata"].get("ownerReferences") or []
        return [r["uid"] for r in refs] == [uid] and refs[0]["controller"]
    wait_for("the job's policy made again in place of the look-alike's", owned_by_the_job, 30)
    kubectl("delete", "trainjob", "lookalike", "-n", ns, "--wait=true", "--timeout=60s", timeout=90)
    wait_for("the NetworkPolicy garbage-collected with its job", lambda: not exists(kubectl, "networkpolicy", name, ns),
             90)


def ssh_secret(name: str, ns: str, pair, **metadata) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
            "metadata": {"name": name, "namespace": ns, **metadata},
            "data": {"ssh-privatekey": base64.b64encode(pair.private_pem).decode(),
                     "ssh-publickey": base64.b64encode(pair.public_openssh).decode()}}


def planted_key_is_refused(harness: Harness, kubectl, ns: str, job: str, alice, wait_for) -> None:
    """alice plants `<job>-mpi-ssh-auth` with her own key; the job is denied naming it and the fix,
    never stored, and its record says refused with her key's fingerprint."""
    name = f"{job}-mpi-ssh-auth"
    pair = generate("ecdsa-p521")
    kubectl("create", "-f", "-", input=json.dumps(ssh_secret(name, ns, pair)), kubeconfig=alice)
    wait_for("the planted Secret in the service's watch",
             lambda: harness.existing.get("Secret", ns, name) is not None, 30, interval=0.1)
    denied = create(kubectl, trainjob(job, ns), check=False)
    assert denied.returncode != 0 and (
        f"Secret {ns}/{name} already exists and was not created by trainjob-admission for this job: "
        f"delete Secret {ns}/{name} or rename the job") in denied.stderr, denied.stderr
    assert not exists(kubectl, "trainjob", job, ns) and not exists(kubectl, "jobset", job, ns)
    record = [r for r in harness.records() if r["endpoint"] == "validate" and r["name"] == job][-1]
    assert record["decision"] == "deny"
    assert {i["kind"]: (i["status"], i.get("fingerprint")) for i in record["injections"]}["Secret"] == \
        ("refused", pair.fingerprint)


def test_a_planted_secret_or_a_forged_copy_denies_the_job(webhook, namespace, kubectl, user_a_kubeconfig, get_json,
                                                          api, wait_for):
    """alice (edit in her namespace, as any team member) plants her own key as the next job's
    Secret: first bare, then with every label and annotation copied from one of ours. The
    victim's job is denied naming the Secret; Trainer never mounts her key."""
    ns = namespace
    kubectl("create", "rolebinding", "alice-edit", "-n", ns, "--clusterrole=edit", "--user=alice")
    harness = webhook()
    planted_key_is_refused(harness, kubectl, ns, "bert", user_a_kubeconfig, wait_for)

    # A forged copy: the metadata of a real injected Secret, with alice's key and the victim's name.
    create(kubectl, trainjob("real", ns))
    real = get_json("secret", "real-mpi-ssh-auth", "-n", ns)["metadata"]
    annotations = {**real["annotations"], "trainjob-admission.io/job": "TrainJob/ernie"}
    assert ANNOTATION in annotations
    forged = ssh_secret("ernie-mpi-ssh-auth", ns, generate("ecdsa-p521"), labels=real["labels"], annotations=annotations)
    kubectl("create", "-f", "-", input=json.dumps(forged), kubeconfig=user_a_kubeconfig)
    denied = create(kubectl, trainjob("ernie", ns), check=False)
    assert denied.returncode != 0 and f"Secret {ns}/ernie-mpi-ssh-auth already exists and was not created by " \
        "trainjob-admission for this job" in denied.stderr, denied.stderr

    # The reconciler leaves both alone, past any grace period: not provably ours.
    counts = asyncio.run(Reconciler(api, PROVENANCE, grace_seconds=0, namespace=ns).reconcile_once())
    assert counts["skipped"] >= 1 and counts["errors"] == 0, counts
    assert exists(kubectl, "secret", "ernie-mpi-ssh-auth", ns) and exists(kubectl, "secret", "bert-mpi-ssh-auth", ns)


def test_trainer_makes_its_own_kind_of_key_and_a_planted_one_is_refused(webhook, namespace, kubectl,
                                                                        user_a_kubeconfig, get_json, wait_for):
    """The default bundle's key type is Trainer's own (ECDSA P-521): admission creates nothing, the
    real Trainer makes the Secret, owned by the job; a `<job>-mpi-ssh-auth` that alice plants before
    the victim's job is refused from the service's watch of Secrets' metadata (no call), and Trainer
    never mounts it."""
    ns = namespace
    kubectl("create", "rolebinding", "alice-edit", "-n", ns, "--clusterrole=edit", "--user=alice")
    harness = webhook(key_type="ecdsa-p521")
    create(kubectl, trainjob("own", ns))
    uid = get_json("trainjob", "own", "-n", ns)["metadata"]["uid"]
    record = next(r for r in harness.records() if r["endpoint"] == "validate" and r["name"] == "own")
    assert {i["name"]: i["status"] for i in record["injections"]}["own-mpi-ssh-auth"] == "left-to-trainer"
    mutate = next(r for r in harness.records() if r["endpoint"] == "mutate" and r["name"] == "own")
    assert mutate["injections"] == [], "nothing started on /mutate"
    secret = wait_for("Trainer's Secret", lambda: exists(kubectl, "secret", "own-mpi-ssh-auth", ns)
                      and get_json("secret", "own-mpi-ssh-auth", "-n", ns), 60)
    assert owned_by(secret, uid) and MANAGED_BY[0] not in (secret["metadata"].get("labels") or {})
    assert base64.b64decode(secret["data"]["ssh-privatekey"]).startswith(b"-----BEGIN EC PRIVATE KEY-----")

    planted_key_is_refused(harness, kubectl, ns, "victim", user_a_kubeconfig, wait_for)


def test_adopt_existing_keeps_a_foreign_secret_and_kubectl_warns(webhook, namespace, kubectl, get_json, wait_for,
                                                                 api):
    ns = namespace
    harness = webhook(Reconciler(api, PROVENANCE, grace_seconds=3600, interval=3600, namespace=ns), adopt=True)
    pair = generate("ecdsa-p521")
    foreign = ssh_secret("bert-mpi-ssh-auth", ns, pair)
    create(kubectl, foreign)
    result = create(kubectl, trainjob("bert", ns))
    assert (f"Warning: Secret {ns}/bert-mpi-ssh-auth already exists and was not created by trainjob-admission for "
            "this job; it was left as is and Trainer will use it") in result.stderr, result.stderr
    kept = get_json("secret", "bert-mpi-ssh-auth", "-n", ns)
    assert kept["data"] == foreign["data"] and MANAGED_BY[0] not in (kept["metadata"].get("labels") or {})
    wait_for("the job's NetworkPolicy", lambda: exists(kubectl, "networkpolicy", "bert-mpi-isolation", ns), 30)
    record = next(r for r in harness.records() if r["endpoint"] == "validate" and r["name"] == "bert")
    secret_record = next(i for i in record["injections"] if i["kind"] == "Secret")
    assert secret_record["status"] == "kept" and secret_record["fingerprint"] == pair.fingerprint
    assert record["decision"] == "warn"
    wait_for("JobSet bert", lambda: exists(kubectl, "jobset", "bert", ns), 60)
    assert get_json("secret", "bert-mpi-ssh-auth", "-n", ns)["data"] == foreign["data"]


def test_dry_run_and_denied_jobs_create_nothing(webhook, namespace, kubectl):
    ns = namespace
    harness = webhook()
    dry = create(kubectl, trainjob("dry", ns), "--dry-run=server")
    assert "created (server dry run)" in dry.stdout, dry.stdout + dry.stderr
    ours = f'admission webhook "validate.inject-{ns}.admission.test" denied the request'
    denied = create(kubectl, trainjob("greedy", ns, gpus=16), check=False)
    assert denied.returncode != 0 and ours in denied.stderr and "16" in denied.stderr, denied.stderr
    privileged = create(kubectl, trainjob("root", ns, privileged=True), check=False)
    assert privileged.returncode != 0 and ours in privileged.stderr and "privileged" in privileged.stderr, \
        privileged.stderr
    for name in ("dry", "greedy", "root"):
        assert not exists(kubectl, "secret", f"{name}-mpi-ssh-auth", ns)
        assert not exists(kubectl, "networkpolicy", f"{name}-mpi-isolation", ns)
        assert not exists(kubectl, "trainjob", name, ns)
    records = {r["name"]: r for r in harness.records() if r["endpoint"] == "validate"}
    assert records["dry"]["dryRun"] is True
    assert all(i["status"] == "planned" for i in records["dry"]["injections"])
    assert records["greedy"]["allowed"] is False and records["greedy"]["injections"] == []


def test_the_running_reconciler_deletes_orphans_when_their_grace_period_ends(webhook, namespace, kubectl, api,
                                                                            wait_for):
    """No sweep runs here (interval of an hour): the orphans' own watch events and grace period do it."""
    ns = namespace
    # a grace period long enough that a loaded machine still sees both orphans before it ends
    webhook(Reconciler(api, PROVENANCE, grace_seconds=12, interval=3600, namespace=ns))
    kubectl("create", "quota", "no-trainjobs", "-n", ns, "--hard=count/trainjobs.trainer.kubeflow.org=0")
    refused = create(kubectl, trainjob("late", ns), check=False)
    assert refused.returncode != 0 and "exceeded quota" in refused.stderr, refused.stderr
    # the Secret was made at admission; the NetworkPolicy only ever comes with a stored job
    assert exists(kubectl, "secret", "late-mpi-ssh-auth", ns) and not exists(kubectl, "networkpolicy", "late-mpi-isolation", ns)
    wait_for("the orphan deleted once its grace period passed",
             lambda: not exists(kubectl, "secret", "late-mpi-ssh-auth", ns), 60)


def test_orphans_of_refused_jobs_go_after_grace_and_a_resubmission_replaces_them(
        webhook, namespace, kubectl, get_json, api, monkeypatch):
    ns = namespace
    # a leftover this young may be a submission still in admission (issue 30): not replaced before
    monkeypatch.setattr(injector_module, "IN_FLIGHT_SECONDS", 3.0)
    harness = webhook()
    # The ResourceQuota admission runs after the webhooks: it refuses jobs our webhook admitted,
    # leaving real orphans behind, as a later webhook's denial would.
    kubectl("create", "quota", "no-trainjobs", "-n", ns, "--hard=count/trainjobs.trainer.kubeflow.org=0")
    refused = create(kubectl, trainjob("old", ns), check=False)
    assert refused.returncode != 0 and "exceeded quota" in refused.stderr, refused.stderr
    old_fp = secret_fingerprint(get_json("secret", "old-mpi-ssh-auth", "-n", ns))
    grace = 6.0
    time.sleep(grace + 1)
    assert create(kubectl, trainjob("young", ns), check=False).returncode != 0
    assert exists(kubectl, "secret", "young-mpi-ssh-auth", ns)

    reconciler = Reconciler(api, PROVENANCE, grace_seconds=grace, namespace=ns)
    counts = asyncio.run(reconciler.reconcile_once())
    assert counts["deleted"] == 1 and counts["waiting"] == 1 and counts["errors"] == 0, counts
    assert not exists(kubectl, "secret", "old-mpi-ssh-auth", ns)
    assert exists(kubectl, "secret", "young-mpi-ssh-auth", ns)

    # Resubmitted at once: the leftover might be a create of that name still being admitted
    # (issue 30, defect 2), so it stays and the submitter is told when to retry.
    in_flight = 10.0  # the API server's 60 s request timeout, shortened for the test
    monkeypatch.setattr(injector_module, "IN_FLIGHT_SECONDS", in_flight)
    leftover = get_json("secret", "young-mpi-ssh-auth", "-n", ns)
    young_fp = secret_fingerprint(leftover)
    kubectl("delete", "quota", "no-trainjobs", "-n", ns)
    early = create(kubectl, trainjob("young", ns), check=False)
    assert early.returncode != 0 and "still being admitted" in early.stderr and "retry in" in early.stderr, early.stderr
    assert secret_fingerprint(get_json("secret", "young-mpi-ssh-auth", "-n", ns)) == young_fp
    # Once no create of that name can still be running: the leftover is replaced with fresh keys, then adopted.
    time.sleep(max(0.0, in_flight - age(leftover["metadata"])) + 1)
    create(kubectl, trainjob("young", ns))
    young = get_json("trainjob", "young", "-n", ns)["metadata"]
    uid = young["uid"]
    fresh = get_json("secret", "young-mpi-ssh-auth", "-n", ns)
    assert fresh["metadata"]["annotations"]["trainjob-admission.io/admission-id"] == \
        young["annotations"]["trainjob-admission.io/admission-id"]
    assert secret_fingerprint(fresh) not in (young_fp, old_fp)
    record = [r for r in harness.records() if r["endpoint"] == "validate" and r["name"] == "young"][-1]
    secret_record = next(i for i in record["injections"] if i["kind"] == "Secret")
    assert secret_record["status"] == "created" and "replaced" in secret_record
    counts = asyncio.run(reconciler.reconcile_once())
    assert counts["adopted"] == 1 and counts["deleted"] == 0, counts
    assert owned_by(get_json("secret", "young-mpi-ssh-auth", "-n", ns), uid)
    assert asyncio.run(reconciler.reconcile_once())["owned"] == 1
