"""Issue 17 point 4 on the real node (hack/cluster/realnode.py): an MPI TrainJob whose pods really
run, in containerd with runc, on the CNI bridge, with cluster DNS and kube-router enforcing
NetworkPolicies.

alice submits the job with kubectl; the service (as installed, on the host) admits it without a
write; Trainer makes the SSH key Secret (the default bundle's key type is Trainer's own) and the
service the job's NetworkPolicy once the job is stored; `mpirun` on the launcher reaches both
workers over SSH and the ring program's output shows every rank; the TrainJob ends Complete. On a
runtime whose bundle asks for ed25519 keys the service creates the Secret at admission and mpirun
uses that key. Then the proofs that the parts are the ones at work:
- the same job with the Secret's private key replaced by another fails to connect;
- fail-closed: while the service cannot create NetworkPolicies, a job's workers run without their
  own policy and a pod outside the job cannot reach them (the namespace's isolating policy); with
  no NetworkPolicy at all the same probe connects (so the enforcement, not the network, refused
  it); once the service can again, the job's policy comes and still keeps the outsider out.

Skipped, with the reason `up` printed, on a machine that cannot run the real node.
"""
from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.install import NS as SERVICE_NS
from tests.support.install import TEST_LABEL, install
from tests.support.objects import edit_binding, runtime, trainjob
from tests.support.service import INJECTOR, cluster, default_bundle_for, scratch_namespace, service_as_installed

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/real-node-test"
RUNTIME = "openmpi-real-node"
INJECTED_KEY_RUNTIME = "openmpi-real-node-ed25519"  # a second bundle asks for keys the service creates
SSH_PORT = 2222
ISOLATION = "trainjob-admission-trainjob-isolation"  # the namespace's own NetworkPolicy
PROBE_PORT = 8444  # the service's /healthz, /readyz and /metrics


def kc(*args, kubeconfig=None, input=None, timeout=120):
    return cluster.kubectl(*args, kubeconfig=kubeconfig or cluster.ADMIN_KUBECONFIG, check=False, input=input,
                           timeout=timeout)


