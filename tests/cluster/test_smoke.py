"""Smoke tests of the control plane itself: the real Trainer, JobSet, Job controller, scheduler,
KWOK, ResourceQuota, garbage collector and RBAC, before any product webhook is involved."""
from __future__ import annotations

import copy
import functools
import json

import pytest

from tests.support import objects

pytestmark = pytest.mark.cluster

MPI_RUNTIME = "deepspeed-distributed"  # the MPI ClusterTrainingRuntime shipped in the trainer module


# A TrainJob on the MPI runtime: 2 nodes, each requesting 1 CPU, 1Gi and 1 GPU; pod labels and
# annotations (for KWOK) through a runtimePatch on the launcher and node pods.
trainjob = functools.partial(objects.trainjob, runtime=MPI_RUNTIME, runtime_kind="ClusterTrainingRuntime", nodes=2,
                             memory="1Gi", gpu_requests=True, image=None, command=None,
                             manager="trainjob-admission.test/smoke")


def condition(obj, ctype):
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return None


@pytest.mark.oldest
def test_versions_nodes_and_runtime(control_plane, kubectl, get_json):
    k8s = control_plane.versions["kubernetes"]  # v1.36.3, or v1.33.13 on the oldest stack
    v = json.loads(kubectl("version", "-o", "json").stdout)
    assert v["clientVersion"]["gitVersion"] == k8s
    assert v["serverVersion"]["gitVersion"] == k8s
    kueue = get_json("crd", "localqueues.kueue.x-k8s.io")  # v1beta2 from Kueue v0.15; v0.14 serves v1beta1 alone
    assert [v["name"] for v in kueue["spec"]["versions"] if v["served"]] == (
        ["v1beta1"] if control_plane.stack == "oldest" else ["v1beta1", "v1beta2"])
    runtime_patches = get_json("crd", "trainjobs.trainer.kubeflow.org")["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "runtimePatches" in runtime_patches  # Trainer v2.2 and v2.3 alike
    nodes = {n["metadata"]["name"]: n for n in get_json("nodes")["items"]}
    assert len(nodes) >= 2
    for want in control_plane.nodes:
        n = nodes[want["name"]]
        assert n["status"]["allocatable"].get("nvidia.com/gpu") == want.get("nvidia.com/gpu")
        assert n["status"]["capacity"]["cpu"] == want["cpu"]
        assert condition(n, "Ready")["status"] == "True"
    assert MPI_RUNTIME in control_plane.runtimes
    rt = get_json("clustertrainingruntime", MPI_RUNTIME)
    assert "mpi" in rt["spec"]["mlPolicy"]
    for crd in ("trainjobs.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io"):
        assert condition(get_json("crd", crd), "Established")["status"] == "True"


@pytest.mark.oldest
def test_mpi_trainjob_runs_to_complete_then_gc(namespace, kubectl, get_json, wait_for, control_plane):
    ns = namespace
    kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": ns},
        "spec": {"hard": {"pods": "20", "requests.nvidia.com/gpu": "8",
                          "count/trainjobs.trainer.kubeflow.org": "1"}}}))
    wait_for("quota status", lambda: (get_json("resourcequota", "q", "-n", ns).get("status") or {}).get("used"), 60)

    kubectl("apply", "-f", "-", input=json.dumps(
        trainjob("smoke", ns, pod_annotations={"kwok.x-k8s.io/run-duration": "6s"})))
    tj = get_json("trainjob", "smoke", "-n", ns)
    uid = tj["metadata"]["uid"]

    # The real Trainer: JobSet plus the MPI Secret and hostfile ConfigMap, owned by the TrainJob.
    js = wait_for("JobSet smoke", lambda: kubectl("get", "jobset", "smoke", "-n", ns, check=False).returncode == 0
                  and get_json("jobset", "smoke", "-n", ns), 60)
    assert any(o["uid"] == uid for o in js["metadata"]["ownerReferences"])
    for kind, name in (("secret", "smoke-mpi-ssh-auth"), ("configmap", "smoke-mpi-hostfile")):
        obj = wait_for(f"{kind} {name}", lambda: kubectl("get", kind, name, "-n", ns, check=False).returncode == 0
                       and get_json(kind, name, "-n", ns), 60)
        assert any(o["uid"] == uid for o in obj["metadata"]["ownerReferences"]), obj["metadata"]
    assert "smoke" in get_json("configmap", "smoke-mpi-hostfile", "-n", ns)["data"]["hostfile"]

    # Quota counts the TrainJob, and a second one is refused by the ResourceQuota admission.
    wait_for("quota counts the TrainJob", lambda: get_json("resourcequota", "q", "-n", ns)["status"]["used"]
             .get("count/trainjobs.trainer.kubeflow.org") == "1", 60)
    second = kubectl("apply", "-f", "-", input=json.dumps(trainjob("second", ns)), check=False)
    assert second.returncode != 0 and "exceeded quota" in second.stderr, second.stderr

    # JobSet -> Jobs -> pods -> scheduled on KWOK nodes -> Running, counted by the quota.
    node_names = {n["name"] for n in control_plane.nodes}
    jobs = wait_for("Jobs of the JobSet", lambda: [j for j in get_json(
        "jobs", "-n", ns, "-l", "jobset.sigs.k8s.io/jobset-name=smoke")["items"]], 60)
    assert all(j["metadata"]["ownerReferences"][0]["kind"] == "JobSet" for j in jobs)

    def gpus_in_use():
        used = get_json("resourcequota", "q", "-n", ns)["status"].get("used", {})
        return int(used.get("requests.nvidia.com/gpu", "0")) >= 1
    wait_for("quota status.used counts GPU requests of running pods", gpus_in_use, 60, interval=0.3)

    def smoke_pods() -> list[dict]:
        return get_json("pods", "-n", ns, "-l", "jobset.sigs.k8s.io/jobset-name=smoke")["items"]

    # The launcher's and the nodes' pods, while they run (on the oldest stack, JobSet v0.11.1 with
    # Trainer v2.2.0, only the launcher's pod is left once the job is complete).
    running = wait_for("the launcher's and the nodes' pods", lambda: (lambda p: p if len(p) >= 2 else None)(smoke_pods()), 60)
    assert all(p["spec"]["nodeName"] in node_names for p in running), [p["spec"].get("nodeName") for p in running]

    tj = wait_for("TrainJob Complete", lambda: (lambda o: condition(o, "Complete") and
                  condition(o, "Complete")["status"] == "True" and o)(get_json("trainjob", "smoke", "-n", ns)), 240)
    assert not condition(tj, "Failed") or condition(tj, "Failed")["status"] != "True"
    pods = smoke_pods()
    launcher = [p for p in pods if p["metadata"]["labels"].get("jobset.sigs.k8s.io/replicatedjob-name") == "launcher"]
    assert launcher and all(p["status"]["phase"] == "Succeeded" for p in launcher)
    assert condition(get_json("jobset", "smoke", "-n", ns), "Completed")["status"] == "True"

    # Deleting the TrainJob: the garbage collector removes what the Trainer created.
    kubectl("delete", "trainjob", "smoke", "-n", ns, "--wait=true", "--timeout=60s", timeout=90)
    for kind, name in (("secret", "smoke-mpi-ssh-auth"), ("configmap", "smoke-mpi-hostfile"), ("jobset", "smoke")):
        wait_for(f"{kind} {name} garbage-collected",
                 lambda: "NotFound" in kubectl("get", kind, name, "-n", ns, check=False).stderr, 90)


