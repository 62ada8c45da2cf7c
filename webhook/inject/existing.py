"""What already exists under the names our injections use, from watches, so that admission can
refuse a planted object without a call: a Secret `<job>-mpi-ssh-auth` that Trainer's MPI plugin
would mount instead of making its own key, a NetworkPolicy `<job>-mpi-isolation`, and whether a
namespace has its isolating NetworkPolicy (policies/decide/injections.py, isolation_policy).

Secrets are watched as metadata only (PartialObjectMetadata): no Secret's data ever reaches this
process through these watches, and only those named like Trainer's SSH Secret are kept. Every
NetworkPolicy is watched (they hold no secret; a planted one need not carry our label), and only
those under our names are kept. One watch per kind per namespace the service injects into (or one
cluster-wide), the same scope as the reconciler's; the server is ready once all have listed.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import threading
from typing import Callable

from trainjob_admission.policies.decide import injections

from ..kube.client import KubeApi
from ..kube.resources import NETWORK_POLICIES, SECRETS
from ..kube.watch import Watcher

log = logging.getLogger("trainjob_admission.existing")

ObjectKey = tuple[str, str]  # (namespace, name)
# Called from a watch thread after the cache changed: (kind, event, object); "LISTED" after a relist.
Listener = Callable[[str, str, dict], None]
_ISOLATION_NAMES = frozenset(name for name, _ in injections.ISOLATION_POLICIES.values())
_SECRET_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "ownerReferences",
                    "labels", "annotations")


def _kept(kind: str, name: str) -> bool:
    if kind == "Secret":
        return name.endswith(injections.SSH_SECRET_SUFFIX)
    return name.endswith(injections.NETWORK_POLICY_SUFFIX) or name in _ISOLATION_NAMES


class _Cache:
    """One kind's objects under our names in one scope, as one watch shows them."""

    def __init__(self, kind: str, listeners: list[Listener]):
        self.kind, self.listeners = kind, listeners
        self.objects: dict[ObjectKey, dict] = {}
        self._lock = threading.Lock()

    def _slim(self, obj: dict) -> dict:
        if self.kind != "Secret":
            return obj
        meta = obj.get("metadata") or {}
        return {"metadata": {field: meta[field] for field in _SECRET_METADATA if field in meta}}

    def replace(self, objects: list[dict]) -> None:
        kept = {}
        for obj in objects:
            meta = obj.get("metadata") or {}
            if _kept(self.kind, meta.get("name", "")):
                kept[(meta.get("namespace", ""), meta["name"])] = self._slim(obj)
        with self._lock:
            self.objects = kept
        for listener in self.listeners:
            listener(self.kind, "LISTED", {})

    def apply(self, event: str, obj: dict) -> None:
        meta = obj.get("metadata") or {}
        if not _kept(self.kind, meta.get("name", "")):
            return
        key = (meta.get("namespace", ""), meta["name"])
        slim = self._slim(obj)
        with self._lock:
            if event == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = slim
        for listener in self.listeners:
            listener(self.kind, event, slim)


class ExistingObjects:
    """Secrets (metadata) and NetworkPolicies under our names in ``namespaces`` (None: everywhere).
    Read from the event loop, written by the watch threads; :attr:`watchers` are started by the
    server's cluster sync (webhook/startup.py)."""

    def __init__(self, api: KubeApi, namespaces: list[str] | tuple[str, ...] | None = None):
        self.listeners: list[Listener] = []  # add before the watches start
        self.namespaces = tuple(namespaces) if namespaces else None
        self._caches: dict[tuple[str, str | None], _Cache] = {}
        self.watchers: list[Watcher] = []
        for scope in self.namespaces or (None,):
            for resource in (SECRETS, NETWORK_POLICIES):
                cache = self._caches[(resource.kind, scope)] = _Cache(resource.kind, self.listeners)
                self.watchers.append(Watcher(api, resource, cache, namespace=scope,
                                             metadata_only=resource is SECRETS))

    def _cache(self, kind: str, namespace: str) -> _Cache | None:
        return self._caches.get((kind, namespace if self.namespaces else None))

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        """The object of that name (a Secret's metadata only), or None."""
        cache = self._cache(kind, namespace)
        return cache.objects.get((namespace, name)) if cache is not None else None

    def known(self, namespace: str) -> bool:
        """Whether both watches of ``namespace`` have listed (else what is absent is not known absent)."""
        return self.covers(namespace) and all(
            w.synced.is_set() for w in self.watchers if w.namespace == (namespace if self.namespaces else None))

    def covers(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def all(self, kind: str) -> list[dict]:
        """Every object of ``kind`` kept, in every scope (a copy: the watches go on changing them)."""
        return [obj for (k, _), cache in self._caches.items() if k == kind for obj in list(cache.objects.values())]


def age(meta: dict) -> float:
    """Seconds since the API server stored the object of ``meta`` (infinite when it does not say)."""
    stamp = meta.get("creationTimestamp")
    try:
        created = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        return math.inf
    return (dt.datetime.now(dt.timezone.utc) - created).total_seconds()
