"""A Secret or NetworkPolicy of the planned name that the service did not create for this job
is refused: the job is denied naming the object and the fix, whatever the failure mode, unless
the bundle sets ``adoptExisting``. The server, its injector and the HTTP calls are real; the
Kubernetes API is a small in-memory one on loopback that stores, conflicts and deletes by name.
"""
from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from tests.support.objects import example_job
from tests.support.serve import send_json
from webhook.decisionlog import DecisionLog
from webhook.demo import sample_state
from webhook.injector import Injector
from webhook.keys import generate
from webhook.kube.client import KubeApi
from webhook.provenance import Provenance
from webhook.server import ServerConfig, WebhookServer

from .conftest import Running, serving_cert

pytestmark = pytest.mark.server
NS, JOB = "team-a", "resnet-allreduce"
SECRET, POLICY = f"{JOB}-mpi-ssh-auth", f"{JOB}-mpi-isolation"
PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)/namespaces/([^/]+)/([^/?]+)(?:/([^/?]+))?")
DEFAULT_BUNDLE = Path(__file__).resolve().parents[2] / "policies" / "bundles" / "default.yaml"


class MemoryApi(ThreadingHTTPServer):
    """Namespaced objects by (plural, namespace, name): POST (409 when taken), GET, DELETE."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[tuple[str, str, str], dict] = {}
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def put(self, plural: str, obj: dict) -> None:
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("resourceVersion", "1")
        self.objects[(plural, meta["namespace"], meta["name"])] = obj


class _Handler(BaseHTTPRequestHandler):
    server: MemoryApi

    def _answer(self, status: int, body: dict) -> None:
        send_json(self, status, body)

    def _key(self) -> tuple[str, str, str]:
        namespace, plural, name = PATH.match(self.path).groups()
        return plural, namespace, name or ""

    def _body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        obj = self.server.objects.get(self._key())
        self._answer(200, obj) if obj else self._answer(404, {"kind": "Status", "code": 404, "message": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        plural, namespace, _ = self._key()
        body = self._body()
        if (plural, namespace, body["metadata"]["name"]) in self.server.objects:
            return self._answer(409, {"kind": "Status", "code": 409, "message": "already exists"})
        self.server.put(plural, body)
        self._answer(201, body)

    def do_DELETE(self) -> None:  # noqa: N802
        self._body()
        self.server.objects.pop(self._key(), None)
        self._answer(200, {"kind": "Status", "code": 200})

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def memory_api():
    api = MemoryApi()
    yield api
    api.shutdown()
    api.server_close()


KEY = Provenance([b"p" * 32])


@pytest.fixture
def start(tmp_path: Path, memory_api: MemoryApi):
    """start(adopt=False, failure_mode="deny") -> Running, injecting through memory_api."""
    stops = []

    def _start(adopt: bool = False, failure_mode: str = "deny") -> Running:
        work = tmp_path / f"server-{len(stops)}"
        work.mkdir()
        bundle = yaml.safe_load(DEFAULT_BUNDLE.read_text())
        bundle["spec"]["injections"]["sshKey"]["adoptExisting"] = adopt
        bundle["spec"]["injections"]["networkPolicy"]["adoptExisting"] = adopt
        (work / "bundle.yaml").write_text(yaml.safe_dump(bundle))
        ca = serving_cert(work / "tls")
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://127.0.0.1:{memory_api.server_address[1]}"
        config = ServerConfig(host="127.0.0.1", port=0, cert_file=work / "tls" / "tls.crt",
                              key_file=work / "tls" / "tls.key", decision_log=work / "decisions.jsonl",
                              bundle_specs=[str(work / "bundle.yaml")])
        config.reviewer.failure_mode = failure_mode
        server = WebhookServer(config, sample_state(), injector=Injector(KubeApi(configuration), KEY, timeout=5),
                               decision_log=DecisionLog(work / "decisions.jsonl", stdout=None))
        loop = asyncio.new_event_loop()
        port = loop.run_until_complete(server.start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        stops.append((server, loop, thread))
        return Running(server, port, ca, work / "decisions.jsonl", loop, work / "tls")

    yield _start
    for server, loop, thread in stops:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)


def job(uid: str = "") -> dict:
    obj = example_job("allowed.yaml")
    obj["metadata"]["uid"] = uid or str(uuid.uuid4())
    return obj


def planted_secret() -> dict:
    """The attacker's own key pair, in the shape Trainer mounts."""
    pair = generate("ed25519")
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
            "metadata": {"name": SECRET, "namespace": NS},
            "data": {"ssh-privatekey": base64.b64encode(pair.private_pem).decode(),
                     "ssh-publickey": base64.b64encode(pair.public_openssh).decode()}}


