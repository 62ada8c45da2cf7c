"""API calls for the event loop (the injector and the reconciler): each runs the synchronous
client in a worker thread, bounded by the request's own timeout and by the event loop's, so a
silent API server costs a bounded wait and never a stuck admission; during an admission request
also by its deadline (webhook/deadline.py).

The threads are their own pool, as large as the client's connection pool (webhook/kube/client.py
POOL): asyncio's default pool has cpu+4 threads, so 20 jobs submitted together (40 creations)
queued behind each other in our process instead of reaching the API server at once."""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import deadline
from .client import POOL, ApiError, ClusterUnreachable, KubeApi, call_json, list_all
from .resources import JOBS, Resource


_THREADS = ThreadPoolExecutor(max_workers=POOL, thread_name_prefix="kube-call")


class Calls:
    def __init__(self, api: KubeApi, timeout: float):
        self.api, self.timeout = api, timeout

    async def _bounded(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """The call within ``timeout``, and within the admission request's deadline when one is
        running (webhook/deadline.py): past it the call is not sent, and one cut short by it says so."""
        limit = deadline.bound(self.timeout + 1)  # the event loop's bound, a second after the client's own
        timeout = min(self.timeout, limit)
        try:
            call = functools.partial(fn, self.api, *args, timeout=(timeout, timeout), **kwargs)
            return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(_THREADS, call), timeout=limit)
        except (TimeoutError, ClusterUnreachable) as exc:
            left = deadline.remaining()
            if left is not None and left <= 0 and (isinstance(exc, TimeoutError) or exc.timed_out):
                raise deadline.DeadlineExceeded("the request's deadline passed while waiting for the Kubernetes "
                                                "API (an object may have been created: the reconciler deletes it "
                                                "once its grace period passes without the job)") from None
            raise

    async def get(self, resource: Resource, namespace: str, name: str) -> dict | None:
        """The object, or None when there is none."""
        try:
            return await self._bounded(call_json, "GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, resource: Resource, namespace: str, body: dict) -> bool:
        """False when an object of that name already exists: the caller decides what to do."""
        try:
            await self._bounded(call_json, "POST", resource.path(namespace), body=body)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def delete(self, resource: Resource, obj: dict) -> None:
        """Delete exactly the object we looked at, not one that replaced it meanwhile."""
        meta = obj["metadata"]
        options = {"apiVersion": "v1", "kind": "DeleteOptions",
                   "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
        await self._bounded(call_json, "DELETE", resource.path(meta["namespace"], meta["name"]), body=options)

    async def json_patch(self, resource: Resource, obj: dict, operations: list[dict]) -> None:
        meta = obj["metadata"]
        await self._bounded(call_json, "PATCH", resource.path(meta["namespace"], meta["name"]), body=operations,
                            content_type="application/json-patch+json")

    async def list_objects(self, resource: Resource, *, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict]:
        items, _ = await self._bounded(list_all, resource, namespace=namespace, label_selector=label_selector)
        return items

    async def get_job(self, kind: str, namespace: str, name: str) -> dict | None:
        """The stored TrainJob/MPIJob, or None when there is none."""
        return await self.get(JOBS[kind], namespace, name)
