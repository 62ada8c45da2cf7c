"""A small in-memory Kubernetes API on loopback for server-tier tests of the injector and the
reservation ledger: namespaced objects by (plural, namespace, name), POST (409 when the name is
taken; uid, resourceVersion and creationTimestamp given), GET, JSON PATCH, PUT (409 unless the body
names the stored resourceVersion, as etcd's optimistic concurrency answers), DELETE (its uid and
resourceVersion preconditions honoured), and list and watch of a namespace's objects of one plural
(resourceVersions from one counter, as etcd's); and fixed answers to GETs of other paths
(``documents``: the discovery documents /version, /apis/<group>, /openapi/v3 of a cluster the tier
cannot run, e.g. one with a Trainer older than v2.2). A stand-in for the API server where only
these semantics matter; the cluster tier runs the real one.
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import jsonpatch

from .serve import send_json

PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/([^/]+)/([^/?]+)(?:/([^/?]+))?")


class MemoryApi(ThreadingHTTPServer):
    """Namespaced objects by (plural, namespace, name): POST (409 when taken), GET, PATCH, PUT (409 on
    a stale resourceVersion), DELETE, list and watch; every request's "METHOD path" in ``requests``
    (watches and lists excluded: they are the caches', not the calls a test counts)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.documents: dict[str, dict] = {}  # path (without the query) -> what a GET of it answers
        self.requests: list[str] = []
        self.changed = threading.Condition()  # a name is taken once, however many creations race for it
        self.version = 1
        self.events: list[tuple[int, str, str, dict]] = []  # (resourceVersion, type, plural, object)
        # That many PUTs find the object changed since it was read, as if another writer always came
        # first (a conflict storm): each bumps the stored version and answers 409.
        self.conflicts = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def lock(self) -> threading.Condition:
        return self.changed

    def put(self, plural: str, obj: dict) -> None:
        """Store ``obj`` as it is (given a uid, resourceVersion and creationTimestamp if it lacks them)."""
        with self.changed:
            meta = obj["metadata"]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
            event = "MODIFIED" if (plural, meta["namespace"], meta["name"]) in self.objects else "ADDED"
            self._record(event, plural, obj)
            self.objects[(plural, meta["namespace"], meta["name"])] = obj

    def remove(self, plural: str, namespace: str, name: str) -> dict | None:
        with self.changed:
            obj = self.objects.pop((plural, namespace, name), None)
            if obj is not None:
                self._record("DELETED", plural, obj)
            return obj

    def _record(self, event: str, plural: str, obj: dict) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.events.append((self.version, event, plural, copy.deepcopy(obj)))
        self.changed.notify_all()


class _Handler(BaseHTTPRequestHandler):
    server: MemoryApi
    protocol_version = "HTTP/1.1"  # a watch streams chunks, as the API server's does

    def _answer(self, status: int, body: dict) -> None:
        send_json(self, status, body)

    def _key(self) -> tuple[str, str, str]:
        namespace, plural, name = PATH.match(urlsplit(self.path).path).groups()
        return plural, namespace, name or ""

    def _body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        document = self.server.documents.get(self.path.split("?", 1)[0])
        if document is not None or not PATH.match(self.path):
            self.server.requests.append(f"GET {self.path}")
            if document is None:
                return self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})
            return self._answer(200, document)
        plural, namespace, name = self._key()
        if not name:
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            return self._watch(plural, namespace, query) if query.get("watch") == "true" else self._list(plural, namespace)
        self.server.requests.append(f"{self.command} {self.path}")
        obj = self.server.objects.get((plural, namespace, name))
        self._answer(200, obj) if obj else self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})

    def _list(self, plural: str, namespace: str) -> None:
        with self.server.changed:
            items = [copy.deepcopy(o) for (p, ns, _), o in self.server.objects.items() if p == plural and ns == namespace]
            version = self.server.version
        self._answer(200, {"kind": "List", "metadata": {"resourceVersion": str(version)}, "items": items})

    def _watch(self, plural: str, namespace: str, query: dict[str, str]) -> None:
        since = int(query.get("resourceVersion") or 0)
        end = time.monotonic() + float(query.get("timeoutSeconds") or 60)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while time.monotonic() < end:
                with self.server.changed:
                    events = [e for e in self.server.events if e[0] > since and e[2] == plural
                              and e[3]["metadata"].get("namespace") == namespace]
                    if not events:
                        self.server.changed.wait(timeout=min(0.5, max(0.0, end - time.monotonic())))
                        continue
                chunk = b"".join(json.dumps({"type": event, "object": obj}).encode() + b"\n"
                                 for _, event, _, obj in events)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                since = events[-1][0]
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802
        self.server.requests.append(f"{self.command} {self.path}")
        plural, namespace, _ = self._key()
        body = self._body()
        with self.server.changed:
            taken = (plural, namespace, body["metadata"]["name"]) in self.server.objects
            if not taken:
                self.server.put(plural, body)
        if taken:
            return self._answer(409, {"kind": "Status", "code": 409, "message": "already exists"})
        self._answer(201, body)

    def do_PATCH(self) -> None:  # noqa: N802 - a JSON patch (its "test" ops are the preconditions)
        self.server.requests.append(f"{self.command} {self.path}")
        operations = self._body()
        with self.server.changed:
            obj = self.server.objects.get(self._key())
            if obj is None:
                return self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})
            try:
                patched = jsonpatch.apply_patch(obj, operations)
            except jsonpatch.JsonPatchTestFailed as exc:
                return self._answer(422, {"kind": "Status", "code": 422, "message": str(exc)})
            self.server.put(self._key()[0], patched)
        self._answer(200, patched)

    def do_PUT(self) -> None:  # noqa: N802
        self.server.requests.append(f"{self.command} {self.path}")
        key = self._key()
        body = self._body()
        with self.server.lock:
            stored = self.server.objects.get(key)
            if stored is not None and self.server.conflicts > 0:
                self.server.conflicts -= 1
                self.server.put(key[0], stored)
            fresh = stored is not None and (body.get("metadata") or {}).get("resourceVersion") == \
                stored["metadata"]["resourceVersion"]
            if fresh:
                body["metadata"]["uid"] = stored["metadata"]["uid"]
                self.server.put(key[0], body)
        if stored is None:
            return self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})
        if not fresh:
            return self._answer(409, {"kind": "Status", "code": 409, "reason": "Conflict",
                                      "message": "the object has been modified; please apply your changes to the "
                                                 "latest version and try again"})
        self._answer(200, body)

    def do_DELETE(self) -> None:  # noqa: N802
        self.server.requests.append(f"{self.command} {self.path}")
        preconditions = self._body().get("preconditions") or {}
        with self.server.changed:
            obj = self.server.objects.get(self._key())
            if obj is not None and any(value and obj["metadata"].get(field) != value
                                       for field, value in preconditions.items()):
                return self._answer(409, {"kind": "Status", "code": 409, "reason": "Conflict",
                                          "message": f"Precondition failed: {preconditions}"})
            self.server.remove(*self._key())
        self._answer(200, {"kind": "Status", "code": 200})

    def log_message(self, *args) -> None:
        pass


def wait_synced(watchers, timeout: float = 10) -> None:
    """Start ``watchers`` and return once each has listed."""
    for watcher in watchers:
        watcher.start()
    deadline = time.monotonic() + timeout
    for watcher in watchers:
        assert watcher.synced.wait(max(0.0, deadline - time.monotonic())), f"{watcher.resource.plural} never listed"
