"""List+watch caches: a :class:`Watcher` keeps a :class:`Sink` equal to one resource's objects.

Each watched resource has its own daemon thread running the synchronous client; every call has
a timeout. A watch resumes from its last resourceVersion (bookmarks keep that fresh); when the
version is too old (410 Gone) the resource is listed again and its sink *replaced*, so objects
deleted while we were disconnected are dropped. Connection errors back off (0.5 s doubling to
30 s) and keep the last known state: a webhook that answers from slightly old state beats one
that stops answering while the API server restarts.
"""
from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
from typing import Iterator, Protocol

import urllib3

from .client import (
    CONNECT_TIMEOUT, METADATA_WATCH, ApiError, Expired, KubeApi, api_failure, clean, list_all, request, selectors,
)
from .resources import Resource

log = logging.getLogger("trainjob_admission.kube.watch")

WATCH_SECONDS = 60  # server-side end of one watch; the client's read timeout allows a little more
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
MISSING_CRD_RECHECK = 30.0


class Sink(Protocol):
    def replace(self, objects: list[dict]) -> None: ...
    def apply(self, event: str, obj: dict) -> None: ...  # ADDED, MODIFIED, DELETED


class Fanout:
    """One watch's events to several consumers (one TrainJob watch serves the deadline warnings
    and the reservations: a second watch would double the API server's work and our memory)."""

    def __init__(self, *sinks: Sink):
        self.sinks = sinks

    def replace(self, objects: list[dict]) -> None:
        for sink in self.sinks:
            sink.replace(objects)

    def apply(self, event: str, obj: dict) -> None:
        for sink in self.sinks:
            sink.apply(event, obj)


class Watcher:
    """Keeps ``sink`` equal to one resource's objects (in ``namespace``, default all): list, then
    watch from the list's resourceVersion; resume after a dropped watch, list again (replacing)
    after 410 Gone."""

    def __init__(self, api: KubeApi, resource: Resource, sink: Sink, *, label_selector: str | None = None,
                 field_selector: str | None = None, namespace: str | None = None, metadata_only: bool = False):
        self.api, self.resource, self.sink, self.label_selector = api, resource, sink, label_selector
        self.field_selector = field_selector  # objects that stop matching arrive as DELETED
        self.namespace = namespace
        self.metadata_only = metadata_only  # objects arrive as their metadata alone (no Secret data)
        self.resource_version: str | None = None
        self.synced = threading.Event()  # set after the first complete list
        self.relists = self.errors = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._response: urllib3.HTTPResponse | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.resource.plural}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Ask the thread to end (it does at its next step; a watch read is cut at once)."""
        self._stop.set()
        self.interrupt()

    def stop(self, timeout: float = 5.0) -> None:
        self.close()
        if self._thread:
            self._thread.join(timeout)

    def interrupt(self) -> None:
        """Cut the current watch connection, as a network failure would; the watch resumes."""
        with self._lock:
            if self._response is not None:
                with contextlib.suppress(Exception):
                    self._response.shutdown()

    def _run(self) -> None:
        delay = BACKOFF_MIN
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._watch()
                delay = BACKOFF_MIN
            except Expired as exc:
                log.info("%s: %s; listing again", self.resource.plural, exc)
                self.resource_version = None
            except ApiError as exc:
                if exc.status == 404 and self.resource_version is None:  # the CRD is not installed
                    self._missing()
                    continue
                if exc.status == 404:  # the CRD went away while we watched: list again (and find it gone)
                    self.resource_version = None
                self._failed(exc, delay)
                delay = min(delay * 2, BACKOFF_MAX)
            except Exception as exc:  # noqa: BLE001 - connection errors, timeouts, bad chunks: retry, keep state
                self._failed(exc, delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def _failed(self, exc: Exception, delay: float) -> None:
        if self._stop.is_set():
            return
        self.errors += 1
        self.last_error = str(exc) or type(exc).__name__
        hint = " (RBAC: the service account needs list and watch on it)" if getattr(exc, "status", 0) == 403 else ""
        log.warning("watch of %s failed: %s%s; keeping the last known state, retrying in %.1f s",
                    self.resource.plural, self.last_error, hint, delay)
        self._stop.wait(delay)

    def _missing(self) -> None:
        log.warning("%s: the API has no such resource (CRD not installed?): treating it as empty, "
                    "checking again in %.0f s", self.resource.plural, MISSING_CRD_RECHECK)
        self.sink.replace([])
        self.synced.set()
        self._stop.wait(MISSING_CRD_RECHECK)

    def _relist(self) -> None:
        items, version = list_all(self.api, self.resource, namespace=self.namespace, label_selector=self.label_selector,
                                  field_selector=self.field_selector, metadata_only=self.metadata_only)
        self.sink.replace(items)
        self.resource_version = version
        self.relists += 1
        self.synced.set()
        log.info("listed %d %s at resourceVersion %s", len(items), self.resource.plural, version)

    def _watch(self) -> None:
        seconds = WATCH_SECONDS + random.randint(0, 15)  # spread the watches' reconnects
        query = {"watch": "true", "resourceVersion": self.resource_version or "", "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(seconds), **selectors(self.label_selector, self.field_selector)}
        response = request(self.api, "GET", self.resource.path(self.namespace), query=query,
                           timeout=(CONNECT_TIMEOUT, seconds + 15),
                           accept=METADATA_WATCH if self.metadata_only else "application/json")
        raw = response.response
        if response.status != 200:
            raise api_failure(response.status, json.loads(response.read() or b"{}"), f"watch {self.resource.plural}",
                              response.reason)
        with self._lock:
            if self._stop.is_set():
                raw.close()
                return
            self._response = raw
        complete = False
        try:
            for line in _lines(raw):
                self._event(json.loads(line))
            complete = True
        finally:
            with self._lock:
                self._response = None
            if complete:
                raw.release_conn()  # a cleanly ended watch leaves a reusable connection
            else:
                raw.close()

    def _event(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise api_failure(obj.get("code", 0), obj, f"watch {self.resource.plural}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.sink.apply(kind, clean(self.resource, obj))
        if version:
            self.resource_version = version


def _lines(raw: urllib3.HTTPResponse) -> Iterator[bytes]:
    buffer = b""
    for chunk in raw.stream(amt=None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer
