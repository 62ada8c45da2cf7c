"""The deadline warning's clock and timers (webhook/loops/deadlinewarnings.py) without an API server: the clock
follows Trainer's reconcileDeadline, one timer per running job, none for a suspended or finished
one, a new one after a resume. Posting the Event is shown against the real API server in
tests/cluster/test_deadlines.py."""
from __future__ import annotations

import asyncio
import datetime as dt
import gc
import weakref

import pytest

from trainjob_admission.webhook.loops.deadlinewarnings import (
    WARN_AT, Clock, DeadlineWarnings, Run, clock, event, event_name, run_of,
)


def stamp(seconds_ago: float) -> str:
    moment = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def job(deadline=3600, created=60.0, conditions=(), suspend=None, name="j", uid="u-1") -> dict:
    spec: dict = {"runtimeRef": {"name": "mpi-openmpi"}}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "team-a", "uid": uid, "creationTimestamp": stamp(created)},
            "spec": spec, "status": {"conditions": list(conditions)}}


def condition(kind: str, status: str, ago: float = 0) -> dict:
    return {"type": kind, "status": status, "lastTransitionTime": stamp(ago), "reason": "x", "message": ""}


def test_the_clock_starts_at_creation_or_at_the_last_resume():
    created = clock(job(created=100))
    assert created is not None and created.seconds == 3600
    resumed = clock(job(created=100, conditions=[condition("Suspended", "False", ago=10)]))
    assert resumed is not None and round(resumed.start - created.start) == 90
    # Suspended=True (still suspended, but spec.suspend already false) does not move the start.
    assert clock(job(created=100, conditions=[condition("Suspended", "True", ago=10)])).start == created.start


@pytest.mark.parametrize("obj", [
    job(deadline=None), job(deadline=0), job(deadline="3600"), job(deadline=True), job(suspend=True),
    job(conditions=[condition("Complete", "True")]), job(conditions=[condition("Failed", "True")]),
    {"metadata": {"creationTimestamp": "yesterday"}, "spec": {"activeDeadlineSeconds": 5}},
    {"metadata": {"creationTimestamp": "2026-01-01T00:00:00"}, "spec": {"activeDeadlineSeconds": 5}},  # no zone
    {"spec": {"activeDeadlineSeconds": 5}, "status": {"conditions": "odd"}}, {"spec": []}, {},
])
def test_no_clock_runs_where_trainer_counts_none(obj):
    assert clock(obj) is None


def test_the_event_names_the_job_the_numbers_and_the_end():
    run = Run("team-a", "j", "u-1", Clock(1_800_000_000.0, 3600))
    body = event(run, run.clock.warn_at)
    assert body["type"] == "Warning" and body["reason"] == "DeadlineApproaching"
    assert body["involvedObject"] == {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "j",
                                      "namespace": "team-a", "uid": "u-1"}
    assert body["message"] == ("80% of spec.activeDeadlineSeconds 3600 (1 h) used: Trainer stops the job at "
                               "2027-01-15T09:00:00Z (reason DeadlineExceeded); save a checkpoint before then")
    assert body["metadata"] == {"name": event_name(run), "namespace": "team-a"}
    # one name per run of one job: every replica posts the same Event, a resumed run a new one
    assert event_name(run) == event_name(Run("team-a", "j", "u-1", Clock(1_800_000_000.0, 3600)))
    assert event_name(run) != event_name(Run("team-a", "j", "u-1", Clock(run.clock.start + 60, 3600)))
    assert event_name(run) != event_name(Run("team-a", "j", "u-2", run.clock))


def test_a_run_is_read_from_the_job():
    obj = job(deadline=3600, created=60)
    assert run_of(obj) == Run("team-a", "j", "u-1", clock(obj))
    assert run_of(job(suspend=True)) is None and run_of({"spec": {"activeDeadlineSeconds": 5}}) is None


def timers(*changes) -> DeadlineWarnings:
    """A DeadlineWarnings fed ``changes`` ((method, argument) pairs) on a loop of its own."""
    warnings = DeadlineWarnings(api=None)  # type: ignore[arg-type] - no call reaches the API here
    warnings.loop = asyncio.new_event_loop()
    for method, arg in changes:
        getattr(warnings, method)(arg)
    return warnings


def test_one_timer_per_running_job_due_at_80_percent():
    warnings = timers(("seen", job(deadline=3600, created=60)))
    ((name, timer),) = warnings.timers.values()
    due = timer.when() - warnings.loop.time()
    assert abs(due - (WARN_AT * 3600 - 60)) < 5
    warnings.seen(job(deadline=3600, created=60))  # a status update: the same run keeps its timer
    assert warnings.timers[("team-a", "j")][1] is timer and not timer.cancelled()
    warnings.loop.close()


@pytest.mark.parametrize("change", [
    ("seen", job(suspend=True)), ("seen", job(conditions=[condition("Complete", "True")])),
    ("gone", job()), ("replaced", [job(name="other")]),
])
def test_a_suspended_finished_or_deleted_job_loses_its_timer(change):
    warnings = timers(("seen", job()), change)
    assert ("team-a", "j") not in warnings.timers
    warnings.loop.close()


def test_a_resumed_job_is_timed_from_its_resume_and_a_job_past_its_deadline_not_at_all():
    warnings = timers(("seen", job()))
    (first, _), = warnings.timers.values()
    warnings.seen(job(conditions=[condition("Suspended", "False", ago=5)]))
    (second, timer), = warnings.timers.values()
    assert second != first and abs(timer.when() - warnings.loop.time() - (WARN_AT * 3600 - 5)) < 5
    warnings.seen(job(deadline=30, created=60))
    assert not warnings.timers
    warnings.loop.close()


def test_a_job_already_past_80_percent_is_warned_at_once_and_a_posted_run_not_again():
    obj = job(deadline=100, created=90)
    warnings = timers(("seen", obj))
    ((name, timer),) = warnings.timers.values()
    assert timer.when() <= warnings.loop.time() + 0.1
    warnings.gone(obj)
    warnings.posted[("team-a", "j")] = name  # as after a post or a 409
    warnings.seen(obj)
    assert not warnings.timers
    warnings.loop.close()


@pytest.mark.parametrize("obj", [{}, {"metadata": []}, {"metadata": {"name": 5}}, []])
def test_odd_objects_are_ignored(obj):
    warnings = timers(("seen", obj), ("gone", obj), ("replaced", [obj]))
    assert not warnings.timers
    warnings.loop.close()


class _Job(dict):
    """A TrainJob that can be watched for being kept (a plain dict cannot be weakly referenced)."""


def test_a_timer_keeps_no_job_object():
    """A timer may wait for days: it holds the job's namespace, name, uid and clock, not the
    TrainJob object the watch delivered."""
    obj = _Job(job(deadline=86400 * 14, created=60))
    alive = weakref.ref(obj)
    warnings = timers(("seen", obj))
    del obj
    gc.collect()
    assert alive() is None and len(warnings.timers) == 1
    warnings.loop.close()
