"""State and PolicyBundles from the real API server: watch caches, restarts, 410 relists, bundle
status, `review --kubeconfig` and `serve --kubeconfig` as a subprocess.

Outages are real: the watchers talk to the API server through a TCP relay on loopback that a test
cuts (every connection reset, the port closed) and restores, as an API server restart or a network
failure looks to a client. Every PolicyBundle carries a label unique to its test, and each watcher
selects on it, so parallel runs never see each other's bundles.
"""
from __future__ import annotations

import base64
import functools
import json
import socket
import struct
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.k8s.clusterstate import ClusterState
from tests.support.metrics import reloads
from tests.support.net import free_port
from tests.support.objects import example_job, runtime
from tests.support.serve import CLI, Serve
from tests.support.service import cert_dir, start_service
from trainjob_admission.webhook.cli.demo import admission_review
from trainjob_admission.webhook.inject.provenance import Provenance
from trainjob_admission.webhook.kube.client import api_client
from trainjob_admission.webhook.kube.discovery import Discovery
from trainjob_admission.webhook.kube.watch import Watcher
from trainjob_admission.webhook.loops.bundleset import BundleRegistry
from trainjob_admission.webhook.startup import ClusterSync

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
LABEL = "tests.trainjob-admission.io/run"
FAST = 10.0  # seconds: what "within seconds" means for a watch on loopback


# --- helpers ------------------------------------------------------------------------------------
class Relay:
    """A TCP relay to the API server. ``cut()`` resets every connection and closes the port;
    ``restore()`` listens on the same port again."""

    def __init__(self, target_port: int):
        self.target, self.port = target_port, free_port()
        self.conns: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self.lock:
            self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self.lock:
            listener, conns = self.listener, self.conns
            self.listener, self.conns = None, set()
        if listener:
            _reset(listener)  # shutdown wakes the thread blocked in accept(); close alone would not
        for conn in conns:
            _reset(conn)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self.lock:
                if self.listener is not listener:  # cut while we were connecting
                    _reset(client)
                    _reset(upstream)
                    return
                self.conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _reset(conn: socket.socket) -> None:
    """Shut down (waking any thread blocked on it) and close without lingering: no TIME_WAIT."""
    for step in (lambda: conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)),
                 lambda: conn.shutdown(socket.SHUT_RDWR)):
        try:
            step()
        except OSError:
            pass
    conn.close()


