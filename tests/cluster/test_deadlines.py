"""The Warning Event at 80% of a TrainJob's deadline, against the real API server and Trainer:
only a real API server shows that the Event is accepted (core/v1 validation), that two replicas
post it once (the second gets 409), and that Trainer's own clock ends the job after it."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import threading
from pathlib import Path

import pytest

from tests.support.objects import trainjob
from trainjob_admission.webhook.kube.client import api_client
from trainjob_admission.webhook.loops.deadlinewarnings import REASON, DeadlineWarnings

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 10  # seconds: the warning comes at 8


@pytest.fixture
def two_replicas(control_plane):
    """Two DeadlineWarnings on one event loop in a thread, as two replicas of the service would run."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    apis = [api_client(str(control_plane.admin_kubeconfig)) for _ in range(2)]
    replicas = [DeadlineWarnings(api) for api in apis]
    futures = [asyncio.run_coroutine_threadsafe(r.run(), loop) for r in replicas]
    yield replicas
    for future in futures:
        future.cancel()
    loop.call_soon_threadsafe(loop.stop)
    for api in apis:
        api.close()


def test_the_warning_comes_once_at_80_percent_then_trainer_stops_the_job(two_replicas, namespace, kubectl,
                                                                          get_json, wait_for):
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "examples/runtimes/mpi-openmpi.yaml"))
    # KWOK ends a Job's pods after 3 s unless told otherwise: these run past the deadline.
    job = trainjob("short", namespace, nodes=2, gpus=0, pod_annotations={"kwok.x-k8s.io/run-duration": "120s"})
    job["spec"]["activeDeadlineSeconds"] = DEADLINE
    kubectl("create", "-f", "-", input=json.dumps(job))
    created = get_json("trainjob", "short", "-n", namespace)

    def warnings() -> list[dict]:
        items = get_json("events", "-n", namespace)["items"]
        return [e for e in items if e.get("reason") == REASON]

    key = (namespace, "short")
    wait_for(f"both replicas to time the job: {created}",
             lambda: all(key in r.timers or key in r.posted for r in two_replicas), timeout=DEADLINE)
    (event,) = wait_for("the DeadlineApproaching Event", warnings, timeout=DEADLINE + 20)
    assert event["type"] == "Warning" and event["count"] == 1
    assert event["involvedObject"]["uid"] == created["metadata"]["uid"]
    assert event["involvedObject"]["kind"] == "TrainJob" and event["involvedObject"]["name"] == "short"
    assert event["message"].startswith(f"80% of spec.activeDeadlineSeconds {DEADLINE} (10 s) used: Trainer stops "
                                       "the job at ")
    # Trainer's clock and ours agree: it fails the job at the deadline the message named, after the warning.
    failed = wait_for("Trainer's DeadlineExceeded", lambda: next(
        (c for c in get_json("trainjob", "short", "-n", namespace).get("status", {}).get("conditions", [])
         if c["type"] == "Failed" and c["status"] == "True"), None), timeout=DEADLINE + 30)
    assert failed["reason"] == "DeadlineExceeded"
    stops = re.search(r"stops the job at (\S+Z)", event["message"]).group(1)
    late = (when(failed["lastTransitionTime"]) - when(stops)).total_seconds()
    assert 0 <= late <= 5, (stops, failed["lastTransitionTime"])
    assert when(event["firstTimestamp"]) < when(stops)
    assert len(warnings()) == 1, "two replicas, one Event"
    assert all(r.posted for r in two_replicas), "each replica counts the Event as posted (one of them got 409)"


def when(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