def get(*args) -> dict:
    p = kc("get", *args, "-o", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def node(control_plane) -> dict:
    state = cluster.status()
    if not state.get("real_node"):
        pytest.skip(f"no real node in this control plane: {state.get('real_node_skipped') or 'not started'}")
    return state["real_node"]


def real_runtime(node: dict, name: str = RUNTIME) -> dict:
    """Trainer's own OpenMPI runtime (deepspeed-distributed, from the module cache) with the OpenMPI
    image built here, placed on the real node: launcher + 2 workers, one rank per worker."""
    stock = next(r for r in cluster._mpi_runtimes(cluster.module_dir("trainer"))
                 if r["metadata"]["name"] == "deepspeed-distributed")
    rt = copy.deepcopy(stock)
    rt["metadata"] = {"name": name, "labels": {"trainer.kubeflow.org/framework": "openmpi"}}
    mpi = rt["spec"]["mlPolicy"]["mpi"]
    rt["spec"]["mlPolicy"]["numNodes"] = 2
    mpi["runLauncherAsNode"] = False
    for rjob in rt["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = rjob["template"]["spec"]["template"]["spec"]
        pod.update(copy.deepcopy(node["placement"]))
        for c in pod["containers"]:
            c["image"] = node["images"]["openmpi"]
            c["imagePullPolicy"] = "IfNotPresent"
            if rjob["name"] == "node":  # the default bundle's minimum per worker; two fill the node's 2 CPUs
                c["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    return rt


@pytest.fixture(scope="module")
def team(node, policybundle_crd, tmp_path_factory):
    with scratch_namespace("real", LABEL) as (ns, run):
        bundle = default_bundle_for(ns, LABEL, run)
        bundle["spec"]["injections"]["sshKey"]["adoptExisting"] = True  # test_another_key_fails_to_connect
        # Before the default one (priority 100) for jobs on INJECTED_KEY_RUNTIME: its sshKey setting wins.
        injected = {"apiVersion": bundle["apiVersion"], "kind": bundle["kind"],
                    "metadata": {"name": f"{ns}-ed25519", "labels": {LABEL: run}},
                    "spec": {"priority": 50, "match": {"namespaces": [ns], "runtimes": [INJECTED_KEY_RUNTIME]},
                             "injections": {"sshKey": {"type": "ed25519"}}}}
        cluster.apply_objects([real_runtime(node), real_runtime(node, INJECTED_KEY_RUNTIME), edit_binding(ns, "alice"),
                               bundle, injected], server_side=True)
        try:
            with service_as_installed(tmp_path_factory.mktemp("real"), ns, [ns], f"{LABEL}={run}"):
                yield ns
        finally:
            kc("delete", "clustertrainingruntime", RUNTIME, INJECTED_KEY_RUNTIME, "--ignore-not-found")
            kc("delete", "policybundle", f"{ns}-ed25519", "--ignore-not-found")


def ring_job(name: str, ns: str, *, suspend: bool = False, command: list[str] | None = None,
             runtime: str = RUNTIME) -> dict:
    spec = {"runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime",
                           "apiGroup": "trainer.kubeflow.org"},
            "trainer": {"numNodes": 2,
                        "command": command or ["mpirun", "--np", "2", "--bind-to", "none",
                                               "python3", "/opt/mpi/ring.py"]}}
    if suspend:
        spec["suspend"] = True
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def submit(job: dict) -> None:
    p = kc("create", "-f", "-", input=json.dumps(job), kubeconfig=cluster.USER_A_KUBECONFIG)
    assert p.returncode == 0, f"alice's kubectl create was refused:\n{p.stderr}"


def finished(name: str, ns: str, wait_for, timeout: float = 240) -> tuple[str, str]:
    """(Complete or Failed, everything the launcher printed): logs are read while the job runs,
    since JobSet deletes a failed job's pods, and every distinct read is kept: a read racing the
    container's removal gets the kubelet's "failed to try resolving symlinks" instead of the log."""
    out: dict = {"logs": {}}

    def done() -> bool:
        pods = get("pods", "-n", ns, "-l", f"jobset.sigs.k8s.io/jobset-name={name}")["items"]
        for pod in pods:
            if "-launcher-" in pod["metadata"]["name"]:
                text = kc("logs", "-n", ns, pod["metadata"]["name"]).stdout
                if text.strip():
                    out["logs"][text] = None
        for c in get("trainjob", name, "-n", ns).get("status", {}).get("conditions", []):
            if c["type"] in ("Complete", "Failed") and c["status"] == "True":
                out["type"] = c["type"]
                return True
        return False
    wait_for(f"TrainJob {name} to finish", done, timeout, interval=2)
    return out["type"], "\n".join(out["logs"])


def keypair() -> tuple[str, str]:
    """(OpenSSH private key, authorized_keys line) of a new ed25519 pair."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    key = ed25519.Ed25519PrivateKey.generate()
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                              serialization.NoEncryption()).decode(),
            key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode())


# The launcher first prints the public half of the private key it holds, then runs the ring.
SHOW_KEY_THEN_RING = ["bash", "-c", "ssh-keygen -y -f ~/.ssh/id_rsa && exec mpirun --np 2 --bind-to none "
                                    "python3 /opt/mpi/ring.py"]


def ring_runs(name: str, team: str, node: dict, wait_for) -> tuple[str, dict]:
    """The launcher's log of a ring job that ran to Complete with a rank in each worker, and the
    Secret its key came from, as it is once the job has run."""
    outcome, log = finished(name, team, wait_for)
    assert outcome == "Complete", log
    ring = re.search(r"ring ok size=2 hosts=(\S+)", log)
    assert ring, log
    assert sorted(ring[1].split(",")) == [f"{name}-node-0-0", f"{name}-node-0-1"], log  # a rank in each worker
    pods = get("pods", "-n", team, "-l", f"jobset.sigs.k8s.io/jobset-name={name}")["items"]
    assert {p["spec"]["nodeName"] for p in pods} == {node["name"]}
    secret = get("secret", f"{name}-mpi-ssh-auth", "-n", team, "--show-managed-fields")
    public = base64.b64decode(secret["data"]["ssh-publickey"]).decode().split()[:2]
    assert " ".join(public) in log, (public, log)  # the key mpirun's ssh held is this Secret's
    return log, secret


def owned_network_policy(name: str, team: str, wait_for, timeout: float = 30) -> dict:
    """The job's NetworkPolicy, which the service creates owned by the job once it is stored."""
    def made() -> dict | None:
        found = kc("get", "networkpolicy", f"{name}-mpi-isolation", "-n", team, "-o", "json")
        if found.returncode != 0:
            return None
        policy = json.loads(found.stdout)
        return policy if [o["kind"] for o in policy["metadata"].get("ownerReferences", [])] == ["TrainJob"] else None
    return wait_for(f"{name}'s own NetworkPolicy", made, timeout, interval=0.2)


def test_mpi_job_runs_with_trainers_key_and_its_network_policy(team, node, wait_for):
    """The default bundle: admission writes nothing; Trainer makes the Secret and the service the
    job's NetworkPolicy once the job is stored, before the launcher (which starts once the workers
    are ready) tries to reach them."""
    submit(ring_job("ring", team, command=SHOW_KEY_THEN_RING))
    owned_network_policy("ring", team, wait_for)
    _, secret = ring_runs("ring", team, node, wait_for)
    assert [o["kind"] for o in secret["metadata"]["ownerReferences"]] == ["TrainJob"]
    assert "trainer" in {f["manager"] for f in secret["metadata"].get("managedFields", [])}, secret["metadata"]
    assert base64.b64decode(secret["data"]["ssh-privatekey"]).startswith(b"-----BEGIN EC PRIVATE KEY-----")


def test_mpi_job_runs_with_the_injected_key(team, node, wait_for):
    """A bundle asking for ed25519 keys: the service creates the Secret at admission, Trainer mounts
    it (it makes one only when it finds none) and mpirun's ssh uses it."""
    submit(ring_job("ring-ed", team, command=SHOW_KEY_THEN_RING, runtime=INJECTED_KEY_RUNTIME))
    secret = get("secret", "ring-ed-mpi-ssh-auth", "-n", team)  # there before the job was admitted
    assert secret["type"] == "kubernetes.io/ssh-auth"
    assert secret["metadata"]["annotations"]["trainjob-admission.io/ssh-key-type"] == "ed25519"

    def owned() -> dict | None:  # the reconciler adopts it once the job is stored and admissions pause
        latest = get("secret", "ring-ed-mpi-ssh-auth", "-n", team)
        return latest if [o["kind"] for o in latest["metadata"].get("ownerReferences", [])] == ["TrainJob"] else None
    secret = wait_for("the injected Secret owned by its TrainJob", owned, 15, interval=0.2)
    _, again = ring_runs("ring-ed", team, node, wait_for)
    # an immutable Secret the service created, never replaced by Trainer's own
    assert again["metadata"]["uid"] == secret["metadata"]["uid"] and secret.get("immutable") is True
    assert "trainer" not in {f["manager"] for f in again["metadata"].get("managedFields", [])}, again["metadata"]


def test_another_key_fails_to_connect(team, wait_for):
    """The same job with a Secret whose private key is not the one the workers trust (the bundle
    adopts an existing Secret): ssh from the launcher is refused and the job fails."""
    private, _ = keypair()
    _, trusted = keypair()
    cluster.apply_objects([{
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth", "immutable": True,
        "metadata": {"name": "ring-wrong-key-mpi-ssh-auth", "namespace": team},
        "stringData": {"ssh-privatekey": private, "ssh-publickey": trusted}}])
    submit(ring_job("ring-wrong-key", team))
    outcome, log = finished("ring-wrong-key", team, wait_for, timeout=300)
    assert outcome == "Failed", log
    assert "Permission denied (publickey" in log, log  # ssh refused the key, not a name or a route


def probe(ns: str, node: dict, name: str, target: str, port: int = SSH_PORT, labels: dict | None = None) -> bool:
    """A pod (outside the job) tries ``target``'s ``port`` (a worker's sshd); True when the TCP
    connection opened."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
           "spec": {"restartPolicy": "Never", **copy.deepcopy(node["placement"]),
                    "securityContext": {"runAsUser": 1000, "runAsNonRoot": True,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "probe", "image": node["images"]["openmpi"],
                                    "imagePullPolicy": "IfNotPresent",
                                    "command": ["timeout", "5", "bash", "-c", f"exec 3<>/dev/tcp/{target}/{port}"],
                                    "securityContext": {"allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}}]}}
    kc("delete", "pod", name, "-n", ns, "--ignore-not-found", "--wait=true")
    assert kc("create", "-f", "-", input=json.dumps(pod)).returncode == 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        phase = get("pod", name, "-n", ns)["status"].get("phase")
        if phase in ("Succeeded", "Failed"):
            return phase == "Succeeded"
        time.sleep(1)
    raise AssertionError(f"probe pod {name} did not finish: {get('pod', name, '-n', ns)['status']}")


def test_a_jobs_workers_are_unreachable_before_and_after_its_network_policy(team, node, wait_for):
    """Fail-closed: the namespace's isolating NetworkPolicy keeps a job's pods unreachable until its
    own policy exists. To hold the job in that window, the service's NetworkPolicy writes are taken
    away (its injector RoleBinding here deleted) before it is submitted; admission needs no write,
    so it is admitted, its workers start and stay out of reach. With no NetworkPolicy at all the
    same probe connects; with the permission back the service makes the job's policy (and the
    namespace's again) and the outsider is still kept out."""
    wait_for("the namespace's isolating NetworkPolicy", lambda: kc("get", "networkpolicy", ISOLATION, "-n", team)
             .returncode == 0, 30, interval=0.5)
    binding = next(b for b in get("rolebindings", "-n", team)["items"] if b["roleRef"]["name"] == INJECTOR)
    kept = {k: binding[k] for k in ("apiVersion", "kind", "roleRef", "subjects")}
    kept["metadata"] = {k: binding["metadata"][k] for k in ("name", "namespace", "labels") if k in binding["metadata"]}
    assert kc("delete", "rolebinding", binding["metadata"]["name"], "-n", team).returncode == 0
    try:
        submit(ring_job("ring-idle", team, command=["sleep", "600"]))  # workers run sshd until deleted

        def worker_ip() -> str | None:
            pods = get("pods", "-n", team, "-l", "jobset.sigs.k8s.io/jobset-name=ring-idle")["items"]
            ready = [p for p in pods if "-node-" in p["metadata"]["name"] and any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
            return ready[0]["status"]["podIP"] if ready else None
        wait_for("a ring-idle worker Ready", lambda: worker_ip() is not None, 180, interval=1)
        ip = worker_ip()
        assert kc("get", "networkpolicy", "ring-idle-mpi-isolation", "-n", team).returncode != 0, \
            "the job's own NetworkPolicy exists: the window this test holds is closed"
        assert not probe(team, node, "probe-window", ip), "a job without its NetworkPolicy was reachable"
        assert kc("delete", "networkpolicy", ISOLATION, "-n", team).returncode == 0
        time.sleep(2)  # kube-router syncs on the watch event
        assert probe(team, node, "probe-open", ip), "without any NetworkPolicy the probe should connect"
    finally:
        cluster.apply_objects([kept])
    # the service retries with a growing pause (up to a minute) and its watches come back
    owned_network_policy("ring-idle", team, wait_for, timeout=150)
    wait_for("the namespace's isolating NetworkPolicy made again", lambda: kc(
        "get", "networkpolicy", ISOLATION, "-n", team).returncode == 0, 120, interval=1)
    time.sleep(2)
    assert not probe(team, node, "probe-denied", ip), "a pod outside the job reached the worker's sshd"
    kc("delete", "trainjob", "ring-idle", "-n", team, "--wait=false")


# ---------------------------------------------------------------------------------------------
# The service as users deploy it (issue 17 point 3): docs/deploy.md's `kubectl apply -k
# manifests/overlays/local-ca` with the image built here, its two replicas on the real node
# ---------------------------------------------------------------------------------------------
def test_service_deployed_with_the_manifests_decides_on_the_real_node(node, policybundle_crd, tmp_path_factory,
                                                                     wait_for):
    run = uuid.uuid4().hex[:8]
    ns = f"deployed-{run}"
    image, tag = node["images"]["service"].rsplit(":", 1)
    on_node = {"target": {"kind": "Deployment", "name": "trainjob-admission"}, "patch": json.dumps([
        {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": node["placement"]["nodeSelector"]},
        {"op": "add", "path": "/spec/template/spec/tolerations", "value": node["placement"]["tolerations"]},
        # the injection namespaces component's two steps for one more namespace (the RoleBinding below)
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--reconcile-namespace"},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": ns}])}
    injector = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "trainjob-admission-injector", "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "trainjob-admission-injector"},
                "subjects": [{"kind": "ServiceAccount", "name": "trainjob-admission", "namespace": SERVICE_NS}]}
    # docs/deploy.md's two edits of the NetworkPolicy, which kube-router enforces here: the API server
    # calls from the bridge address, and its endpoint after kube-proxy's DNAT is the control plane's port
    network = {"target": {"kind": "NetworkPolicy", "name": "trainjob-admission"}, "patch": json.dumps([
        {"op": "replace", "path": "/spec/ingress/0/from/0/ipBlock/cidr", "value": f"{node['gateway']}/32"},
        {"op": "add", "path": "/spec/egress/1/ports/-",
         "value": {"port": cluster.status()["ports"]["apiserver"], "protocol": "TCP"}}])}
    try:
        with install(tmp_path_factory.mktemp("deploy"), run, bundle_namespaces=[ns],
                     extra={"images": [{"name": "trainjob-admission", "newName": image, "newTag": tag}],
                            "patches": [on_node, network]}):
            # after the install's sweep of labelled leftovers, which would take it too
            cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": ns, "labels": {TEST_LABEL: run}}},
                                   edit_binding(ns, "alice"), injector, runtime(namespace=ns)])
            wait_for("the Deployment's 2 replicas available on the real node", lambda: get(
                "deployment", "trainjob-admission", "-n", SERVICE_NS).get("status", {}).get("availableReplicas") == 2,
                240, interval=2)
            pods = get("pods", "-n", SERVICE_NS, "-l", "app.kubernetes.io/name=trainjob-admission")["items"]
            assert {p["spec"]["nodeName"] for p in pods} == {node["name"]} and len(pods) == 2

            def decided_by_the_pods() -> bool:  # the webhook answers once an endpoint is ready
                p = kc("create", "--dry-run=server", "-f", "-", kubeconfig=cluster.USER_A_KUBECONFIG,
                       input=json.dumps(trainjob("probe", ns, nodes=2, gpus=0)))
                return p.returncode == 0
            wait_for("the in-cluster service to answer", decided_by_the_pods, 120, interval=2)
            too_many = trainjob("too-many-gpus", ns, nodes=2, gpus=64)
            p = kc("create", "-f", "-", input=json.dumps(too_many), kubeconfig=cluster.USER_A_KUBECONFIG)
            assert p.returncode != 0 and "trainjob-admission" in p.stderr and "gpu" in p.stderr.lower(), p.stderr
            submit(trainjob("fits", ns, nodes=2, gpus=0))
            # made once the job is stored: the NetworkPolicy by the service, the Secret by Trainer
            wait_for("the job's NetworkPolicy and Secret", lambda: kc("get", "networkpolicy", "fits-mpi-isolation", "-n", ns)
                     .returncode == 0 and kc("get", "secret", "fits-mpi-ssh-auth", "-n", ns).returncode == 0, 60)
            logs = "".join(kc("exec", "-n", SERVICE_NS, pod["metadata"]["name"], "--", "cat",
                              "/var/log/trainjob-admission/decisions.jsonl").stdout for pod in pods)
            for job in ("fits", "too-many-gpus"):  # each decision is in one replica's log
                assert re.search(rf'"name":\s*"{job}"', logs), logs[-2000:]
            probe_port_only_for_prometheus(ns, node, pods[0]["status"]["podIP"], run)
            rolling_restart_loses_no_admission(ns, wait_for, tmp_path_factory.mktemp("replica-logs"))
    finally:
        kc("delete", "namespace", ns, "--wait=false")
        kc("delete", "namespace", "monitoring", "-l", f"{TEST_LABEL}={run}", "--wait=false")


