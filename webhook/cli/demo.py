"""``trainjob-admission demo``: the real server, a fresh CA, real AdmissionReviews over HTTPS.

It plays the API server's part for a set of sample jobs: /mutate first, the patch applied,
then /validate on the mutated object, and prints what a submitter and an admin would see; then
the deletion of the admitted job once it completed, which the decision log records.
"""
from __future__ import annotations

import asyncio
import base64
import json
import ssl
import tempfile
import uuid
from pathlib import Path

import aiohttp
import jsonpatch

from trainjob_admission.certs.issue import issue

from ..admission.config import ServerConfig
from ..admission.protocol import API_VERSION
from ..admission.server import WebhookServer
from ..decisionlog import DecisionLog, verify
from ..decisionlog.checkpoint import KEY_FILE, PUBLIC_KEY_FILE, create_key_pair
from ..kube.resources import JOB_RESOURCES
from .sampledata import sample_job, sample_state

SAMPLES = ["allowed.yaml", "over-quota.yaml", "too-many-gpus.yaml", "too-many-nodes.yaml", "privileged.yaml",
           "legacy-mpijob.yaml"]
PATCH_VALUE_SHOWN = 160  # characters of a patch value's JSON on one line; the rest is marked as cut


def admission_review(obj: dict, user: str = "alice", operation: str = "CREATE") -> dict:
    group, version, resource = JOB_RESOURCES[obj["kind"]]
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": obj["kind"]},
            "resource": {"group": group, "version": version, "resource": resource},
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "operation": operation,
            "userInfo": {"username": user, "groups": ["system:authenticated", "team-a"]},
            **({"object": None, "oldObject": obj} if operation == "DELETE" else {"object": obj}),
            "dryRun": False,
        },
    }


async def submit(session: aiohttp.ClientSession, base: str, obj: dict) -> tuple[dict, dict, dict]:
    """What the API server does: mutate, apply the patch, validate the result (and the object as stored)."""
    async with session.post(f"{base}/mutate", json=admission_review(obj)) as reply:
        mutated_response = (await reply.json())["response"]
    patched = obj
    if mutated_response.get("patch"):
        ops = json.loads(base64.b64decode(mutated_response["patch"]))
        patched = jsonpatch.apply_patch(obj, ops)
    async with session.post(f"{base}/validate", json=admission_review(patched)) as reply:
        validated = (await reply.json())["response"]
    return mutated_response, validated, patched


async def delete_completed(session: aiohttp.ClientSession, base: str, stored: dict) -> str:
    """What the API server sends the deletions' webhook entry when alice deletes a job that completed."""
    done = {**stored, "status": {"conditions": [{"type": "Complete", "status": "True", "reason": "JobSetCompleted"}]}}
    async with session.post(f"{base}/validate", json=admission_review(done, operation="DELETE")) as reply:
        answer = (await reply.json())["response"]
    meta = stored.get("metadata") or {}
    return (f"--- alice deletes {stored['kind']} {meta.get('namespace')}/{meta.get('name')} (Complete) -> "
            f"{'ALLOWED' if answer['allowed'] else 'DENIED'}, recorded\n"
            f"    decision id: {answer.get('auditAnnotations', {}).get('decision-id')}")


def shown_value(value: object) -> str:
    """A patch value's JSON on one line, cut with a mark that says so."""
    text = json.dumps(value)
    cut = len(text) - PATCH_VALUE_SHOWN
    return text if cut <= 0 else f"{text[:PATCH_VALUE_SHOWN]}...[+{cut} chars]"


def show(name: str, obj: dict, mutated: dict, validated: dict) -> str:
    meta = obj.get("metadata") or {}
    verdict = "ALLOWED" if validated["allowed"] else "DENIED"
    lines = [f"--- {name}: {obj['kind']} {meta.get('namespace')}/{meta.get('name')} -> {verdict}"]
    if not validated["allowed"]:
        lines.append(f"    message: {validated['status']['message']}")
    for warning in validated.get("warnings") or []:
        lines.append(f"    warning: {warning}")
    if validated["allowed"] and mutated.get("patch"):
        for op in json.loads(base64.b64decode(mutated["patch"])):
            lines.append(f"    patch: {op['op']} {op['path']} = {shown_value(op.get('value'))}")
    lines.append(f"    decision id: {validated.get('auditAnnotations', {}).get('decision-id')}")
    return "\n".join(lines)


async def run_demo(workdir: Path) -> int:
    certs = issue("trainjob-admission", "trainjob-admission", workdir / "tls", ip_addresses=["127.0.0.1"])
    log_path = workdir / "decisions.jsonl"
    keys = workdir / "keys"  # signs the log's checkpoint, as `serve --checkpoint-key` does
    if not (keys / KEY_FILE).exists():
        create_key_pair(keys)
    checkpoint = workdir / "anchor" / "checkpoint.json"
    config = ServerConfig(host="127.0.0.1", port=0, cert_file=certs.cert, key_file=certs.key,
                          decision_log=log_path, checkpoint_key=keys / KEY_FILE, checkpoint_file=checkpoint)
    server = WebhookServer(config, sample_state(), decision_log=DecisionLog(log_path, stdout=None, replica="demo"))
    port = await server.start()
    print(f"trainjob-admission demo: HTTPS server on 127.0.0.1:{port}, CA {certs.ca_cert}, default bundle\n")
    client_tls = ssl.create_default_context(cafile=str(certs.ca_cert))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls)) as session:
            base = f"https://127.0.0.1:{port}"
            admitted = []
            for name in SAMPLES:
                obj = sample_job(name)
                mutated, validated, stored = await submit(session, base, obj)
                print(show(name, obj, mutated, validated), "\n")
                admitted += [stored] if validated["allowed"] and obj["kind"] == "TrainJob" else []
            print(await delete_completed(session, base, admitted[0]), "\n")
            async with session.get(f"{base}/metrics") as reply:
                metrics = await reply.text()
        requests = [line for line in metrics.splitlines() if line.startswith("trainjob_admission_requests_total{")]
        print("metrics (/metrics):\n    " + "\n    ".join(requests))
    finally:
        await server.stop()
    report = verify([log_path])
    print(f"\ndecision log: {log_path}")
    print(f"signed checkpoint: {checkpoint} (public key {keys / PUBLIC_KEY_FILE})")
    print(f"trainjob-admission decisions verify --log {log_path}: {report}")
    return 0 if report.ok else 1


def main(keep: Path | None = None) -> int:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        return asyncio.run(run_demo(keep))
    workdir = Path(tempfile.mkdtemp(prefix="trainjob-admission-demo-"))
    return asyncio.run(run_demo(workdir))
