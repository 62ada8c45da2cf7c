"""Reservations through the real TLS server (`serve` with the default bundle and the example
cluster state, where team-a has 8 of 32 GPUs free): the first of two 8-GPU jobs is admitted and
reserves its GPUs until its pods exist, so the second, submitted right after, is refused with
the first one named; the decision log and /metrics show the reservation."""
from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support.objects import example_job
from tests.support.serve import Serve
from trainjob_admission.webhook.admission.ledger import ANNOTATION as LEDGER_ANNOTATION
from trainjob_admission.webhook.cli.demo import admission_review

from .conftest import serving_cert

pytestmark = pytest.mark.server
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def job(name: str, nodes: int = 2) -> dict:
    obj = example_job("over-quota.yaml")
    obj["metadata"]["name"] = name
    obj["spec"]["trainer"]["numNodes"] = nodes  # 2: 2 x 4 GPUs, exactly what team-a has free
    return obj


def test_the_second_of_two_back_to_back_jobs_is_refused_naming_the_first(tmp_path):
    ca = serving_cert(tmp_path / "tls")
    with Serve(tmp_path, tmp_path / "tls", ca.cert_pem.bytes(), "--bundle", "builtin:default",
               "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
               "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml")) as server:
        first, second = (json.loads(server.call("/validate", admission_review(job(name)))[1])["response"]
                         for name in ("train-a", "train-b"))
        metrics = server.call("/metrics", base=server.probe_url)[1]
        records = server.records()

    assert first["allowed"] is True
    assert second["allowed"] is False
    assert ('quota "compute" in team-a allows 32 nvidia.com/gpu; 24 in use and 8 reserved by jobs whose pods do not '
            'exist yet (train-a: 8)') in second["status"]["message"]
    assert "wait for train-a to start or finish" in second["status"]["message"]
    by_uid = {r.get("uid"): r for r in records}
    counted = {r["key"]: r for r in by_uid[second["uid"]]["facts"]["reservations"]}  # every key the job needs
    assert counted["requests.nvidia.com/gpu"] == {"namespace": "team-a", "quota": "compute",
                                                  "key": "requests.nvidia.com/gpu", "reserved": 8,
                                                  "jobs": {"train-a": 8}}
    assert counted["pods"]["jobs"] == {"train-a": 2}
    assert "reservations" not in (by_uid[first["uid"]].get("facts") or {})
    assert 'trainjob_admission_reserved{namespace="team-a",resource="requests.nvidia.com/gpu"} 8.0' in metrics


def test_a_pod_the_quota_counts_before_the_watch_shows_it_is_not_counted_twice(tmp_path):
    """ResourceQuota admission counts a pod before the pod is stored, so for a moment the quota's
    usage and its job's reservation both hold it. A refusal that counted reservations is judged
    again once the pod watch caught up: here the second job fits exactly and is admitted."""
    import threading

    from trainjob_admission.policies.capacity.reservations import Reservations

    from .conftest import start_server, stop_server

    running, thread = start_server(tmp_path)
    state = running.server.state
    state.reservations = Reservations(state)
    quota = state.quotas["team-a"]["compute"]
    gpus = "requests.nvidia.com/gpu"
    quota["spec"]["hard"][gpus] = quota["status"]["hard"][gpus] = "40"  # room for two 8-GPU jobs: 24 + 8 + 8
    pods = [{"metadata": {"name": f"train-a-{rjob}-0-0", "namespace": "team-a",
                          "labels": {"jobset.sigs.k8s.io/jobset-name": "train-a",
                                     "jobset.sigs.k8s.io/replicatedjob-name": rjob}},
             "spec": {"containers": [{"name": rjob, "resources": {"requests": {"nvidia.com/gpu": "4"},
                                                                  "limits": {"nvidia.com/gpu": "4"}}}]},
             "status": {"phase": "Pending"}} for rjob in ("launcher", "node")]
    try:
        assert running.review(job("train-a", nodes=1))["allowed"] is True  # 1 worker x 4 + 1 launcher x 4
        # the quota admitted train-a's two pods (its usage went up) a moment before the pod watch shows them
        quota["status"]["used"][gpus] = "32"
        threading.Timer(0.1, lambda: [running.loop.call_soon_threadsafe(state.reservations.pod_seen, pod)
                                      for pod in pods]).start()
        second = running.review(job("train-b", nodes=1))
        assert second["allowed"] is True, second.get("status")
        # with the room really taken, the refusal stands after the second look
        quota["status"]["used"][gpus] = "40"
        assert running.review(job("train-c", nodes=1))["allowed"] is False
    finally:
        stop_server(running, thread)


