"""A small in-memory Kubernetes API on loopback for server-tier tests of the injector and the
reservation ledger: namespaced objects by (plural, namespace, name), POST (409 when the name is
taken), GET, PUT (409 unless the body names the stored resourceVersion, as etcd's optimistic
concurrency answers), DELETE; and fixed answers to GETs of other paths (``documents``: the
discovery documents /version, /apis/<group>, /openapi/v3 of a cluster the tier cannot run, e.g.
one with a Trainer older than v2.2). A stand-in for the API server where only these semantics
matter; the cluster tier runs the real one.
"""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .serve import send_json

PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/([^/]+)/([^/?]+)(?:/([^/?]+))?")


class MemoryApi(ThreadingHTTPServer):
    """Namespaced objects by (plural, namespace, name): POST (409 when taken), GET, PUT (409 on a
    stale resourceVersion), DELETE; every request's "METHOD path" in ``requests``."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.documents: dict[str, dict] = {}  # path (without the query) -> what a GET of it answers
        self.requests: list[str] = []
        self.lock = threading.Lock()  # a name is taken once, a version replaced once, however many race
        self.version = 0
        # That many PUTs find the object changed since it was read, as if another writer always came
        # first (a conflict storm): each bumps the stored version and answers 409.
        self.conflicts = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def put(self, plural: str, obj: dict) -> None:
        """Store ``obj`` as a new version (a new resourceVersion, as every write gets)."""
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        self.version += 1
        meta["resourceVersion"] = str(self.version)
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.objects[(plural, meta["namespace"], meta["name"])] = obj


class _Handler(BaseHTTPRequestHandler):
    server: MemoryApi

    def _answer(self, status: int, body: dict) -> None:
        send_json(self, status, body)

    def _key(self) -> tuple[str, str, str]:
        self.server.requests.append(f"{self.command} {self.path}")
        namespace, plural, name = PATH.match(self.path).groups()
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
        obj = self.server.objects.get(self._key())
        self._answer(200, obj) if obj else self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        plural, namespace, _ = self._key()
        body = self._body()
        with self.server.lock:
            taken = (plural, namespace, body["metadata"]["name"]) in self.server.objects
            if not taken:
                self.server.put(plural, body)
        if taken:
            return self._answer(409, {"kind": "Status", "code": 409, "message": "already exists"})
        self._answer(201, body)

    def do_PUT(self) -> None:  # noqa: N802
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
        self._body()
        with self.server.lock:
            self.server.objects.pop(self._key(), None)
        self._answer(200, {"kind": "Status", "code": 200})

    def log_message(self, *args) -> None:
        pass
