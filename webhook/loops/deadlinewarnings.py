"""A Warning Event on each running TrainJob at 80% of its deadline, so its owner can save a
checkpoint before Trainer stops it.

The time is counted as Trainer counts it (pkg/controller/trainjob_controller.go
reconcileDeadline): from creationTimestamp, or from the lastTransitionTime of the condition
Suspended=False after a resume; a suspended or finished job's clock does not run, and at the
deadline Trainer marks the job Failed (DeadlineExceeded) and deletes its JobSet. One timer per
job, set from the TrainJob watch (no periodic sweep). The Event's name is derived from the job's
uid and its clock's start, so every replica posts the same Event and all but the first get 409;
a resumed job gets a new one. MPIJobs get none: their clock is the launcher Job's own startTime.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from trainjob_admission.policies.checks.duration import human

from ..kube.calls import Calls
from ..kube.client import KubeApi, summary
from ..kube.resources import EVENTS, JOBS
from ..kube.watch import Fanout, Sink, Watcher

log = logging.getLogger("trainjob_admission.deadlines")

WARN_AT = 0.8  # of the deadline
REASON = "DeadlineApproaching"
COMPONENT = "trainjob-admission"
RETRY_SECONDS = 10.0  # after a failed post, while the deadline has not passed
FINISHED = ("Complete", "Failed")  # trainjob.IsTrainJobFinished


@dataclass(frozen=True)
class Clock:
    """A running job's deadline as Trainer counts it (wall-clock seconds since the epoch)."""

    start: float
    seconds: int

    @property
    def warn_at(self) -> float:
        return self.start + WARN_AT * self.seconds

    @property
    def ends(self) -> float:
        return self.start + self.seconds


def clock(job: dict) -> Clock | None:
    """The job's running clock; None when no clock runs (no deadline, suspended, finished) or
    the object is not one Trainer would count."""
    spec, status = job.get("spec"), job.get("status")
    seconds = spec.get("activeDeadlineSeconds") if isinstance(spec, dict) else None
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 1 or spec.get("suspend") is True:
        return None
    conditions = [c for c in (status.get("conditions") if isinstance(status, dict) else None) or []
                  if isinstance(c, dict)]
    if any(c.get("type") in FINISHED and c.get("status") == "True" for c in conditions):
        return None
    start = (job.get("metadata") or {}).get("creationTimestamp")
    resumed = next((c for c in conditions if c.get("type") == "Suspended" and c.get("status") == "False"), None)
    if resumed is not None:
        start = resumed.get("lastTransitionTime")
    started = _timestamp(start)
    return Clock(started, seconds) if started is not None else None


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Run:
    """One run of one job: all a timer keeps of it (whole TrainJobs, held for days until their
    warning is due, would add up)."""

    namespace: str
    name: str
    uid: str
    clock: Clock

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def run_of(job: dict) -> Run | None:
    """The job's current run, or None when no clock runs or the object has no namespace and name."""
    key = _key(job)
    running = clock(job) if key is not None else None
    if key is None or running is None:
        return None
    return Run(*key, str(job["metadata"].get("uid") or ""), running)


def event_name(run: Run) -> str:
    """The same on every replica for one run of one job: a new run (a resume) gets a new one."""
    digest = hashlib.sha256(f"{run.uid}/{run.clock.start}/{run.clock.seconds}".encode()).hexdigest()[:10]
    return f"{run.name[:200]}.deadline-{digest}"


def event(run: Run, now: float) -> dict:
    """A core/v1 Warning Event on the job, as `kubectl describe trainjob` and `kubectl get events` show."""
    running = run.clock
    used = min(99, max(int(100 * WARN_AT), int(100 * (now - running.start) / running.seconds)))
    stamp = _iso(now)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(run), "namespace": run.namespace},
        "involvedObject": {"apiVersion": JOBS["TrainJob"].api_version, "kind": "TrainJob", "name": run.name,
                           "namespace": run.namespace, "uid": run.uid},
        "type": "Warning", "reason": REASON,
        "message": (f"{used}% of spec.activeDeadlineSeconds {human(running.seconds)} used: Trainer stops the job at "
                    f"{_iso(running.ends)} (reason DeadlineExceeded); save a checkpoint before then"),
        "source": {"component": COMPONENT}, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


