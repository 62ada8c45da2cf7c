"""The runtime snapshot of a TrainJob being updated, read from the API for its review
(policies/job/snapshot.py says why it decides the job's runtime).

One GET by name per UPDATE, not a watch: a cluster holds many ConfigMaps, and only those of jobs
being updated matter (UPDATEs are rare next to CREATEs, and /mutate, which patches only on
CREATE, does not ask). A GET that fails or runs out of time leaves the job judged against the
live runtime, as before Trainer v2.3, and says so in the log.
"""
from __future__ import annotations

import logging
from typing import Callable

from trainjob_admission.policies.decide.engine import AdmissionInput
from trainjob_admission.policies.k8s.versions import NEWEST, Versions
from trainjob_admission.policies.job.snapshot import snapshot_name

from ..kube.calls import Calls
from ..kube.client import KubeApi, summary
from ..kube.resources import CONFIG_MAPS

log = logging.getLogger("trainjob_admission.snapshots")

TIMEOUT = 2.0  # seconds: a slow API must leave the evaluation most of the request's deadline


class SnapshotReader(Calls):
    """``await reader(request)`` -> the job's snapshot ConfigMap, or None (none, or not readable)."""

    def __init__(self, api: KubeApi, timeout: float = TIMEOUT, versions: Callable[[], Versions] = lambda: NEWEST):
        super().__init__(api, timeout)
        self.versions = versions  # the cluster's, as discovered: Trainer v2.2 makes no snapshot to read

    async def __call__(self, request: AdmissionInput) -> dict | None:
        name = snapshot_name(request.operation, request.object, self.versions())
        if name is None:
            return None
        try:
            return await self.get(CONFIG_MAPS, request.namespace, name)  # None when NotFound
        except Exception as exc:  # noqa: BLE001 - any failure falls back to the live runtime
            log.warning("cannot read ConfigMap %s/%s (%s): judging the update against the live runtime",
                        request.namespace, name, summary(exc, self.timeout))
            return None