def test_rbac_users_are_confined_to_their_namespace(control_plane, kubectl):
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    def lister(kubeconfig):
        api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
        return lambda ns: api.list_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", _request_timeout=30)

    alice = lister(control_plane.user_a_kubeconfig)
    admin = lister(control_plane.admin_kubeconfig)
    with pytest.raises(ApiException) as exc:
        alice("team-b")
    assert exc.value.status == 403
    assert alice("team-a")["items"] == []  # allowed in her own namespace
    assert admin("team-b")["items"] == []
    p = kubectl("get", "trainjobs", "-n", "team-b", kubeconfig=control_plane.user_a_kubeconfig, check=False)
    assert p.returncode != 0 and "forbidden" in p.stderr.lower(), p.stderr
    p = kubectl("auth", "can-i", "create", "trainjobs.trainer.kubeflow.org", "-n", "team-a",
                kubeconfig=control_plane.user_a_kubeconfig, check=False)
    assert p.stdout.strip() == "yes"


def test_kwok_fail_exit_code_label(namespace, kubectl, get_json, wait_for):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "exit3", "namespace": namespace},
           "spec": {"backoffLimit": 0, "template": {
               "metadata": {"labels": {"kwok.x-k8s.io/fail-exit-code": "3"}},
               "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}
    kubectl("apply", "-f", "-", input=json.dumps(job))
    j = wait_for("Job exit3 Failed", lambda: (lambda o: condition(o, "Failed") and o)(
        get_json("job", "exit3", "-n", namespace)), 120)
    assert condition(j, "Failed")["status"] == "True"
    pod = get_json("pods", "-n", namespace, "-l", "job-name=exit3")["items"][0]
    assert pod["status"]["phase"] == "Failed"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"


def test_oom_labelled_pod_fails_trainjob(namespace, kubectl, get_json, wait_for):
    ns = namespace
    # Same MPI runtime, namespaced copy with backoffLimit 0 so one OOM ends the Job at once.
    rt = get_json("clustertrainingruntime", MPI_RUNTIME)
    spec = copy.deepcopy(rt["spec"])
    for rj in spec["template"]["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["backoffLimit"] = 0
    kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
        "metadata": {"name": "mpi-no-retry", "namespace": ns, "labels": rt["metadata"].get("labels", {})},
        "spec": spec}))
    tj = trainjob("oom", ns, runtime="mpi-no-retry", runtime_kind="TrainingRuntime",
                  pod_labels={"kwok.x-k8s.io/oom": "true"})
    kubectl("apply", "-f", "-", input=json.dumps(tj))

    def oom_pod():
        for p in get_json("pods", "-n", ns, "-l", "jobset.sigs.k8s.io/jobset-name=oom")["items"]:
            for cs in p["status"].get("containerStatuses") or []:
                t = cs.get("state", {}).get("terminated")
                if t and t.get("reason") == "OOMKilled":
                    return p, t
        return None
    pod, term = wait_for("a pod terminated with OOMKilled", oom_pod, 120)
    assert pod["status"]["phase"] == "Failed" and term["exitCode"] == 137
    tj = wait_for("TrainJob Failed", lambda: (lambda o: condition(o, "Failed") and
                  condition(o, "Failed")["status"] == "True" and o)(get_json("trainjob", "oom", "-n", ns)), 180)
    assert not condition(tj, "Complete") or condition(tj, "Complete")["status"] != "True"


