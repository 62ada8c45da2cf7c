"""Reservations through the real TLS server (`serve` with the default bundle and the example
cluster state, where team-a has 8 of 32 GPUs free): the first of two 8-GPU jobs is admitted and
reserves its GPUs until its pods exist, so the second, submitted right after, is refused with
the first one named; the decision log and /metrics show the reservation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.objects import example_job
from tests.support.serve import Serve
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


def test_a_job_refused_after_its_decision_gives_its_reservation_back_at_once(tmp_path):
    """team-a's 8 free GPUs are taken by a job whose injections then fail (the API is a closed
    port): the failure mode refuses it, and its reservation goes with the answer, so a dry run of
    an 8-GPU job right after fits."""
    import asyncio
    import threading

    import kubernetes.client

    from tests.support.net import free_port
    from trainjob_admission.policies.capacity.reservations import Reservations
    from trainjob_admission.webhook.admission.server import ServerConfig, WebhookServer
    from trainjob_admission.webhook.cli.demo import sample_state
    from trainjob_admission.webhook.inject.injector import Injector
    from trainjob_admission.webhook.inject.provenance import Provenance
    from trainjob_admission.webhook.kube.client import KubeApi

    from .conftest import Running

    configuration = kubernetes.client.Configuration()
    configuration.host, configuration.verify_ssl, configuration.retries = f"https://127.0.0.1:{free_port()}", False, 0
    ca = serving_cert(tmp_path / "tls")
    config = ServerConfig(host="127.0.0.1", port=0, cert_file=tmp_path / "tls" / "tls.crt",
                          key_file=tmp_path / "tls" / "tls.key", decision_log=tmp_path / "decisions.jsonl")
    state = sample_state()
    state.reservations = Reservations(state)
    server = WebhookServer(config, state, injector=Injector(KubeApi(configuration), Provenance.ephemeral(), timeout=1))
    loop = asyncio.new_event_loop()
    port = loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    running = Running(server, port, ca, tmp_path / "decisions.jsonl", loop, tmp_path / "tls")
    try:
        first = running.review(job("train-a"))
        assert first["allowed"] is False and "could not create Secret" in first["status"]["message"]
        second = running.review(job("train-b"), dryRun=True)
        assert second["allowed"] is True, second.get("status")
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)