def record_of(running: Running, response: dict) -> dict:
    return next(r for r in running.records() if r["id"] == response["auditAnnotations"]["decision-id"])


@pytest.mark.parametrize("failure_mode", ["deny", "allow"])
def test_a_planted_secret_denies_the_job_naming_it_and_the_fix(start, memory_api, failure_mode):
    running = start(failure_mode=failure_mode)
    planted = planted_secret()
    memory_api.put("secrets", copy.deepcopy(planted))
    response = running.review(job())
    assert response["allowed"] is False, "a planted key must never be mounted, whatever the failure mode"
    message = response["status"]["message"]
    assert message == (f"[trainjob-admission/existing-objects] Secret {NS}/{SECRET} already exists and was not "
                       f"created by trainjob-admission for this job: delete Secret {NS}/{SECRET} or rename the job")
    assert memory_api.objects[("secrets", NS, SECRET)]["data"] == planted["data"], "the planted Secret is left alone"
    record = record_of(running, response)
    assert record["decision"] == "deny" and record["allowed"] is False
    statuses = {i["kind"]: i["status"] for i in record["injections"]}
    assert statuses == {"Secret": "refused", "NetworkPolicy": "created"}


def test_a_forged_copy_of_our_label_and_annotations_is_refused(start, memory_api):
    """The attacker copies everything a real injected Secret carries (label, job, uid, key type,
    fingerprint and provenance annotations) onto a Secret with their own key."""
    running = start()
    uid = str(uuid.uuid4())
    assert running.review(job(uid))["allowed"] is True
    real = memory_api.objects.pop(("secrets", NS, SECRET))
    memory_api.objects.pop(("networkpolicies", NS, POLICY))
    forged = copy.deepcopy(real)
    forged["data"] = planted_secret()["data"]
    memory_api.put("secrets", forged)
    response = running.review(job(uid))
    assert response["allowed"] is False and f"Secret {NS}/{SECRET} already exists and was not created" \
        in response["status"]["message"]
    # an allow-all NetworkPolicy with our label and a copied annotation set is refused too
    memory_api.objects.clear()
    assert running.review(job(uid))["allowed"] is True
    policy = memory_api.objects[("networkpolicies", NS, POLICY)]
    policy["spec"] = {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]}
    del memory_api.objects[("secrets", NS, SECRET)]
    response = running.review(job())
    assert response["allowed"] is False
    assert f"delete NetworkPolicy {NS}/{POLICY} or rename the job" in response["status"]["message"]


def test_a_retried_call_for_the_same_submission_is_recognised_as_ours(start, memory_api):
    running = start()
    uid = str(uuid.uuid4())
    first = running.review(job(uid))
    created = copy.deepcopy(memory_api.objects)
    again = running.review(job(uid))  # the API server calls /validate again for the same job
    assert first["allowed"] is True and again["allowed"] is True and "warnings" not in again
    assert memory_api.objects == created, "the retry neither replaces nor duplicates our objects"
    assert {i["status"] for i in record_of(running, again)["injections"]} == {"created"}


def test_adopt_existing_uses_the_planted_objects_with_a_warning(start, memory_api):
    running = start(adopt=True)
    planted = planted_secret()
    memory_api.put("secrets", copy.deepcopy(planted))
    response = running.review(job())
    assert response["allowed"] is True
    assert (f"Secret {NS}/{SECRET} already exists and was not created by trainjob-admission for this job; "
            "it was left as is and Trainer will use it") in response["warnings"]
    assert memory_api.objects[("secrets", NS, SECRET)]["data"] == planted["data"]
    assert {i["kind"]: i["status"] for i in record_of(running, response)["injections"]}["Secret"] == "kept"
