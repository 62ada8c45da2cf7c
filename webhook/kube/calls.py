"""API calls for the event loop (the injector, the reconciler, the deadline warnings, the runtime
snapshot reader), on one pooled keep-alive session (webhook/kube/aio.py), each bounded by the
call's own timeout and by the event loop's, so a silent API server costs a bounded wait and never a
stuck admission; during an admission request also by its deadline (webhook/kube/deadline.py)."""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from . import deadline
from .aio import AsyncApi
from .client import ApiError, ClusterUnreachable, KubeApi
from .resources import JOBS, Resource


class Calls:
    def __init__(self, api: KubeApi, timeout: float):
        self.api, self.timeout = api, timeout

    @property
    def http(self) -> AsyncApi:
        return AsyncApi.of(self.api)

    async def _bounded(self, call: Callable[[float], Awaitable[Any]]) -> Any:
        """``call(timeout)`` within ``timeout``, and within the admission request's deadline when one
        is running (webhook/kube/deadline.py): past it the call is not sent, and one cut short by it says so."""
        limit = deadline.bound(self.timeout + 1)  # the event loop's bound, a second after the call's own
        try:
            return await asyncio.wait_for(call(min(self.timeout, limit)), timeout=limit)
        except (TimeoutError, ClusterUnreachable) as exc:
            left = deadline.remaining()
            if left is not None and left <= 0 and (isinstance(exc, TimeoutError) or exc.timed_out):
                raise deadline.DeadlineExceeded("the request's deadline passed while waiting for the Kubernetes "
                                                "API (an object may have been created: the reconciler deletes it "
                                                "once its grace period passes without the job)") from None
            raise

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict:
        return await self._bounded(lambda timeout: self.http.call_json(method, path, timeout=timeout, **kwargs))

    async def get(self, resource: Resource, namespace: str, name: str) -> dict | None:
        """The object, or None when there is none."""
        try:
            return await self._call("GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, resource: Resource, namespace: str, body: dict) -> dict | None:
        """The object as stored; None when an object of that name already exists: the caller
        decides what to do."""
        try:
            return await self._call("POST", resource.path(namespace), body=body)
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise

    async def replace(self, resource: Resource, body: dict) -> dict | None:
        """PUT ``body`` over the stored object, on the condition that it is still the version
        ``body``'s metadata.resourceVersion names (optimistic concurrency, as every Kubernetes
        controller writes): the object as stored, or None when another write came first (409)
        or the object is gone (404)."""
        meta = body["metadata"]
        try:
            return await self._call("PUT", resource.path(meta["namespace"], meta["name"]), body=body)
        except ApiError as exc:
            if exc.status in (404, 409):
                return None
            raise

    async def delete(self, resource: Resource, obj: dict) -> None:
        """Delete exactly the object we looked at, not one that replaced it meanwhile."""
        meta = obj["metadata"]
        options = {"apiVersion": "v1", "kind": "DeleteOptions",
                   "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}}
        await self._call("DELETE", resource.path(meta["namespace"], meta["name"]), body=options)

    async def json_patch(self, resource: Resource, obj: dict, operations: list[dict]) -> None:
        meta = obj["metadata"]
        await self._call("PATCH", resource.path(meta["namespace"], meta["name"]), body=operations,
                         content_type="application/json-patch+json")

    async def list_objects(self, resource: Resource, *, namespace: str | None = None,
                           label_selector: str | None = None) -> list[dict]:
        items, _ = await self._bounded(lambda timeout: self.http.list_all(
            resource, namespace=namespace, label_selector=label_selector, timeout=timeout))
        return items

    async def get_job(self, kind: str, namespace: str, name: str) -> dict | None:
        """The stored TrainJob/MPIJob, or None when there is none."""
        return await self.get(JOBS[kind], namespace, name)
