"""Creates the planned objects (SSH key Secret, NetworkPolicy) beside an admitted job.

Runs on /validate, where the API server has already given the job its uid, which goes into an
annotation so the reconciler (webhook/reconciler.py) can tell this job from an earlier one of
the same name. No ownerReference is set here: the job does not exist yet, and the garbage
collector would delete a dependent whose owner it cannot find.

Trainer's MPI plugin (v2.3.0 plugins/mpi/mpi.go, Build) creates `<job>-mpi-ssh-auth` only when
its cached client cannot find it, then server-side applies with force. Our Secret is
`immutable`, like Trainer's own, so in the rare case that Trainer's cache has not seen ours yet
its forced apply is refused instead of silently replacing our keys; it retries and finds ours.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

import kubernetes.client
import urllib3
from kubernetes.client.rest import ApiException

from policies import injections
from policies.effective_job import EffectiveJob
from policies.engine import Decision

from . import admission, keys

log = logging.getLogger("trainjob_admission.injector")

FINGERPRINT_ANNOTATION = "trainjob-admission.io/ssh-key-fingerprint"
KEY_TYPE_ANNOTATION = "trainjob-admission.io/ssh-key-type"


@dataclass(frozen=True)
class Resource:
    """The calls for one injected kind, so Secrets and NetworkPolicies share one code path."""

    kind: str
    plural: str
    read: Callable[..., Any]
    create: Callable[..., Any]
    delete: Callable[..., Any]
    patch: Callable[..., Any]
    list_all: Callable[..., Any]
    list_namespaced: Callable[..., Any]


def resources(api: kubernetes.client.ApiClient) -> dict[str, Resource]:
    core, net = kubernetes.client.CoreV1Api(api), kubernetes.client.NetworkingV1Api(api)
    return {
        "Secret": Resource("Secret", "secrets", core.read_namespaced_secret, core.create_namespaced_secret,
                           core.delete_namespaced_secret, core.patch_namespaced_secret,
                           core.list_secret_for_all_namespaces, core.list_namespaced_secret),
        "NetworkPolicy": Resource("NetworkPolicy", "networkpolicies", net.read_namespaced_network_policy,
                                  net.create_namespaced_network_policy, net.delete_namespaced_network_policy,
                                  net.patch_namespaced_network_policy, net.list_network_policy_for_all_namespaces,
                                  net.list_namespaced_network_policy),
    }


def api_error(exc: BaseException, timeout: float) -> str:
    """One line for a user or a log: the HTTP status and the API server's own message."""
    cause = getattr(exc, "reason", None) if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    if isinstance(cause, urllib3.exceptions.NewConnectionError):  # before timeouts: urllib3 2 subclasses it
        return "cannot connect to the Kubernetes API"
    if isinstance(cause, (asyncio.TimeoutError, TimeoutError, urllib3.exceptions.TimeoutError)):
        return f"the Kubernetes API did not answer within {timeout:g} s"
    if isinstance(exc, ApiException):
        message = ""
        try:
            message = str(json.loads(exc.body or "{}").get("message", ""))
        except (ValueError, AttributeError):
            pass
        return f"HTTP {exc.status} {exc.reason or ''}".strip() + (f": {message[:200]}" if message else "")
    return f"{type(exc).__name__}: {str(exc)[:200]}"