def kubeconfig_via(src: Path, dst: Path, server: str) -> Path:
    config = yaml.safe_load(src.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = server
    dst.write_text(yaml.safe_dump(config))
    return dst


def wait_until(what: str, predicate, timeout: float = FAST) -> float:
    """Poll (every 20 ms) until predicate() is truthy; returns the seconds it took."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - started


@dataclass
class Synced:
    state: ClusterState
    registry: BundleRegistry
    sync: ClusterSync
    selector: str

    def watcher(self, plural: str) -> Watcher:
        return next(w for w in self.sync.watchers if w.resource.plural == plural)


# examples/jobs/allowed.yaml (4 nodes x 1 GPU) in a namespace, on its TrainingRuntime "mpi-rt" there
job = functools.partial(example_job, "allowed.yaml", runtime="mpi-rt", runtime_kind="TrainingRuntime")


def bundle(name: str, run: str, namespace: str, max_gpus: int, expression: str = "job.totals.gpus <= params.maxGpus") -> dict:
    return {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
            "metadata": {"name": name, "labels": {LABEL: run}},
            "spec": {"version": f"1.0.{max_gpus}", "mode": "enforce", "match": {"namespaces": [namespace]},
                     "params": {"maxGpus": max_gpus},
                     "validations": [{"name": "gpu-cap", "expression": expression,
                                      "messageExpression": "'at most ' + string(params.maxGpus) + ' GPUs'"}]}}


def decide(synced: Synced, obj: dict):
    return evaluate(AdmissionInput(obj, operation="CREATE", username="alice"), list(synced.registry.active), synced.state)


# --- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def crd(policybundle_crd):
    return policybundle_crd


@pytest.fixture
def run_id(kubectl):
    """A label value unique to the test; its PolicyBundles and ClusterTrainingRuntimes are deleted after."""
    run = "r" + uuid.uuid4().hex[:8]  # a letter first: YAML must not read it as a number
    yield run
    for kind in ("policybundles.policy.trainjob-admission.io", "clustertrainingruntimes.trainer.kubeflow.org"):
        kubectl("delete", kind, "-l", f"{LABEL}={run}", "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def start_sync(admin_kubeconfig, crd, run_id):
    started: list[ClusterSync] = []
    apis = []

    def start(kubeconfig: Path = admin_kubeconfig, wait: bool = True) -> Synced:
        api = api_client(str(kubeconfig))
        state, registry = ClusterState(), BundleRegistry([])
        selector = f"{LABEL}={run_id}"
        sync = ClusterSync(api, state, registry, bundle_selector=selector)
        sync.watch_kueue(Discovery(api).read().kueue_api)  # as serve's start-up does (webhook/startup.py ClusterVersions)
        sync.start()
        started.append(sync)
        apis.append(api)
        if wait:
            wait_until("the first list of every kind", lambda: sync.synced, timeout=30)
        return Synced(state, registry, sync, selector)

    yield start
    for sync in started:
        sync.stop()
    for api in apis:
        api.close()


@pytest.fixture
def relay(control_plane):
    r = Relay(int(control_plane.apiserver.rsplit(":", 1)[1]))
    r.restore()
    yield r
    r.cut()


def apply(kubectl, *objs: dict) -> None:
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))


# --- the caches ---------------------------------------------------------------------------------
def test_state_follows_creates_changes_and_deletes(start_sync, kubectl, namespace, run_id):
    synced = start_sync()
    state = synced.state
    assert "default" in state.namespaces and namespace in state.namespaces

    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": namespace},
             "spec": {"hard": {"requests.cpu": "8"}}}
    apply(kubectl, quota, runtime("mpi-rt", namespace))
    took = [wait_until("quota and runtime cached",
                       lambda: state.namespace_quotas(namespace) and state.runtime(namespace, {"kind": "TrainingRuntime", "name": "mpi-rt"}))]

    kubectl("patch", "resourcequota", "compute", "-n", namespace, "--type=merge", "-p", '{"spec":{"hard":{"requests.cpu":"2"}}}')
    took.append(wait_until("quota change cached",
                           lambda: state.namespace_quotas(namespace)[0]["spec"]["hard"]["requests.cpu"] == "2"))
    kubectl("label", "namespace", namespace, "environment=production")
    took.append(wait_until("namespace label cached",
                           lambda: state.namespace(namespace)["metadata"].get("labels", {}).get("environment") == "production"))

    apply(kubectl, runtime(f"ctr-{run_id}", labels={LABEL: run_id}))  # a ClusterTrainingRuntime
    took.append(wait_until("cluster runtime cached", lambda: f"ctr-{run_id}" in state.cluster_runtimes))

    kubectl("delete", "resourcequota", "compute", "-n", namespace)
    kubectl("delete", "trainingruntime", "mpi-rt", "-n", namespace)
    kubectl("delete", "clustertrainingruntime", f"ctr-{run_id}")
    took.append(wait_until("deletions applied", lambda: not state.namespace_quotas(namespace)
                           and not state.runtime(namespace, {"kind": "TrainingRuntime", "name": "mpi-rt"})
                           and f"ctr-{run_id}" not in state.cluster_runtimes))
    kubectl("delete", "namespace", namespace, "--wait=false")
    took.append(wait_until("namespace deletion applied", lambda: namespace not in state.namespaces, timeout=60))
    print(f"\nextra wait after kubectl returned: max {max(took[:-1]) * 1000:.0f} ms; namespace finalized in {took[-1]:.1f} s")
    # One list each, none again without a disconnect (none at all of a resource whose CRD is not
    # installed, as the PolicyException CRD is not until a test installs it).
    assert all(w.relists <= 1 for w in synced.sync.watchers), "no relist expected without a disconnect"


def test_outage_keeps_state_and_resume_delivers_missed_deletes(start_sync, kubectl, namespace, relay, tmp_path, admin_kubeconfig):
    """The API server unreachable (connections reset, port closed): the caches keep the last known
    state and back off; once it is back the watches resume from their resourceVersion and apply
    what happened meanwhile."""
    via = kubeconfig_via(admin_kubeconfig, tmp_path / "relay.kubeconfig", f"https://127.0.0.1:{relay.port}")
    synced = start_sync(via)
    quota = lambda name: {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},  # noqa: E731
                          "spec": {"hard": {"requests.cpu": "4"}}}
    apply(kubectl, quota("q1"), quota("q2"))
    names = lambda: [q["metadata"]["name"] for q in synced.state.namespace_quotas(namespace)]  # noqa: E731
    wait_until("q1 and q2 cached", lambda: names() == ["q1", "q2"])

    relay.cut()
    quotas = synced.watcher("resourcequotas")
    errors = quotas.errors
    kubectl("delete", "resourcequota", "q1", "-n", namespace)
    apply(kubectl, quota("q3"))
    wait_until("the watch notices the outage and retries", lambda: quotas.errors >= errors + 2)
    assert names() == ["q1", "q2"], "the last known state must be kept during an outage"

    relay.restore()
    took = wait_until("the missed delete and create applied after the outage", lambda: names() == ["q2", "q3"], timeout=40)
    print(f"\ncaught up {took:.1f} s after the API server came back (backoff included)")
    assert quotas.relists == 1, "a short outage resumes the watch; it must not need a relist"


def test_expired_resource_version_relists_and_drops_what_was_deleted(start_sync, kubectl, namespace, relay, tmp_path,
                                                                      admin_kubeconfig, run_id):
    """A disconnect long enough for the watch history to be gone: the API answers 410 Gone, the
    kind is listed again and its cache replaced, so objects deleted meanwhile disappear."""
    via = kubeconfig_via(admin_kubeconfig, tmp_path / "relay.kubeconfig", f"https://127.0.0.1:{relay.port}")
    synced = start_sync(via)
    apply(kubectl, runtime("rt-a", namespace), runtime("rt-b", namespace), bundle(f"pb-a-{run_id}", run_id, namespace, 8))
    ref = lambda name: {"kind": "TrainingRuntime", "name": name}  # noqa: E731
    wait_until("runtimes and bundle cached", lambda: synced.state.runtime(namespace, ref("rt-a"))
               and synced.state.runtime(namespace, ref("rt-b")) and synced.registry.active)

    runtimes, bundles = synced.watcher("trainingruntimes"), synced.watcher("policybundles")
    errors = runtimes.errors, bundles.errors
    relay.cut()
    kubectl("delete", "trainingruntime", "rt-a", "-n", namespace)
    kubectl("delete", "policybundle", f"pb-a-{run_id}")
    # Once both threads have seen the outage they hold no event in hand that could still move
    # their resourceVersion; then make it one whose history is gone: the watch history of these
    # kinds starts when their CRD was established, long after version 1.
    wait_until("both watches see the outage", lambda: runtimes.errors > errors[0] and bundles.errors > errors[1])
    runtimes.resource_version = bundles.resource_version = "1"
    relay.restore()
    wait_until("rt-a dropped by the relist", lambda: not synced.state.runtime(namespace, ref("rt-a")), timeout=40)
    wait_until("the deleted bundle dropped by the relist", lambda: not synced.registry.active, timeout=40)
    assert synced.state.runtime(namespace, ref("rt-b")), "the relist must keep what still exists"
    assert runtimes.relists == 2 and bundles.relists == 2, "the 410 path (relist) must have run"


# --- PolicyBundles ------------------------------------------------------------------------------
def status(get_json, name: str) -> dict:
    return get_json("policybundle", name).get("status") or {}


def condition(st: dict, kind: str) -> dict:
    return next((c for c in st.get("conditions", []) if c["type"] == kind), {})


def test_policybundle_apply_edit_break_fix_delete(start_sync, kubectl, get_json, namespace, run_id):
    synced = start_sync()
    apply(kubectl, runtime("mpi-rt", namespace))
    wait_until("runtime cached", lambda: synced.state.runtime(namespace, {"kind": "TrainingRuntime", "name": "mpi-rt"}))
    name = f"gpu-cap-{run_id}"
    assert decide(synced, job(namespace)).allowed, "no bundle yet"

    # 1. apply: compiled, enforced, status says so
    started = time.monotonic()
    apply(kubectl, bundle(name, run_id, namespace, max_gpus=8))
    wait_until("bundle enforced", lambda: [b.name for b in synced.registry.active] == [name])
    first = time.monotonic() - started
    assert decide(synced, job(namespace)).allowed  # 4 GPUs <= 8
    wait_until("status written", lambda: status(get_json, name).get("observedGeneration") == 1)
    st = status(get_json, name)
    assert st["compiled"] is True and st["active"] is True and st["activeGeneration"] == 1 and st["errorCount"] == 0
    assert st["digest"].startswith("sha256:") and condition(st, "Ready")["status"] == "True"

    # 2. edit: a stricter limit is enforced within seconds of kubectl apply returning
    started = time.monotonic()
    apply(kubectl, bundle(name, run_id, namespace, max_gpus=2))
    wait_until("the edit enforced", lambda: not decide(synced, job(namespace)).allowed)
    edit = time.monotonic() - started
    decision = decide(synced, job(namespace))
    assert decision.messages[0]["message"] == "at most 2 GPUs", decision.messages
    good_digest = synced.registry.active[0].digest

    # 3. a broken edit: reported with rule and position; generation 2 stays enforced
    apply(kubectl, bundle(name, run_id, namespace, max_gpus=16, expression="job.totals.gpus <= "))
    wait_until("status reports the broken generation", lambda: status(get_json, name).get("observedGeneration") == 3)
    st = status(get_json, name)
    assert st["compiled"] is False and st["active"] is True and st["activeGeneration"] == 2, st
    assert st["digest"] == good_digest and st["activeVersion"] == "1.0.2"
    assert st["errorCount"] >= 1 and "rule gpu-cap" in st["errors"][0] and "line 1" in st["errors"][0], st["errors"]
    ready = condition(st, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "LastGoodEnforced", ready
    assert "generation 2" in ready["message"] and "still enforced" in ready["message"]
    decision = decide(synced, job(namespace))
    assert not decision.allowed and decision.messages[0]["message"] == "at most 2 GPUs", "the last good must stay enforced"
    printed = kubectl("get", "policybundle", name).stdout
    assert "false" in printed.split("\n")[1] and "true" in printed.split("\n")[1], printed  # Compiled false, Active true

    # 4. fixed: generation 4 enforced, Ready again with a fresh transition time
    apply(kubectl, bundle(name, run_id, namespace, max_gpus=16))
    wait_until("the fix enforced", lambda: decide(synced, job(namespace)).allowed)
    wait_until("status Ready again", lambda: condition(status(get_json, name), "Ready").get("status") == "True")
    st = status(get_json, name)
    assert st["compiled"] and st["activeGeneration"] == 4 and st["errors"] == [] and st["errorCount"] == 0

    # 5. delete: removed from the registry
    kubectl("delete", "policybundle", name)
    wait_until("bundle removed", lambda: not synced.registry.active)
    assert decide(synced, job(namespace)).allowed
    print(f"\nkubectl apply -> enforced: first {first:.2f} s, edit {edit:.2f} s")
    assert edit < 5.0


def test_policybundle_that_never_compiled_is_not_active(start_sync, kubectl, get_json, namespace, run_id):
    synced = start_sync()
    name = f"broken-{run_id}"
    doc = bundle(name, run_id, namespace, 4)
    doc["spec"]["mode"] = "block"  # not enforce/audit
    apply(kubectl, doc)
    wait_until("status written", lambda: status(get_json, name).get("observedGeneration") == 1)
    st = status(get_json, name)
    assert st["compiled"] is False and st["active"] is False and "activeGeneration" not in st
    assert any("spec.mode" in e for e in st["errors"]), st["errors"]
    assert condition(st, "Ready")["reason"] == "NotEnforced"
    assert synced.registry.active == ()


def test_bundle_selector_hides_other_servers_bundles(start_sync, kubectl, namespace, run_id):
    synced = start_sync()
    other = "o" + uuid.uuid4().hex[:8]
    try:
        apply(kubectl, bundle(f"other-{other}", other, namespace, 4), bundle(f"mine-{run_id}", run_id, namespace, 4))
        wait_until("my bundle enforced", lambda: synced.registry.active)
        time.sleep(1)
        assert [b.name for b in synced.registry.active] == [f"mine-{run_id}"]
    finally:
        kubectl("delete", "policybundle", f"other-{other}", "--ignore-not-found", check=False)


# --- the commands -------------------------------------------------------------------------------
def test_review_kubeconfig_decides_from_the_live_cluster(kubectl, namespace, admin_kubeconfig, tmp_path):
    apply(kubectl, runtime("mpi-rt", namespace))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job(namespace)))
    argv = [str(CLI), "review", "-f", str(job_file), "--kubeconfig", str(admin_kubeconfig), "--bundle", "builtin:default",
            "-o", "json"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stdout + first.stderr

    apply(kubectl, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "small", "namespace": namespace},
                    "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}})
    # the quota controller fills status.hard/used; the quota check needs them
    wait_until("quota status", lambda: (json.loads(kubectl("get", "resourcequota", "small", "-n", namespace, "-o", "json").stdout)
                                       .get("status", {}).get("hard")), timeout=30)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "quota" in json.dumps(json.loads(second.stdout)["messages"]).lower()


def test_review_and_explain_kubeconfig_decide_with_the_clusters_policybundles(kubectl, namespace, crd, run_id,
                                                                              admin_kubeconfig, tmp_path):
    """Without --bundle, `review --kubeconfig` decides with the PolicyBundles (selected as serve
    selects them); a --bundle file of the same name wins, as in serve; none at all is exit 3."""
    apply(kubectl, runtime("mpi-rt", namespace))
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job(namespace)))
    selector = f"{LABEL}={run_id}"
    base = [str(CLI), "review", "-f", str(job_file), "--kubeconfig", str(admin_kubeconfig), "--bundle-selector", selector]

    none = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert none.returncode == 3, none
    assert f"no PolicyBundle with labels {selector} in the cluster at https://" in none.stderr, none.stderr
    assert "kubectl apply -f manifests/base/policybundle-default.yaml" in none.stderr and none.stdout == ""

    name = f"cap-{run_id}"
    apply(kubectl, bundle(name, run_id, namespace, max_gpus=2))
    denied = subprocess.run(base + ["-o", "json"], capture_output=True, text=True, timeout=60)
    assert denied.returncode == 1, denied
    decision = json.loads(denied.stdout)
    assert decision["messages"][0]["message"] == "at most 2 GPUs" and name in decision["messages"][0]["rule"], decision

    explain = subprocess.run([str(CLI), "policy", "explain", *base[2:]], capture_output=True, text=True, timeout=60)
    assert explain.returncode == 0 and f"{name} gpu-cap fail deny at most 2 GPUs" in " ".join(explain.stdout.split()), explain

    draft = tmp_path / "draft.yaml"  # the same bundle, relaxed: the file wins over the PolicyBundle
    draft.write_text(yaml.safe_dump(bundle(name, run_id, namespace, max_gpus=8)))
    relaxed = subprocess.run(base + ["--bundle", str(draft)], capture_output=True, text=True, timeout=60)
    assert relaxed.returncode == 0, relaxed
    assert f"(bundles: {name} 1.0.8)" in relaxed.stdout

    broken = bundle(f"broken-{run_id}", run_id, namespace, 4, expression="job.totals.gpus <= ")
    apply(kubectl, broken)
    warned = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert warned.returncode == 1, warned
    assert f"warning: PolicyBundle broken-{run_id} generation 1 does not compile" in warned.stderr, warned.stderr


def test_review_unreachable_cluster_exits_6(admin_kubeconfig, tmp_path):
    closed = kubeconfig_via(admin_kubeconfig, tmp_path / "closed.kubeconfig", f"https://127.0.0.1:{free_port()}")
    result = subprocess.run([str(CLI), "review", "-f", str(REPO / "examples" / "jobs" / "allowed.yaml"),
                             "--kubeconfig", str(closed)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 6, result
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:" in result.stderr
    assert f"kubectl --kubeconfig {closed} cluster-info" in result.stderr and result.stdout == ""


def test_serve_kubeconfig_ready_only_after_sync_and_bundle(kubectl, namespace, run_id, crd, relay, tmp_path,
                                                          admin_kubeconfig, serving_cert):
    """`serve --kubeconfig` as a subprocess: /readyz 503 while the API is unreachable, 503 while no
    bundle is active, 200 once the cluster bundle is compiled; the bundle decides /validate; SIGTERM
    ends it cleanly."""
    crt, key, ca_pem = serving_cert()
    via = kubeconfig_via(admin_kubeconfig, tmp_path / "relay.kubeconfig", f"https://127.0.0.1:{relay.port}")
    relay.cut()  # the API server is unreachable when the service starts
    svc = Serve(tmp_path, cert_dir(crt, key, tmp_path / "tls"), ca_pem, "--kubeconfig", str(via),
                "--bundle-selector", f"{LABEL}={run_id}", ready="/healthz", timeout=30)  # listening; not ready yet
    call = svc.call
    try:
        code, text = call("/readyz")
        assert code == 503 and "not synced" in text and "no policy bundle" in text, text

        apply(kubectl, runtime("mpi-rt", namespace), bundle(f"serve-{run_id}", run_id, namespace, max_gpus=2))
        relay.restore()
        took = wait_until("ready once synced with a compiled bundle", lambda: call("/readyz")[0] == 200, timeout=40)
        print(f"\n/readyz 200 {took:.1f} s after the API server became reachable")

        review = admission_review(job(namespace))
        review["request"]["dryRun"] = True  # nothing to inject
        code, text = call("/validate", review)
        response = json.loads(text)["response"]
        assert code == 200 and response["allowed"] is False and "at most 2 GPUs" in response["status"]["message"], text

        # bundle reload metrics count the PolicyBundle generations the watch compiles (no files here)
        assert reloads(call("/metrics")[1]) == {"success": 1.0}
        apply(kubectl, bundle(f"serve-{run_id}", run_id, namespace, max_gpus=2, expression="job.totals.gpus <= "))
        wait_until("the broken generation counted", lambda: reloads(call("/metrics")[1]).get("failure") == 1.0, timeout=FAST)
        apply(kubectl, bundle(f"serve-{run_id}", run_id, namespace, max_gpus=3))
        wait_until("the fix counted", lambda: reloads(call("/metrics")[1]) == {"success": 2.0, "failure": 1.0}, timeout=FAST)
    finally:
        rc = svc.stop(timeout=20)  # SIGTERM
    assert rc == 0, f"serve exit {rc}: {svc.output()[-3000:]}"


def test_serve_reconcile_namespace_leaves_other_namespaces_alone(kubectl, namespace, crd, tmp_path, admin_kubeconfig,
                                                                  serving_cert):
    """`serve --reconcile-namespace A`: the reconciler adopts an orphan injected object in A and
    never touches the same kind of object in B (another test's namespace on a shared cluster). The
    object is an SSH key Secret, the one kind adopted by a patch (a job's NetworkPolicy is created
    owned, webhook/inject/isolation.py)."""

    other = f"{namespace}-b"
    kubectl("create", "namespace", other)
    cert = serving_cert()
    provenance = Provenance.from_serving_key(cert[1])  # the service's key: both objects are genuinely its own
    try:
        for ns in (namespace, other):
            # the Secret before its job: Trainer's MPI plugin makes its own only where none exists yet
            apply(kubectl, provenance.stamp("Secret", {
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
                "metadata": {"name": "held-mpi-ssh-auth", "namespace": ns,
                             "labels": {"app.kubernetes.io/managed-by": "trainjob-admission"},
                             "annotations": {"trainjob-admission.io/job": "TrainJob/held"}},
                "data": {"ssh-privatekey": base64.b64encode(b"not a key: only its owner is looked at").decode()}}),
                  {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                   "metadata": {"name": "held", "namespace": ns},
                   "spec": {"suspend": True, "runtimeRef": {"name": "deepspeed-distributed"}}})
        svc = start_service(tmp_path, admin_kubeconfig, cert, namespaces=[namespace],
                            args=("--bundle", "builtin:default"))
        try:
            def owners(ns: str) -> list:
                obj = json.loads(kubectl("get", "secret", "held-mpi-ssh-auth", "-n", ns, "-o", "json").stdout)
                return [ref["name"] for ref in obj["metadata"].get("ownerReferences", [])]

            assert owners(other) == [], "owned before the service started: not the orphan this test is about"
            wait_until("the object in the service's namespace adopted", lambda: owners(namespace) == ["held"], timeout=30)
            time.sleep(1.0)  # the first sweep covers every namespace it may touch at once
            assert owners(other) == [], "adopted outside --reconcile-namespace"
            assert f"reconciler ({namespace}) stopped" not in svc.output()
        finally:
            svc.stop()
    finally:
        kubectl("delete", "namespace", other, "--wait=false", "--ignore-not-found", check=False)


def test_example_bundle_file_applies_as_is_and_reports_the_lint_digest(start_sync, kubectl, get_json, run_id, tmp_path):
    """The bundle file format is the resource format; status.digest is what `policy lint` prints."""
    from trainjob_admission.policies.bundle.compile import compile_document

    doc = yaml.safe_load((REPO / "examples" / "bundles" / "production.yaml").read_text())
    doc["metadata"] = {"name": f"production-{run_id}", "labels": {LABEL: run_id}}  # unique on a shared cluster
    synced = start_sync()
    path = tmp_path / "production.yaml"
    path.write_text(yaml.safe_dump(doc))
    kubectl("apply", "-f", str(path))
    wait_until("status written", lambda: status(get_json, f"production-{run_id}").get("observedGeneration") == 1)
    st = status(get_json, f"production-{run_id}")
    assert st["compiled"] and st["active"], st
    assert st["digest"] == compile_document(doc, str(path)).digest
    assert [b.version for b in synced.registry.active] == [doc["spec"]["version"]]
