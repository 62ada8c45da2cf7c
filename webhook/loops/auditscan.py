"""``serve --audit-interval``: the background audit in the service, every interval, off by default.

A scan lists the TrainJobs and MPIJobs once, judges them with the bundles in force and the
watched cluster state the reviews use (policies/offline/audit.py), and writes the PolicyReports
(webhook/loops/policyreports.py). It runs on one worker thread, one job at a time with a pause after each:
the reviews' evaluations share the interpreter with one job's evaluation (a few ms) at most,
and get it to themselves in each pause. Between scans it costs a sleeping task.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from trainjob_admission.policies.k8s.clusterstate import ClusterState
from trainjob_admission.policies.offline import audit

from .. import ServiceError
from ..kube.client import ApiError, ClusterUnreachable, KubeApi
from .bundleset import BundleRegistry
from .policyreports import ReportsNotServed, read_jobs, write_reports

log = logging.getLogger("trainjob_admission.audit")

PAUSE = 0.005  # seconds after each job (whose evaluation takes 0.3-5 ms): the reviews get the interpreter


class Stopped(ServiceError):
    """The server is stopping: the scan ends after the job it was judging."""


class BackgroundAudit:
    def __init__(self, api: KubeApi, registry: BundleRegistry, state: ClusterState, interval: float,
                 pause: float = PAUSE):
        self.api, self.registry, self.state = api, registry, state
        self.interval, self.pause = interval, pause
        self._stopping = threading.Event()
        self.scans = 0

    async def run(self) -> None:
        """A scan now (the state is synced), then one every ``interval`` seconds after the last ended."""
        try:
            while True:
                try:
                    await asyncio.to_thread(self.scan)
                except (ApiError, ClusterUnreachable, ReportsNotServed) as exc:
                    log.warning("background audit: %s; next scan in %g s", exc, self.interval)
                await asyncio.sleep(self.interval)
        finally:
            self._stopping.set()  # a scan still on its thread ends after its current job

    def scan(self) -> audit.Audit | None:
        started = time.monotonic()
        bundles = list(self.registry.active)
        try:
            found = audit.audit(read_jobs(self.api, None), bundles, lambda namespace: self.state, self._between)
        except Stopped:
            return None
        deleted = write_reports(self.api, audit.policy_reports(found), None)
        self.scans += 1
        log.info("background audit: %d jobs judged with %d bundles in %.1f s: %s; %d reports written, %d deleted",
                 found.jobs, len(bundles), time.monotonic() - started,
                 ", ".join(f"{n} {k}" for k, n in found.summary().items()),
                 len({r.namespace for r in found.results}), len(deleted))
        return found

    def _between(self) -> None:
        if self._stopping.wait(self.pause):
            raise Stopped()
