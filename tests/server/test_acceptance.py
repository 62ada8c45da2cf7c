"""Issue 3 acceptance, as a new user would try it, against the real server over real TLS:

- 10,000 hostile AdmissionReviews (malformed JSON, wrong apiVersion/kind, missing fields, wrong
  types, unicode, deep nesting, huge objects, env lists over the input limit, megabyte usernames,
  ReDoS names against an admin's regex rule, callers without the API server's client
  certificate, plus deny-worthy but well-formed jobs, quantity bombs among them), while the
  admin bundle is replaced by a YAML bomb: the server never crashes, refuses forged callers at
  TLS, keeps the last good bundle, answers no 5xx without a logged decision, logs every answer
  it gives in a record of bounded size, denies every deny-worthy job, and the decision log
  verifies afterwards;
- meanwhile (issue 30) floods of held connections, 1,800 on the probe port that each send one
  request and then trickle the next one's headers, and 1,800 handshakes without the client
  certificate on the admission port, with the process's RSS sampled (printed, bounded), and deep
  and over-long lines in the decision log, before the start and during the run: start-up
  recovery goes on, `verify` reports exactly those lines as malformed and every record intact,
  and a server restarted on that log continues its chain;
- (issue 30) same-name submissions in flight at once: pairs of CREATEs of one job name sent
  through two replicas that share the Kubernetes API (the in-memory stand-in), /mutate and
  /validate of both interleaved, one of the two often deny-worthy: every answer given, no job
  admitted without its own Secret and NetworkPolicy, never two admitted, nothing left of a refused one;
- a certificate renewed (``certs.issue.renew``) while several clients keep sending requests:
  no request fails and new connections get the new certificate.

The payloads come from a seeded generator (one ``random.Random`` per case index), so a failing
case is reproduced by its index alone: ``hostile_case(i)``.
"""
from __future__ import annotations

import copy
import http.client
import json
import multiprocessing
import os
import random
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from trainjob_admission.certs.issue import issue, renew
from trainjob_admission.webhook.admission import server as server_module
from trainjob_admission.webhook.cli.demo import admission_review
from trainjob_admission.webhook.decisionlog import query, verify
from trainjob_admission.webhook.decisionlog.lines import MAX_LINE_BYTES

from tests.support.flood import flood, rss_bytes
from tests.support.net import served_serial
from tests.support.objects import example_job

from .conftest import Running, mutated, start_server, stop_server, stored

pytestmark = pytest.mark.server

SEED = 3
CASES = 10_000
CLIENTS = 6  # client processes
SAMPLES = ["allowed.yaml", "over-quota.yaml", "too-many-gpus.yaml", "too-many-nodes.yaml", "privileged.yaml",
           "legacy-mpijob.yaml"]
JOBS = {name: example_job(name) for name in SAMPLES}
UNICODE = ["é", "ß", "中文", "🚀", "\u202eevil", "\u200b", "\x00", "\ud800", "\udfff", "𝔘𝔫𝔦", "\\", '"', "\n"]


@dataclass
class Case:
    index: int
    kind: str
    endpoint: str  # path, "/validate" or "/mutate" for reviews
    body: bytes
    uid: str = ""  # echoed in the response when the body is a review we can answer
    deny: bool = False  # well-formed and deny-worthy: /validate must refuse it
    allow: bool = False  # a clean allowed job (control: proves the server is not refusing everything)
    oversize: bool = False  # over the body limit: a 413 or a closed connection is the right answer
    forged: bool = False  # sent without the API server's client certificate: refused at TLS, no record


def _text(rng: random.Random, size: int = 12) -> str:
    return "".join(rng.choice(UNICODE) if rng.random() < 0.3 else chr(rng.randint(0x20, 0x7E)) for _ in range(size))