def probe_port_only_for_prometheus(tenant: str, node: dict, service_ip: str, run: str) -> None:
    """Issue 30: 8444 (health, metrics, no client certificate) admits Prometheus' pods (base: the
    namespace monitoring, app.kubernetes.io/name=prometheus) and no tenant's; the kubelet's probes
    (the replicas became ready) need no rule."""
    assert not probe(tenant, node, "probe-port-tenant", service_ip, PROBE_PORT), "a tenant's pod reached 8444"
    if kc("get", "namespace", "monitoring").returncode != 0:
        cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": "monitoring", "labels": {TEST_LABEL: run}}}])
    assert probe("monitoring", node, f"probe-port-{run}", service_ip, PROBE_PORT,
                 {"app.kubernetes.io/name": "prometheus"}), "Prometheus' pod could not reach 8444"
    kc("delete", "pod", f"probe-port-{run}", "-n", "monitoring", "--wait=false")


class ReplicaLogs:
    """Every replica's stdout from its first line, `kubectl logs -f` per pod as pods appear: the
    stand-in for the cluster's log collection, which docs/deploy.md names as the copy of the decision
    log to keep (a replica's emptyDir file goes with its pod in a rolling restart)."""

    def __init__(self, tmp: Path):
        import threading
        self.tmp, self.stop = tmp, threading.Event()
        self.followers: dict[str, subprocess.Popen] = {}
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "ReplicaLogs":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        time.sleep(2)  # the streams catch up; those of pods still running never end by themselves
        for follower in self.followers.values():
            follower.terminate()
            follower.wait()

    def _watch(self) -> None:
        while not self.stop.is_set():
            pods = kc("get", "pods", "-n", SERVICE_NS, "-l", "app.kubernetes.io/name=trainjob-admission", "-o", "json")
            for pod in json.loads(pods.stdout or "{}").get("items", []) if pods.returncode == 0 else []:
                name = pod["metadata"]["name"]
                started = any(s.get("state", {}).get("running") or s.get("state", {}).get("terminated")
                              for s in pod.get("status", {}).get("containerStatuses", []))
                follower = self.followers.get(name)
                if started and (follower is None or (follower.poll() not in (None, 0) and self._empty(name))):
                    # --tail=-1 from the pod's first line; a try before the container could stream is retried
                    self.followers[name] = subprocess.Popen(
                        [str(cluster.KUBECTL), f"--kubeconfig={cluster.ADMIN_KUBECONFIG}", "logs", "-f", "--tail=-1",
                         "-n", SERVICE_NS, name], stdout=open(self.tmp / f"{name}.log", "wb"),
                        stderr=subprocess.DEVNULL)
            self.stop.wait(0.5)

    def _empty(self, pod: str) -> bool:
        path = self.tmp / f"{pod}.log"
        return not path.exists() or path.stat().st_size == 0

    def records(self) -> dict[str, list[str]]:
        """pod -> its decision-log lines (stdout lines that are JSON records, in order)."""
        return {path.stem: [line for line in path.read_text().splitlines() if line.startswith("{")]
                for path in sorted(self.tmp.glob("*.log"))}


