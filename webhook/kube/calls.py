"""API calls for the event loop (the injector and the reconciler): each runs the synchronous
client in a worker thread, bounded by the request's own timeout and by the event loop's, so a
silent API server costs a bounded wait and never a stuck admission."""
from __future__ import annotations

import asyncio
from typing import Any

from .client import ApiError, KubeApi, call_json, list_all
from .resources import JOBS, Resource


class Calls:
    def __init__(self, api: KubeApi, timeout: float):
        self.api, self.timeout = api, timeout

    async def _bounded(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wait_for(asyncio.to_thread(fn, self.api, *args, timeout=(self.timeout, self.timeout),
                                                        **kwargs), timeout=self.timeout + 1)

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

    async def list(self, resource: Resource, *, namespace: str | None = None,
                   label_selector: str | None = None) -> list[dict]:
        items, _ = await self._bounded(list_all, resource, namespace=namespace, label_selector=label_selector)
        return items

    async def get_job(self, kind: str, namespace: str, name: str) -> dict | None:
        """The stored TrainJob/MPIJob, or None when there is none."""
        return await self.get(JOBS[kind], namespace, name)