def small(name: str) -> dict:
    """2 nodes x 1 GPU: 2 of the 8 GPUs team-a has free, so 4 such jobs fit."""
    obj = job(name)
    obj["spec"]["trainer"]["resourcesPerNode"]["limits"] = {"nvidia.com/gpu": 1}
    return obj


def test_concurrent_validates_on_one_namespace_admit_exactly_what_fits(tmp_path):
    """16 /validate at once for one namespace (a burst of creations): decisions that take room in
    its quota are made one at a time, each with the earlier admissions' reservations counted, so
    exactly the 4 that fit are admitted, whatever the timing."""
    import threading

    ca = serving_cert(tmp_path / "tls")
    with Serve(tmp_path, tmp_path / "tls", ca.cert_pem.bytes(), "--bundle", "builtin:default",
               "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
               "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml")) as server:
        start = threading.Barrier(16)
        answers: dict[str, dict] = {}

        def submit(name: str) -> None:
            review = admission_review(small(name))
            start.wait()
            answers[name] = json.loads(server.call("/validate", review, timeout=30)[1])["response"]

        threads = [threading.Thread(target=submit, args=(f"burst-{i:02d}",)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        records = {r.get("name"): r for r in server.records() if r.get("endpoint") == "validate"}

    admitted = sorted(name for name, answer in answers.items() if answer["allowed"])
    assert len(answers) == 16 and len(admitted) == 4, admitted
    for name, answer in answers.items():
        if name not in admitted:
            assert "8 reserved by jobs whose pods do not exist yet" in answer["status"]["message"], answer
    for name in admitted:
        fact = records[name]["facts"]["reservation"]
        assert fact["path"] == "replica" and fact["reserved"]["compute"]["requests.nvidia.com/gpu"] == 2, fact


def stored(obj: dict) -> dict:
    """As /validate sees a CREATE: the API server has given the job its uid."""
    obj["metadata"]["uid"] = str(uuid.uuid4())
    return obj


def lease_entries(memory_api) -> dict[str, dict]:
    lease = memory_api.objects[("leases", "team-a", "trainjob-admission-reservations")]
    return {e["job"]: e for e in json.loads(lease["metadata"]["annotations"][LEDGER_ANNOTATION])["entries"]}


def burst(replicas: list, names: list[str]) -> dict[str, dict]:
    """One /validate per name, all at once, spread over ``replicas`` in turn; name -> response."""
    start = threading.Barrier(len(names))
    answers: dict[str, dict] = {}

    def submit(i: int, name: str) -> None:
        obj = stored(small(name))
        start.wait()
        answers[name] = replicas[i % len(replicas)].review(obj)

    threads = [threading.Thread(target=submit, args=(i, n)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers


def test_two_replicas_sharing_the_ledger_admit_exactly_what_fits(injecting_server, memory_api):
    """Two replicas, each seeing only its own admissions and the namespace's ledger (no watch
    here), split a burst of 16: a write to the ledger names the version it was decided against,
    so the second writer of a version decides again with the first one's entry counted."""
    replicas = [injecting_server(ledger="memory"), injecting_server(ledger="memory")]
    answers = burst(replicas, [f"burst-{i:02d}" for i in range(16)])
    admitted = sorted(name for name, answer in answers.items() if answer["allowed"])
    assert len(answers) == 16 and len(admitted) == 4, admitted
    assert sorted(lease_entries(memory_api)) == admitted
    refused = [a["status"]["message"] for a in answers.values() if not a["allowed"]]
    assert all("8 reserved by jobs whose pods do not exist yet" in m for m in refused), refused
    facts = [r["facts"]["reservation"] for running in replicas for r in running.records()
             if r.get("endpoint") == "validate" and r.get("allowed")]
    assert {f["path"] for f in facts} == {"ledger"} and all(f["ledger"].startswith("Lease team-a/") for f in facts)
    writes = sum(int(float(line.rsplit(" ", 1)[1])) for running in replicas for line in running.get("/metrics")[1].splitlines()
                 if line.startswith('trainjob_admission_reservation_writes_total{result="written"}'))
    assert writes == 4, "one write per admitted job"


def test_a_job_refused_after_its_decision_gives_its_reservation_back_at_once(injecting_server, memory_api):
    """train-a takes team-a's 8 free GPUs, then is refused anyway (a planted Secret of its name):
    its entry leaves the ledger with the answer, so train-b, which needs the same 8, is admitted."""
    running = injecting_server(ledger="memory")
    memory_api.put("secrets", {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
                               "metadata": {"name": "train-a-mpi-ssh-auth", "namespace": "team-a"}, "data": {}})
    first = running.review(stored(job("train-a")))
    assert first["allowed"] is False and "existing-objects" in first["status"]["message"]
    second = running.review(stored(job("train-b")))
    assert second["allowed"] is True, second.get("status")
    deadline = time.monotonic() + 10
    while sorted(lease_entries(memory_api)) != ["train-b"]:
        assert time.monotonic() < deadline, lease_entries(memory_api)
        time.sleep(0.05)


@pytest.mark.parametrize("failure_mode", ["deny", "allow"])
def test_an_unreachable_ledger_is_answered_by_the_failure_mode(injecting_server, memory_api, failure_mode):
    from tests.support.net import free_port

    running = injecting_server(ledger=f"http://127.0.0.1:{free_port()}", failure_mode=failure_mode)
    answer = running.review(stored(job("train-a")))
    assert answer["allowed"] is (failure_mode == "allow")
    if failure_mode == "deny":
        message = answer["status"]["message"]
        assert ("its quota reservation could not be taken (could not read Lease "
                "team-a/trainjob-admission-reservations: the API server did not answer") in message, message
        assert "failure mode is deny" in message
    assert 'trainjob_admission_reservation_failures_total{reason="unreachable"} 1.0' in running.get("/metrics")[1]
    assert not memory_api.objects, "nothing created for a job that was not decided"


def test_a_forged_ledger_entry_can_refuse_and_an_unreadable_ledger_admits_nothing(injecting_server, memory_api):
    """Whoever may write the Lease (the namespace's editors, in Kubernetes 1.36) can make it claim
    room: that refuses jobs, naming the claim, for at most an entry's lifetime. Content this
    version cannot read is the failure mode, never read as empty."""
    running = injecting_server(ledger="memory")
    key = ("leases", "team-a", "trainjob-admission-reservations")
    forged = {"job": "squatter", "uid": "u", "generation": 1, "expires": time.time() + 20, "replica": "",
              "reserved": {"compute": {"requests.nvidia.com/gpu": 8}}}
    memory_api.put(key[0], {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {},
                            "metadata": {"name": key[2], "namespace": key[1], "annotations": {
                                LEDGER_ANNOTATION: json.dumps({"format": 1, "entries": [forged]})}}})
    refused = running.review(stored(job("train-a")))
    assert refused["allowed"] is False and "8 reserved by jobs whose pods do not exist yet (squatter: 8)" in \
        refused["status"]["message"], refused["status"]
    memory_api.objects[key]["metadata"]["annotations"][LEDGER_ANNOTATION] = "[not json"
    unreadable = injecting_server(ledger="memory").review(stored(job("train-b")))  # a replica reading it first
    assert unreadable["allowed"] is False
    assert "annotation trainjob-admission.io/reservations is not JSON" in unreadable["status"]["message"]


def test_a_conflict_storm_until_the_deadline_is_answered_by_the_failure_mode(injecting_server, memory_api):
    """Every write of the ledger finds another replica's newer version: the replica reads and
    decides again until the request's deadline is near, then answers the failure mode, saying
    so; nothing of the job stays in the ledger."""
    running = injecting_server(ledger="memory")
    key = ("leases", "team-a", "trainjob-admission-reservations")
    memory_api.put(key[0], {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {},
                            "metadata": {"name": key[2], "namespace": key[1]}})
    memory_api.conflicts = 10**6
    answer = running.review(stored(job("train-a")))
    assert answer["allowed"] is False
    assert "was written by another replica" in answer["status"]["message"], answer["status"]
    assert "until the request's deadline" in answer["status"]["message"]
    metrics = running.get("/metrics")[1]
    assert 'trainjob_admission_reservation_failures_total{reason="conflict"} 1.0' in metrics
    memory_api.conflicts = 0
    assert LEDGER_ANNOTATION not in (memory_api.objects[key]["metadata"].get("annotations") or {})