def rolling_restart_loses_no_admission(ns: str, wait_for, tmp: Path) -> None:
    """Issue 17 point 5: alice submits jobs one after another while the Deployment restarts (a rolling
    update, maxUnavailable 0) and then loses a replica. Every submission gets the service's decision
    (admitted here) and none a failed webhook call; every admission is in the decision log of one of
    the replicas, those that went included (their stdout, followed from their start); each replica's
    chain verifies, and the survivors' files too."""
    import threading

    results: list[tuple[str, int, str]] = []
    stop = threading.Event()

    def submit_loop() -> None:
        for i in range(400):  # bounded: the restart is over long before
            if stop.is_set():
                return
            name = f"loop-{i}"
            p = kc("create", "-f", "-", input=json.dumps(trainjob(name, ns, nodes=2, gpus=0)),
                   kubeconfig=cluster.USER_A_KUBECONFIG)
            results.append((name, p.returncode, p.stderr))
    with ReplicaLogs(tmp) as followed:
        wait_for("both replicas' stdout followed", lambda: len(followed.followers) >= 2, 30, interval=0.5)
        before = set(followed.followers)
        worker = threading.Thread(target=submit_loop)
        worker.start()
        try:
            time.sleep(2)
            assert kc("rollout", "restart", "deployment/trainjob-admission", "-n", SERVICE_NS).returncode == 0
            p = kc("rollout", "status", "deployment/trainjob-admission", "-n", SERVICE_NS, "--timeout=240s",
                   timeout=260)
            assert p.returncode == 0, p.stderr
            pods = [p for p in get("pods", "-n", SERVICE_NS, "-l", "app.kubernetes.io/name=trainjob-admission")["items"]
                    if not p["metadata"].get("deletionTimestamp")]  # a replica the rollout left, not one going
            assert kc("delete", "pod", "-n", SERVICE_NS, pods[0]["metadata"]["name"], "--wait=true").returncode == 0
            wait_for("2 replicas available again", lambda: get(
                "deployment", "trainjob-admission", "-n", SERVICE_NS).get("status", {}).get("availableReplicas") == 2,
                180, interval=2)
            time.sleep(3)
        finally:
            stop.set()
            worker.join(timeout=120)
    failed = [(n, err) for n, rc, err in results if rc != 0]
    assert len(results) >= 10 and not failed, (len(results), failed[:5])
    logs = followed.records()
    assert len(set(logs) - before) >= 3, f"the rollout's and the replacement's replicas were not followed: {list(logs)}"
    admitted = {(r.get("namespace"), r.get("name")) for lines in logs.values() for r in map(json.loads, lines)
                if r.get("endpoint") == "validate" and r.get("decision") == "allow"}
    unlogged = [name for name, _, _ in results if (ns, name) not in admitted]
    assert not unlogged, f"admitted without a decision record in any replica's log: {unlogged[:10]}"
    verify = [str(Path(sys.executable).with_name("trainjob-admission")), "decisions", "verify", "--log", "-"]
    for pod, lines in logs.items():  # each replica's stdout: one chain from its first record
        if not lines:  # a replacement that the rollout ended before it answered anything
            continue
        p = subprocess.run(verify, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stdout.startswith("OK"), f"{pod}: {p.stdout}{p.stderr}"
    for pod in get("pods", "-n", SERVICE_NS, "-l", "app.kubernetes.io/name=trainjob-admission")["items"]:
        p = kc("exec", "-n", SERVICE_NS, pod["metadata"]["name"], "--", "trainjob-admission", "decisions",
               "verify", "--log", "/var/log/trainjob-admission/decisions.jsonl")
        assert p.returncode == 0 and p.stdout.startswith("OK"), p.stdout + p.stderr