class KubeCalls:
    """The API calls the injector and the reconciler make: the sync client in a worker thread,
    bounded by the client's own timeout and by the event loop's."""

    def __init__(self, api: kubernetes.client.ApiClient, timeout: float):
        self.api, self.timeout = api, timeout
        self.resources = resources(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wait_for(asyncio.to_thread(fn, *args, _request_timeout=self.timeout, **kwargs),
                                      timeout=self.timeout + 1)

    async def get_job(self, kind: str, namespace: str, name: str) -> dict | None:
        """The stored TrainJob/MPIJob, or None when there is none."""
        group, version, plural = admission.JOB_RESOURCES[kind]
        try:
            return await self.call(self.custom.get_namespaced_custom_object, group, version, namespace, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


class Injector(KubeCalls):
    """``await injector(parsed, decision)`` -> one record per plan for the decision log:
    ``{"kind", "name", "namespace", "status": "created"|"kept"|"failed", "reason"?,
    "keyType"?, "fingerprint"?}``. Never raises for API trouble; never returns key material."""

    def __init__(self, api: kubernetes.client.ApiClient, *, timeout: float = 5.0,
                 key_pool: keys.KeyPool | None = None):
        super().__init__(api, timeout)
        self.keys = key_pool or keys.KeyPool()

    async def __call__(self, parsed: admission.ParsedReview, decision: Decision) -> list[dict]:
        job = decision.job
        if job is None or not decision.injections:
            return []
        uid = str((parsed.request.object.get("metadata") or {}).get("uid", ""))
        return list(await asyncio.gather(*(self._inject(plan, job, uid, decision) for plan in decision.injections)))

    async def _inject(self, plan: dict, job: EffectiveJob, uid: str, decision: Decision) -> dict:
        """Create first and look only on a name conflict: one API call per object in the common
        case (the admission latency of a job is the slower of its two objects)."""
        kind, name = plan["kind"], plan["name"]
        record: dict = {"kind": kind, "name": name, "namespace": job.namespace}
        resource = self.resources[kind]
        try:
            body = await self._body(plan, job, uid, decision)
            if not await self._create(resource, job.namespace, body):
                existing = await self._read(resource, job.namespace, name)
                if existing is not None:
                    same_request = uid and _annotations(existing).get(injections.JOB_UID_ANNOTATION) == uid
                    if same_request and _is_ours(existing, job):  # a retried call for this same submission
                        return {**record, "status": "created", **_key_fields(existing)}
                    reason = await self._keep_reason(kind, existing, job)
                    if reason:
                        return {**record, "status": "kept", "reason": reason, **_key_fields(existing)}
                    await self.call(resource.delete, name, job.namespace, body=_precondition(existing))
                    record["replaced"] = "a leftover of an earlier submission that was never admitted"
                await self.call(resource.create, job.namespace, body)
            log.info("created %s %s/%s for %s %s", kind, job.namespace, name, job.kind, job.name)
            return {**record, "status": "created", **(_key_fields(body) if kind == "Secret" else {})}
        except Exception as exc:  # noqa: BLE001 - an API failure becomes a record; the reviewer applies the failure mode
            reason = api_error(exc, self.timeout)
            log.warning("could not create %s %s/%s: %s", kind, job.namespace, name, reason)
            return {**record, "status": "failed", "reason": reason}

    async def _body(self, plan: dict, job: EffectiveJob, uid: str, decision: Decision) -> dict:
        if plan["kind"] == "Secret":
            pair = await asyncio.to_thread(self.keys.take, plan["keyType"])
            return secret(job, plan["name"], uid, pair)
        body = injections.network_policy(job, decision.injection_settings.networkPolicy)
        body["metadata"]["annotations"][injections.JOB_UID_ANNOTATION] = uid
        return body

    async def _create(self, resource: Resource, namespace: str, body: dict) -> bool:
        """False when an object of that name already exists: the caller decides what to do."""
        try:
            await self.call(resource.create, namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def _read(self, resource: Resource, namespace: str, name: str) -> Any:
        try:
            return await self.call(resource.read, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _keep_reason(self, kind: str, existing: Any, job: EffectiveJob) -> str:
        """Why an existing object must be left alone, or "" when it is our leftover to replace."""
        consequence = ("Trainer will use it" if kind == "Secret"
                       else "trainjob-admission added no NetworkPolicy for this job")
        if not _is_ours(existing, job):
            return f"already exists and is not managed by trainjob-admission; it was left as is and {consequence}"
        owners = existing.metadata.owner_references or []
        if owners:
            return (f"already exists and belongs to {owners[0].kind} {owners[0].name} (uid {owners[0].uid}); "
                    f"it was left as is and {consequence}")
        if await self.get_job(job.kind, job.namespace, job.name) is not None:  # not yet adopted, but a stored job of this name mounts it
            return (f"already exists for the {job.kind} {job.name} that is already in the cluster; "
                    f"it was left as is and {consequence}")
        return ""


def secret(job: EffectiveJob, name: str, uid: str, pair: keys.KeyPair) -> dict:
    """The Secret as Trainer's MPI plugin would write it (type, keys, immutable), with our metadata."""
    meta = injections.metadata(job, name)
    meta["annotations"].update({injections.JOB_UID_ANNOTATION: uid, KEY_TYPE_ANNOTATION: pair.key_type,
                                FINGERPRINT_ANNOTATION: pair.fingerprint})
    return {
        "apiVersion": "v1", "kind": "Secret", "metadata": meta,
        "type": "kubernetes.io/ssh-auth",
        "immutable": True,
        "data": {"ssh-privatekey": base64.b64encode(pair.private_pem).decode(),
                 "ssh-publickey": base64.b64encode(pair.public_openssh).decode()},
    }


def _annotations(obj: Any) -> dict:
    if isinstance(obj, dict):
        return obj["metadata"].get("annotations") or {}
    return obj.metadata.annotations or {}


def _is_ours(obj: Any, job: EffectiveJob) -> bool:
    """Managed by us and made for this job (same kind and name)."""
    return ((obj.metadata.labels or {}).get(injections.MANAGED_BY_LABEL) == injections.MANAGED_BY
            and _annotations(obj).get(injections.JOB_ANNOTATION) == f"{job.kind}/{job.name}")


def _key_fields(obj: Any) -> dict:
    """Key type and fingerprint of a Secret (ours from its annotations, another's from its public key)."""
    annotations = _annotations(obj)
    fields = {k: annotations[a] for k, a in (("keyType", KEY_TYPE_ANNOTATION), ("fingerprint", FINGERPRINT_ANNOTATION))
              if a in annotations}
    data = (obj.get("data") if isinstance(obj, dict) else getattr(obj, "data", None)) or {}
    if "fingerprint" not in fields and "ssh-publickey" in data:
        try:
            fields["fingerprint"] = keys.fingerprint(base64.b64decode(data["ssh-publickey"]))
        except (ValueError, IndexError):
            pass  # not an authorized_keys line: nothing to report
    return fields


def _precondition(obj: Any) -> kubernetes.client.V1DeleteOptions:
    """Delete exactly the object we looked at, not one that replaced it meanwhile."""
    return kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(
        uid=obj.metadata.uid, resource_version=obj.metadata.resource_version))