class DeadlineWarnings(Calls):
    """One timer per running TrainJob with a deadline, fed by a TrainJob watch; each timer posts
    its job's Event once. Everything runs on the event loop except the watch's thread, which
    hands the objects over."""

    def __init__(self, api: KubeApi, *, timeout: float = 5.0, also: tuple[Sink, ...] = ()):
        """``also``: other consumers of the same TrainJob watch (webhook/loops/reservationfeed.py)."""
        super().__init__(api, timeout)
        self.also = also
        self.timers: dict[tuple[str, str], tuple[str, asyncio.TimerHandle]] = {}  # job -> (event name, timer)
        self.posted: dict[tuple[str, str], str] = {}  # job -> the Event posted (or found posted) for its run
        self.posting: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> None:
        """Forever: watch TrainJobs, time their Events; the watch resumes and relists by itself."""
        self.loop = asyncio.get_running_loop()
        watcher = Watcher(self.api, JOBS["TrainJob"], Fanout(_Jobs(self), *self.also))
        watcher.start()
        try:
            await asyncio.Event().wait()
        finally:
            watcher.close()
            for _, timer in self.timers.values():
                timer.cancel()

    def seen(self, job: dict) -> None:
        """A job as it is now: (re)time its Event, or drop its timer when no clock runs."""
        key = _key(job)
        if key is None:
            return
        run = run_of(job)
        name = event_name(run) if run is not None else None
        current = self.timers.get(key)
        if current is not None and current[0] == name:
            return  # the same run: its timer stands
        self._cancel(key)
        if run is None or self.posted.get(key) == name or time.time() >= run.clock.ends:
            return  # past the deadline Trainer fails the job: a warning would come too late
        assert self.loop is not None
        timer = self.loop.call_later(max(0.0, run.clock.warn_at - time.time()), self._due, run)
        self.timers[key] = (str(name), timer)

    def gone(self, job: dict) -> None:
        key = _key(job)
        if key is not None:
            self._cancel(key)
            self.posted.pop(key, None)

    def replaced(self, jobs: list[dict]) -> None:
        """After a (re)list: exactly these jobs exist."""
        keys = {_key(job) for job in jobs}
        for key in [k for k in (*self.timers, *self.posted) if k not in keys]:
            self._cancel(key)
            self.posted.pop(key, None)
        for job in jobs:
            self.seen(job)

    def _cancel(self, key: tuple[str, str]) -> None:
        current = self.timers.pop(key, None)
        if current is not None:
            current[1].cancel()

    def _due(self, run: Run) -> None:
        self.timers.pop(run.key, None)
        task = asyncio.ensure_future(self._post(run))
        self.posting.add(task)
        task.add_done_callback(self.posting.discard)

    async def _post(self, run: Run) -> None:
        body = event(run, time.time())
        name, key = body["metadata"]["name"], run.key
        try:
            created = await self.create(EVENTS, run.namespace, body)
        except Exception as exc:  # noqa: BLE001 - the API may be away: try again while it still matters
            log.warning("could not post the deadline Event for TrainJob %s/%s: %s", *key, summary(exc, self.timeout))
            if key not in self.timers and time.time() + RETRY_SECONDS < run.clock.ends:
                assert self.loop is not None
                self.timers[key] = (name, self.loop.call_later(RETRY_SECONDS, self._due, run))
            return
        self.posted[key] = name
        if created:
            log.info("TrainJob %s/%s: %s", *key, body["message"])


def _key(job: dict) -> tuple[str, str] | None:
    meta = job.get("metadata") if isinstance(job, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not isinstance(meta.get("namespace"), str):
        return None
    return meta["namespace"], meta["name"]


class _Jobs:
    """The TrainJob watch's sink: hands each change to the event loop."""

    def __init__(self, warnings: DeadlineWarnings):
        self.warnings = warnings

    def replace(self, objects: list[dict]) -> None:
        self._call(self.warnings.replaced, objects)

    def apply(self, event: str, obj: dict) -> None:
        if event == "DELETED":
            self._call(self.warnings.gone, obj)
        else:
            self._call(self.warnings.seen, obj)

    def _call(self, fn: Any, arg: Any) -> None:
        assert self.warnings.loop is not None
        self.warnings.loop.call_soon_threadsafe(fn, arg)