def _review(rng: random.Random, obj: dict, **request: object) -> dict:
    """The AdmissionReview the API server would send for ``obj`` (whatever shape obj is in)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    envelope = {"kind": obj["kind"] if obj.get("kind") in ("TrainJob", "MPIJob") else "TrainJob", "metadata": meta}
    review = admission_review(envelope, user=_text(rng, 6) if rng.random() < 0.3 else "alice")
    review["request"]["object"] = obj
    review["request"]["uid"] = f"uid-{rng.getrandbits(64):x}"
    review["request"].update(request)
    return review


def _noise(rng: random.Random, obj: dict) -> None:
    """Hostile but harmless decoration: unicode labels and annotations, unknown fields."""
    meta = obj.setdefault("metadata", {})
    meta.setdefault("labels", {})[_text(rng, 5)] = _text(rng)
    meta.setdefault("annotations", {})[_text(rng, 8)] = _text(rng, rng.randint(1, 200))
    if rng.random() < 0.3:
        obj["spec"][f"x-{rng.randint(0, 99)}"] = {_text(rng, 4): [_text(rng), rng.random(), None]}


def _deny_worthy(rng: random.Random) -> dict:
    """A well-formed job the default bundle must refuse (team-a: 32 GPUs quota, 24 used, PSS restricted)."""
    choice = rng.randrange(7)
    if choice == 0:  # more than 8 GPUs per worker
        obj = copy.deepcopy(JOBS["allowed.yaml"])
        obj["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = rng.choice([rng.randint(9, 10**6), "16"])
    elif choice == 1:  # over the namespace GPU quota (8 left)
        obj = copy.deepcopy(JOBS["allowed.yaml"])
        obj["spec"]["trainer"]["numNodes"] = rng.randint(9, 64)
    elif choice == 2:  # more workers than the bundle allows
        obj = copy.deepcopy(JOBS["too-many-nodes.yaml"])
        obj["spec"]["trainer"]["numNodes"] = rng.randint(65, 100_000)
    elif choice == 3:  # a privileged runtime
        obj = copy.deepcopy(JOBS["privileged.yaml"])
    elif choice == 4:  # privilege smuggled in through runtimePatches (through fields the CRD keeps:
        obj = copy.deepcopy(JOBS["allowed.yaml"])  # hostNetwork/hostPID are pruned, test_trainer_rules.py)
        pod_spec = rng.choice([
            {"containers": [{"name": "node", "securityContext": {"privileged": True}}]},
            {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}},
            {"containers": [{"name": "node", "securityContext": {"seLinuxOptions": {"type": "spc_t"}}}]},
            {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
            {"containers": [{"name": "node", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]},
        ])
        obj["spec"]["runtimePatches"] = [{"manager": _text(rng, 6), "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}]}}}}]
    elif choice == 6:  # a quantity bomb: a value no node can hold, which once froze the parser for minutes
        obj = copy.deepcopy(JOBS["allowed.yaml"])
        section = obj["spec"]["trainer"]["resourcesPerNode"].setdefault(rng.choice(["requests", "limits"]), {})
        section[rng.choice(["cpu", "memory", "nvidia.com/gpu"])] = rng.choice(
            ["1e300000", "1e600000", "9" * rng.randint(20, 1000), "1e2147483648", "8Ei", "99999999999Ti"])
    else:  # legacy MPIJob with too many GPUs per worker
        obj = copy.deepcopy(JOBS["legacy-mpijob.yaml"])
        worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        worker["resources"]["limits"]["nvidia.com/gpu"] = rng.randint(9, 512)
    _noise(rng, obj)
    return obj


def _wrong_types(rng: random.Random, obj: dict) -> None:
    junk = rng.choice(["four", -3, 1e308, 2**70, [], {}, True, None, "1e400", [1, 2], {"a": "b"}, "\ud800", 0.5])
    target = rng.choice(["numNodes", "resources", "gpu", "metadata", "labels", "runtimeRef", "runtimePatches",
                         "env", "spec", "trainer", "image", "name", "replicas"])
    spec = obj.setdefault("spec", {})
    trainer = spec.get("trainer") if isinstance(spec.get("trainer"), dict) else spec.setdefault("trainer", {})
    if target == "numNodes":
        trainer["numNodes"] = junk
    elif target == "resources":
        trainer["resourcesPerNode"] = junk
    elif target == "gpu":
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": junk}}
    elif target == "metadata":
        obj["metadata"] = junk
    elif target == "labels":
        obj.setdefault("metadata", {})["labels"] = junk
    elif target == "runtimeRef":
        spec["runtimeRef"] = junk
    elif target == "runtimePatches":
        spec["runtimePatches"] = rng.choice([junk, [junk], [{"manager": junk, "trainingRuntimeSpec": junk}]])
    elif target == "env":
        trainer["env"] = rng.choice([junk, [junk], [{"name": junk, "value": junk}]])
    elif target == "spec":
        obj["spec"] = junk
    elif target == "trainer":
        spec["trainer"] = junk
    elif target == "image":
        trainer["image"] = junk
    elif target == "name":
        obj.setdefault("metadata", {})["name"] = junk
    else:
        spec["mpiReplicaSpecs"] = {"Worker": {"replicas": junk, "template": junk}}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def hostile_case(index: int) -> Case:
    """Case number ``index``, always the same one."""
    rng = random.Random(SEED * 1_000_003 + index)
    roll = rng.random()
    endpoint = rng.choice(["/validate", "/mutate"])
    obj = copy.deepcopy(JOBS[rng.choice(SAMPLES)])
    if roll < 0.25:
        review = _review(rng, _deny_worthy(rng), dryRun=rng.random() < 0.2)
        return Case(index, "deny-worthy", "/validate", json.dumps(review).encode(), review["request"]["uid"], deny=True)
    if roll < 0.30:
        clean = copy.deepcopy(JOBS["allowed.yaml"])
        clean["metadata"]["annotations"] = {"note": _text(rng, 40)}
        review = _review(rng, clean)
        return Case(index, "allowed", "/validate", json.dumps(review).encode(), review["request"]["uid"], allow=True)
    if roll < 0.42:
        text = json.dumps(_review(rng, obj))
        body = rng.choice([
            text[: rng.randint(0, len(text) - 1)].encode(),
            rng.randbytes(rng.randint(0, 400)),
            b"\xff\xfe" + text.encode(),
            text.encode("utf-16"),
            rng.choice([b"", b"null", b"[]", b"123", b'"x"', b"{", b'{"a": NaN}', b"{}" * 50, b"\x00" * 64]),
            text.replace('"request"', '"request" "request"', 1).encode(),
        ])
        return Case(index, "malformed-json", endpoint, body)
    if roll < 0.52:
        review = _review(rng, obj)
        review[rng.choice(["apiVersion", "kind"])] = rng.choice(["admission.k8s.io/v1beta1", "v1", "", None, 7,
                                                                 "AdmissionResponse", _text(rng)])
        if rng.random() < 0.5:
            review["request"]["kind"] = rng.choice([{"group": "apps", "version": "v1", "kind": "Deployment"},
                                                    {"group": "", "kind": "Pod"}, "TrainJob", None])
            review["apiVersion"], review["kind"] = "admission.k8s.io/v1", "AdmissionReview"
        return Case(index, "wrong-kind", endpoint, json.dumps(review).encode())
    if roll < 0.62:
        review = _review(rng, obj)
        path = rng.choice([["request"], ["request", "uid"], ["request", "object"], ["request", "kind"],
                           ["request", "operation"], ["request", "userInfo"], ["request", "object", "metadata"],
                           ["request", "object", "spec"], ["request", "object", "kind"],
                           ["request", "object", "spec", "trainer"], ["request", "object", "spec", "runtimeRef"],
                           ["request", "object", "spec", "mpiReplicaSpecs"], ["apiVersion"]])
        parent = review
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
        return Case(index, "missing-field", endpoint, json.dumps(review).encode())
    if roll < 0.77:
        _wrong_types(rng, obj)
        review = _review(rng, obj, **rng.choice([{}, {"operation": rng.choice(["UPDATE", "DELETE", 5, "PATCH"])},
                                                 {"oldObject": rng.choice([obj, [], "x"])}, {"dryRun": "yes"},
                                                 {"userInfo": rng.choice(["root", {"groups": {"a": 1}}])}]))
        return Case(index, "wrong-types", endpoint, json.dumps(review).encode())
    if roll < 0.775:  # a name that makes a backtracking regex run for hours: RE2 answers in linear time
        obj.setdefault("metadata", {})["name"] = "a" * rng.randint(28, 250) + "!"
        review = _review(rng, obj)
        return Case(index, "redos", endpoint, json.dumps(review).encode(), review["request"]["uid"])
    if roll < 0.7775:  # a forged caller: a well-formed review without the API server's certificate
        review = _review(rng, _deny_worthy(rng))
        return Case(index, "forged-caller", "/validate", json.dumps(review).encode(), forged=True)
    if roll < 0.78:  # a forged identity of megabytes: answered, and its record stays small
        review = _review(rng, obj, userInfo={"username": "u" * rng.randint(200_000, 1_500_000),
                                             "groups": [_text(rng, 20) for _ in range(rng.randint(100, 5000))]})
        return Case(index, "huge-user", endpoint, json.dumps(review).encode(), review["request"]["uid"])
    if roll < 0.89:
        _noise(rng, obj)
        meta = obj.setdefault("metadata", {})
        meta["name"] = _text(rng, rng.randint(1, 300))
        meta.setdefault("labels", {}).update({_text(rng, 3): _text(rng, 3) for _ in range(rng.randint(1, 20))})
        review = _review(rng, obj)
        return Case(index, "unicode", endpoint, json.dumps(review).encode())
    if roll < 0.965:
        review = _review(rng, obj)
        depth = rng.choice([rng.randint(60, 70), rng.randint(60, 70), rng.randint(100, 3000), rng.choice([200_000, 100])])
        text = json.dumps(review)
        if depth == 200_000:  # deeper than the JSON parser's recursion limit
            body = text.replace('"object":', f'"deep": {_nested(depth)}, "object":', 1).encode()
        else:
            body = text.replace('"spec":', f'"deep": {_nested(depth)}, "spec":', 1).encode()
        return Case(index, "deep-nesting", endpoint, body, review["request"]["uid"])
    if roll < 0.969:  # an env list over the input limit: denied before any rule iterates over it
        _noise(rng, obj)
        obj.setdefault("spec", {}).setdefault("trainer", {})["env"] = [
            {"name": f"E{i}", "value": _text(rng, 3)} for i in range(rng.randint(1001, 3000))]
        review = _review(rng, obj)
        return Case(index, "huge-env", "/validate", json.dumps(review).encode(), review["request"]["uid"], deny=True)
    if roll < 0.975:
        size = rng.randint(1_000_000, 2_800_000) if rng.random() < 0.2 else rng.randint(10_000, 200_000)
        shape = rng.randrange(3)
        if shape == 0:
            obj.setdefault("metadata", {})["annotations"] = {"blob": "x" * size}
        elif shape == 1:
            obj["spec"]["runtimePatches"] = [{"manager": f"m{i}"} for i in range(size // 20)]
        else:
            obj.setdefault("spec", {}).setdefault("trainer", {})["env"] = [
                {"name": f"E{i}", "value": "v"} for i in range(size // 30)]
        review = _review(rng, obj)
        return Case(index, "huge", endpoint, json.dumps(review).encode(), review["request"]["uid"])
    if roll < 0.977:
        padding = b" " * (server_module.MAX_BODY_BYTES + rng.randint(1, 1000))
        return Case(index, "oversize", endpoint, b"{" + padding + b"}", oversize=True)
    return Case(index, "other-route", rng.choice(["/", "/validate/x", "/admission", "/metrics/../validate"]),
                json.dumps(_review(rng, obj)).encode())


@dataclass
class Answer:
    case: Case  # without its body (the parent has no use for megabytes it sent)
    status: int | None  # None: the connection was closed without an answer
    body: object
    error: str = ""


def send_cases(port: int, ca_pem: str, client_pem: bytes, indices: list[int]) -> list[Answer]:
    """One client process: its cases in turn over one keep-alive HTTPS connection, as the API
    server holds them, with the API server's client certificate (``client_pem``: key and chain).
    Separate processes, so the clients do not share the server's GIL."""
    context = ssl.create_default_context(cadata=ca_pem)
    with tempfile.NamedTemporaryFile(suffix=".pem") as pem:
        pem.write(client_pem)
        pem.flush()
        context.load_cert_chain(pem.name)
    conn: http.client.HTTPSConnection | None = None
    answers = []
    for index in indices:
        case = hostile_case(index)
        if case.forged:
            answers.append(_forged(port, ca_pem, case))
            continue
        if conn is None or case.oversize:
            conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=60)
        try:
            conn.request("POST", case.endpoint, body=case.body, headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            status, raw = reply.status, reply.read()
        except (ConnectionError, http.client.HTTPException, socket.timeout, ssl.SSLError) as exc:
            conn.close()
            conn = None
            answers.append(Answer(replace(case, body=b""), None, None, f"{type(exc).__name__}: {exc}"))
            continue
        if case.oversize:  # the server stops reading an oversize body; start afresh
            conn.close()
            conn = None
        try:
            body: object = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        answers.append(Answer(replace(case, body=b""), status, body))
    if conn is not None:
        conn.close()
    return answers


def _forged(port: int, ca_pem: str, case: Case) -> Answer:
    """``case`` sent without a client certificate: the status is None unless the server answered."""
    conn = http.client.HTTPSConnection("localhost", port, context=ssl.create_default_context(cadata=ca_pem),
                                       timeout=30)
    try:
        conn.request("POST", case.endpoint, body=case.body, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        return Answer(replace(case, body=b""), reply.status, reply.read().decode(errors="replace"))
    except (ConnectionError, http.client.HTTPException, socket.timeout, ssl.SSLError) as exc:
        return Answer(replace(case, body=b""), None, None, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


# An admin's rule that runs a regex over the submitter's name on every review (ReDoS bait: with
# a backtracking engine, 'a'*28+'!' against it stalls for seconds).
REGEX_BUNDLE = """apiVersion: policy.trainjob-admission.io/v1alpha1
kind: PolicyBundle
metadata: {name: admin-regex}
spec:
  validations:
    - name: name-scan
      expression: "size(object.metadata.name.find('^([a-z0-9]+)*$')) >= 0"
      message: never fails; runs the regex
"""
YAML_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(9))


# What an attacker who can write the log file puts in it: nested past any parser's stack, longer
# than any record, not JSON at all.
HOSTILE_LINES = [b'{"a":' + b"[" * 100_000, b'{"x":"' + b"y" * (MAX_LINE_BYTES + 10) + b'"}', b"{not json"]


@pytest.fixture
def hostile_server(tmp_path: Path):
    """The server as deployed for hostile traffic: the API server's client CA required, the
    default bundle plus an admin bundle whose regex rule reads the submitter's name; its decision
    log starts with HOSTILE_LINES (the start-up recovery reads them)."""
    (tmp_path / "decisions.jsonl").write_bytes(b"\n".join(HOSTILE_LINES) + b"\n")
    client_ca = trustme.CA()
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.crt"))
    rules = tmp_path / "admin-regex.yaml"
    rules.write_text(REGEX_BUNDLE)
    running, thread = start_server(tmp_path, ["builtin:default", str(rules)], client_ca_file=tmp_path / "client-ca.crt",
                                   probe_port=0)
    running.client_pem = client_ca.issue_cert("kube-apiserver").private_key_and_cert_chain_pem.bytes()
    running.client_pem_file = tmp_path / "apiserver-client.pem"
    running.client_pem_file.write_bytes(running.client_pem)
    running.rules_file = rules
    yield running
    stop_server(running, thread)


def _decision_id(answer: Answer) -> str | None:
    body = answer.body if isinstance(answer.body, dict) else {}
    response = body.get("response") if isinstance(body.get("response"), dict) else {}
    return (response.get("auditAnnotations") or {}).get("decision-id") or body.get("decisionId")


def held_connections(port: int, ca_pem: str, hold_seconds: float) -> str:
    """A flood of held connections (tests/support/flood.py) from a process of its own, so that the
    server's process holds none of its memory."""
    return str(flood(port, ssl.create_default_context(cadata=ca_pem), connections=1800, addresses=16,
                     hold_seconds=hold_seconds).result())


def append_line(path: Path, line: bytes) -> None:
    """A line written into the log file by someone else than the service (O_APPEND, one write)."""
    with open(path, "ab") as f:
        f.write(line + b"\n")


def test_ten_thousand_hostile_payloads(hostile_server: Running):
    webhook_server = hostile_server
    started = time.monotonic()
    chunks = [list(range(start, min(start + 250, CASES))) for start in range(0, CASES, 250)]
    ca_pem = webhook_server.ca.cert_pem.bytes().decode()
    # Halfway through, someone replaces the admin bundle with a YAML bomb: rejected, the last good kept;
    # and writes a line nested 100,000 levels deep into the decision log.
    bomb = threading.Timer(3.0, webhook_server.rules_file.write_text, [YAML_BOMB])
    deep = threading.Timer(4.0, append_line, [webhook_server.log_path, HOSTILE_LINES[0]])
    rss = RssSampler()
    for timer in (bomb, deep, rss):
        timer.start()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(CLIENTS, mp_context=spawn) as pool, ProcessPoolExecutor(2, mp_context=spawn) as floods:
        held = [floods.submit(held_connections, webhook_server.server.probe_port, ca_pem, 20),
                floods.submit(held_connections, webhook_server.port, ca_pem, 20)]  # no client certificate
        n = len(chunks)
        answers = [a for chunk in pool.map(send_cases, [webhook_server.port] * n, [ca_pem] * n,
                                           [webhook_server.client_pem] * n, chunks) for a in chunk]
        floods_seen = [f.result(timeout=300) for f in held]
    for timer in (bomb, deep):
        timer.join()
    elapsed = time.monotonic() - started
    peak = rss.stop()
    print(f"\nheld-connection floods during the run: probe port: {floods_seen[0]}; admission port without a client "
          f"certificate: {floods_seen[1]}; this process's RSS (the server's, in-process): {rss.first / 2**20:.0f} MiB "
          f"at the start, peak {peak / 2**20:.0f} MiB")
    assert "0 first requests answered" in floods_seen[1], "a caller without the client certificate was answered"
    assert peak - rss.first < 256 * 2**20, "the floods took the server's memory past its bounds"
    assert str(webhook_server.rules_file) in webhook_server.server.registry.errors, "the bomb was never read"
    assert "admin-regex" in {b.name for b in webhook_server.server.registry.active}, "the last good bundle is gone"
    assert _forged(webhook_server.port, ca_pem, replace(hostile_case(0), forged=True)).status is None, \
        "a caller without the client certificate was answered"
    context = webhook_server.client_context()
    context.load_cert_chain(webhook_server.client_pem_file)
    conn = http.client.HTTPSConnection("localhost", webhook_server.port, context=context, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok", "the server stopped answering"
    conn.close()

    kinds = Counter(a.case.kind for a in answers)
    statuses = Counter(a.status for a in answers)
    print(f"\n{CASES} hostile payloads in {elapsed:.1f}s with {CLIENTS} client processes; kinds {dict(kinds)}; "
          f"statuses {dict(statuses)}")
    records = {r["id"]: r for r in query([webhook_server.log_path])}  # the hostile lines are no records

    # Forged callers were refused at TLS: no answer, no record.
    assert kinds["forged-caller"] > 10 and all(a.status is None for a in answers if a.case.forged)
    # No request went unanswered, except oversize bodies, which may be cut off mid-upload.
    dropped = [(a.case.index, a.case.kind, a.error) for a in answers
               if a.status is None and not a.case.oversize and not a.case.forged]
    assert not dropped, f"connections dropped without an answer: {dropped[:5]}"
    # No 5xx without a logged decision.
    bad_5xx = [(a.case.index, a.status) for a in answers if a.status and a.status >= 500 and _decision_id(a) not in records]
    assert not bad_5xx, f"5xx answers with no logged decision: {bad_5xx[:5]}"
    for a in answers:
        where = f"case {a.case.index} ({a.case.kind}): {a.status} {str(a.body)[:300]}"
        if a.case.forged:
            continue  # refused at TLS: checked above
        if a.case.oversize:
            assert a.status in (413, 429, None), where
            if a.status is not None:  # refused before parsing (or unread), and still logged
                assert _decision_id(a) in records, f"not in the decision log: {where}"
        elif a.case.kind == "other-route":
            assert a.status in (404, 405), where
        else:
            # Every review endpoint answer carries a decision id that is in the log; 429: refused
            # unread while maximum-size bodies filled the in-flight bound (webhook/admission/inflight.py);
            # 408: a body of megabytes not received within its time while floods and clients saturate the CPUs.
            assert a.status in (200, 400) or (a.status in (408, 429) and a.case.kind.startswith("huge")), where
            decision_id = _decision_id(a)
            assert decision_id in records, f"not in the decision log: {where}"
            if a.status == 200 and a.case.uid:
                assert a.body["response"]["uid"] == a.case.uid, where
        if a.case.deny and a.status not in (408, 429):  # those are refusals too (failurePolicy Fail)
            assert a.status == 200 and a.body["response"]["allowed"] is False, f"deny-worthy job admitted: {where}"
            assert records[_decision_id(a)]["decision"] == "deny", where
        if a.case.allow:
            assert a.status == 200 and a.body["response"]["allowed"] is True, f"clean job refused: {where}"
    # One record per answered review, none extra, none twice.
    answered = [_decision_id(a) for a in answers if a.status in (200, 400, 408, 413, 429) and a.case.kind != "other-route"
                and not a.case.forged]
    assert len(answered) == len(set(answered)) == len(records)
    assert kinds["deny-worthy"] > 2000 and kinds["allowed"] > 400 and kinds["huge-user"] > 10 and kinds["redos"] > 20
    redos = [records[_decision_id(a)] for a in answers if a.case.kind == "redos" and a.status == 200]
    assert redos and all(any(r["rule"] == "name-scan" and r["result"] == "pass" for r in rec["rules"]) for rec in redos)
    # Records stay small whatever the request held (a forged identity could rotate the log away).
    huge_users = [records[_decision_id(a)] for a in answers if a.case.kind == "huge-user" and a.status == 200]
    assert huge_users and all(len(json.dumps(r)) < 16_384 and r["user"].endswith(" chars]") for r in huge_users)
    # Every record intact; the only problems are the hostile lines, each reported where it is.
    report = verify([webhook_server.log_path])
    assert report.records == len(records), str(report)
    assert [(p.kind, p.line) for p in report.failures[:3]] == [("malformed", 1), ("malformed", 2), ("malformed", 3)]
    assert [p.kind for p in report.failures[3:]] == ["malformed"] and "nested deeper" in report.failures[3].detail, \
        str(report)
    continued_after_a_restart(webhook_server, max(r["seq"] for r in records.values()))


class RssSampler(threading.Thread):
    """This process's RSS every 0.2 s until stopped: ``first`` and the peak."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.first, self.peak, self._done = rss_bytes(os.getpid()), 0, threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            self.peak = max(self.peak, rss_bytes(os.getpid()))

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def continued_after_a_restart(first: Running, last_seq: int) -> None:
    """A server started on the hostile log (its start-up recovery reads back past the deep line)
    continues the chain after its last record."""
    work = first.log_path.parent / "restarted"
    work.mkdir()
    shutil.copy(first.log_path, work / "decisions.jsonl")
    running, thread = start_server(work)
    try:
        decision_id = running.review(JOBS["allowed.yaml"])["auditAnnotations"]["decision-id"]
    finally:
        stop_server(running, thread)
    record = next(r for r in query([running.log_path]) if r["id"] == decision_id)
    assert record["seq"] == last_seq + 1


def _file_serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_certificate_renewal_under_load_fails_no_request(tmp_path: Path):
    running, thread = start_server(tmp_path, reload_interval=0.2)
    try:
        # Replace the fixture's pair with one from `certs issue`, as a deployment has it.
        issued = issue("trainjob-admission", "trainjob-admission", running.cert_dir, ip_addresses=["127.0.0.1"])
        deadline = time.monotonic() + 10
        while served_serial(running.port) != _file_serial(issued.cert):
            assert time.monotonic() < deadline, "the issued certificate was never served"
            time.sleep(0.1)

        stop = threading.Event()
        outcomes: list[tuple[str, int | str]] = []
        outcomes_lock = threading.Lock()
        context = ssl.create_default_context(cafile=str(issued.ca_cert))
        body = json.dumps(admission_review(example_job("allowed.yaml"))).encode()

        def load(keep_alive: bool) -> None:
            conn = None
            while not stop.is_set():
                if conn is None or not keep_alive:
                    conn = http.client.HTTPSConnection("127.0.0.1", running.port, context=context, timeout=10)
                try:
                    conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
                    reply = conn.getresponse()
                    answer = json.loads(reply.read())
                    result: int | str = reply.status if answer["response"]["allowed"] else "denied"
                except Exception as exc:  # noqa: BLE001 - every failure is counted, none may happen
                    result = f"{type(exc).__name__}: {exc}"
                    conn.close()
                    conn = None
                with outcomes_lock:
                    outcomes.append(("keep-alive" if keep_alive else "new", result))
                if conn is not None and not keep_alive:
                    conn.close()

        workers = [threading.Thread(target=load, args=(i % 2 == 0,)) for i in range(4)]
        for worker in workers:
            worker.start()
        serials = [_file_serial(issued.cert)]
        try:
            for _ in range(3):
                time.sleep(0.7)
                renewed = renew(running.cert_dir)
                serials.append(_file_serial(renewed.cert))
                deadline = time.monotonic() + 10
                while served_serial(running.port) != serials[-1]:
                    assert time.monotonic() < deadline, f"renewed certificate {serials[-1]:x} not served"
                    time.sleep(0.05)
            time.sleep(0.5)
        finally:
            stop.set()
            for worker in workers:
                worker.join(15)
    finally:
        stop_server(running, thread)
    failures = [o for o in outcomes if o[1] != 200]
    kinds = Counter(kind for kind, _ in outcomes)
    print(f"\n{len(outcomes)} requests across 3 renewals ({dict(kinds)}), serials {[f'{s:x}' for s in serials]}")
    assert len(set(serials)) == 4, "renew did not change the serial"
    assert not failures, f"{len(failures)} failed requests during renewal, e.g. {failures[:3]}"
    assert kinds["new"] > 20 and kinds["keep-alive"] > 20
    assert verify([running.log_path]).ok


SAME_NAME_ROUNDS = 60


def test_same_name_submissions_in_flight_at_once(injecting_server, memory_api):
    """Each round two submissions of one name race through two replicas; the second is deny-worthy
    every third round. 0 crashes: every review answered; 0 wrong allows: never a deny-worthy one,
    never both, and an admitted job finds both objects carrying its own admission id once the
    refused one's withdrawal has run; a round with none admitted leaves nothing behind."""
    # a key type Trainer does not make: the Secret is the one object admission still writes (issue 33)
    replicas = [injecting_server(key_type="ed25519"), injecting_server(key_type="ed25519")]
    rng = random.Random(SEED)
    outcomes: Counter = Counter()
    with ThreadPoolExecutor(2) as pool:
        for round_ in range(SAME_NAME_ROUNDS):
            jobs = [copy.deepcopy(JOBS["allowed.yaml"]) for _ in replicas]
            for job in jobs:
                job["metadata"]["name"] = f"same-{round_}"
            deny_worthy = round_ % 3 == 2
            if deny_worthy:
                jobs[1]["spec"]["trainer"]["numNodes"] = 500
            order = rng.sample([0, 1], 2)  # which replica's /mutate starts first; they overlap
            mutations = dict(zip(order, pool.map(lambda i: mutated(replicas[i], jobs[i]), order)))
            submitted = [stored(mutations[i][1]) for i in range(2)]
            order = rng.sample([0, 1], 2)  # and which /validate
            answers = dict(zip(order, pool.map(lambda i: replicas[i].review(submitted[i]), order)))
            allowed = [i for i in range(2) if answers[i]["allowed"]]
            outcomes[len(allowed)] += 1
            assert len(allowed) <= 1, f"round {round_}: both submissions of one name admitted"
            assert not (deny_worthy and 1 in allowed), f"round {round_}: the deny-worthy job admitted"
            names = {(f"same-{round_}-mpi-ssh-auth", "secrets")}  # the NetworkPolicy: the reconciler's, once stored
            deadline = time.monotonic() + 10
            while True:  # the refused one's withdrawal runs in the background
                held = {(name, plural): memory_api.objects.get((plural, "team-a", name)) for name, plural in names}
                tags = {o["metadata"]["annotations"]["trainjob-admission.io/admission-id"] if o else None
                        for o in held.values()}
                want = {submitted[allowed[0]]["metadata"]["annotations"]["trainjob-admission.io/admission-id"]} \
                    if allowed else {None}
                if tags == want or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            assert tags == want, f"round {round_}: objects {tags}, the admitted submission's {want}"
    print(f"\nsame-name submissions, {SAME_NAME_ROUNDS} rounds of two: {outcomes[1]} with one admitted, "
          f"{outcomes[0]} with none (each refused for the other's objects in flight), {outcomes[2]} with both")
