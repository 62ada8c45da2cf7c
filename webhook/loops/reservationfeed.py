"""Feeds policies/capacity/reservations.py from the API, so every replica, and a replica after a restart,
derives the same reservations.

TrainJobs come from the cluster-wide TrainJob watch the deadline warnings already run
(webhook/loops/deadlinewarnings.py fans its events out here). Pods come from a watch of their own, selected by
the label JobSet puts on every pod it creates (``jobset.sigs.k8s.io/jobset-name``): the state's Pod
watch (webhook/kube/resources.py FIELD_SELECTORS) sees only pods bound to a node, but a quota
counts a pod from its creation, and an unbound pod is exactly the one that must end its job's
reservation. Each pod is slimmed at once to its job, pod set and numbers (HeldPod); pods of no
JobSet never reach us. Both are fed from the watch threads; the model takes its own lock.
"""
from __future__ import annotations

import threading

from trainjob_admission.policies.capacity.reservations import JOBSET_NAME, Reservations

from ..kube.client import KubeApi
from ..kube.resources import PODS
from ..kube.watch import Watcher


class JobSink:
    """The TrainJob watch's events, into the model."""

    def __init__(self, reservations: Reservations):
        self.reservations = reservations
        self.synced = threading.Event()  # after the first list: /readyz waits for it

    def replace(self, objects: list[dict]) -> None:
        self.reservations.jobs_listed(objects)
        self.synced.set()

    def apply(self, event: str, obj: dict) -> None:
        if event == "DELETED":
            self.reservations.job_gone(obj)
        else:
            self.reservations.job_seen(obj)


class PodSink:
    """The JobSet pods' watch's events, into the model."""

    def __init__(self, reservations: Reservations):
        self.reservations = reservations

    def replace(self, objects: list[dict]) -> None:
        self.reservations.pods_listed(objects)

    def apply(self, event: str, obj: dict) -> None:
        self.reservations.pod_seen(obj, keep=event != "DELETED")


def pod_watcher(api: KubeApi, reservations: Reservations) -> Watcher:
    return Watcher(api, PODS, PodSink(reservations), label_selector=JOBSET_NAME)