def test_host_webhook_registration_is_called_by_the_apiserver(namespace, kubectl, get_json,
                                                             register_webhook, serving_cert):
    """The plumbing the product's e2e tests use: a webhook on 127.0.0.1, registered by URL."""
    import base64
    import http.server
    import ssl
    import threading

    calls = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            req = review["request"]
            path = self.path.split("?", 1)[0]  # the apiserver appends ?timeout=10s
            calls.append((path, req["operation"], req["kind"]["kind"]))
            resp = {"uid": req["uid"], "allowed": True}
            labels = req["object"]["metadata"].get("labels") or {}
            if path == "/mutate":
                patch = [{"op": "add", "path": "/metadata/labels", "value": {**labels, "tja-test/mutated": "yes"}}]
                resp.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode())
            elif labels.get("tja-test/deny") == "yes":
                resp.update(allowed=False, status={"code": 403, "message": "denied by the test webhook"})
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "response": resp}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    crt, key, ca_pem = serving_cert("test-webhook")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        name = f"tja-smoke-{namespace}"
        register_webhook(name, f"https://127.0.0.1:{srv.server_address[1]}", ca_pem,
                         namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}})
        denied = trainjob("denied", namespace, labels={"tja-test/deny": "yes"})
        p = kubectl("apply", "-f", "-", input=json.dumps(denied), check=False)
        assert p.returncode != 0 and "denied by the test webhook" in p.stderr, p.stderr
        kubectl("apply", "-f", "-", input=json.dumps(trainjob("allowed", namespace)))
        got = get_json("trainjob", "allowed", "-n", namespace)
        assert (got["metadata"].get("labels") or {}).get("tja-test/mutated") == "yes", (calls, got["metadata"])
        assert ("/mutate", "CREATE", "TrainJob") in calls and ("/validate", "CREATE", "TrainJob") in calls
        control = get_json("validatingwebhookconfiguration", name)
        assert control["webhooks"][0]["clientConfig"]["url"].endswith("/validate")
    finally:
        srv.shutdown()
