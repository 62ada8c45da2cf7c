"""What admission does about the objects planned beside a job (policies/decide/injections.py):
creates the SSH key Secret when the service makes it, and refuses a planted object otherwise.

- ``by: admission`` (a key type Trainer does not make, or ``createAlways``): the Secret is
  created here, started on /mutate and finished on /validate (webhook/inject/early.py), for one
  submission named by its admission id: the id /mutate tags the job with, which goes into an
  annotation of the Secret so that another replica's /validate, or a retried call, recognises it as
  made for this same submission, and a later job of the same name is told apart. No
  ownerReference is set here: the job does not exist yet, and the garbage collector would delete
  a dependent whose owner it cannot find; the reconciler (webhook/inject/reconciler.py) adds it
  once the job is stored.
- ``by: trainer``: Trainer's MPI plugin (v2.3.0 plugins/mpi/mpi.go, Build) creates
  `<job>-mpi-ssh-auth` only when it cannot find one, so a Secret of that name that exists before
  the job would be mounted instead: refused here, read from the watch of Secrets' metadata
  (webhook/inject/existing.py), no call in the common case.
- ``by: reconciler``: the job's NetworkPolicy, created once the job is stored
  (webhook/inject/isolation.py). Here: one of that name that this service did not make is
  refused, and the namespace's own isolating policy is made if it is missing (the only write on
  the admission path, once per namespace).

An object of the planned name that this service did not create for this job (its provenance
HMAC, webhook/inject/provenance.py, does not verify) is a stranger: possibly planted by someone who
wants the job to use their key or an allow-all policy. It is never used unless the bundle sets
``adoptExisting``; otherwise the record says "refused" and the reviewer denies the job. One of ours
made for another submission of the same job name that may still be in admission (younger than
IN_FLIGHT_SECONDS) is never replaced: that submission would be admitted without it.

Our Secret is `immutable`, like Trainer's own, so in the rare case that Trainer's cache has not
seen ours yet its forced apply is refused instead of silently replacing our keys; it retries and
finds ours.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import math

from trainjob_admission.policies.decide import injections
from trainjob_admission.policies.decide.decision import Decision
from trainjob_admission.policies.job.effective_job import EffectiveJob

from ..kube.calls import Calls
from ..kube.client import ApiError, KubeApi, summary
from ..kube.resources import INJECTED
from . import keys
from .existing import ExistingObjects, age
from .isolation import Isolation
from .provenance import Provenance

log = logging.getLogger("trainjob_admission.injector")

FINGERPRINT_ANNOTATION = "trainjob-admission.io/ssh-key-fingerprint"
KEY_TYPE_ANNOTATION = "trainjob-admission.io/ssh-key-type"
# How long another submission's unowned objects count as in flight: no create outlives the API
# server's request timeout (--request-timeout, 60 s by default), which bounds all its webhook calls.
IN_FLIGHT_SECONDS = 60.0


class Injector(Calls):
    """``await injector(decision, admission_id)`` -> one record per plan for the decision log:
    ``{"kind", "name", "namespace", "status", "reason"?, "fix"?, "keyType"?, "fingerprint"?}``,
    status "created" (by admission), "left-to-trainer" (Trainer makes it), "deferred" (the
    reconciler makes it once the job is stored), "kept" (an existing object used because the bundle
    allows it), "refused" (one it does not, with the submitter's ``fix``) or "failed"; plus a
    "created" or "failed" record of the namespace's isolating NetworkPolicy when admission had to
    make it. Never raises for API trouble; never returns key material. ``namespaces``: where it may
    act (``serve --reconcile-namespace``; None: everywhere), since only there does a reconciler give
    its objects an owner or remove them. ``existing``: the watched Secrets and NetworkPolicies
    under our names (None: each looked up with a call); ``isolation``: the NetworkPolicies'
    maker (None: none are made)."""

    def __init__(self, api: KubeApi, provenance: Provenance, *, timeout: float = 5.0,
                 key_pool: keys.KeyPool | None = None, namespaces: list[str] | tuple[str, ...] | None = None,
                 existing: ExistingObjects | None = None, isolation: Isolation | None = None):
        super().__init__(api, timeout)
        self.provenance = provenance
        self.keys = key_pool or keys.KeyPool()
        self.namespaces = frozenset(namespaces) if namespaces is not None else None
        self.existing, self.isolation = existing, isolation

    async def __call__(self, decision: Decision, admission_id: str) -> list[dict]:
        job = decision.job
        if job is None or not decision.injections:
            return []
        if self.namespaces is not None and job.namespace not in self.namespaces:
            reason = (f"namespace {job.namespace} is not one this service manages (--reconcile-namespace "
                      f"{', '.join(sorted(self.namespaces))}); add it or fix the webhook's namespaceSelector")
            return [{"kind": p["kind"], "name": p["name"], "namespace": job.namespace, "status": "failed",
                     "reason": reason} for p in decision.injections]
        records = list(await asyncio.gather(*(self._one(plan, job, admission_id, decision)
                                              for plan in decision.injections)))
        if self.isolation is not None and any(p.get("by") == injections.BY_RECONCILER for p in decision.injections):
            isolated = await self.isolation.ensure_isolated(job.namespace, job.kind)
            records += [isolated] if isolated else []
        return records

    def admitted(self, decision: Decision, uid: str, admission_id: str) -> None:
        """The job is about to be stored: its NetworkPolicy, if planned, is made when it appears."""
        settings = decision.injection_settings.networkPolicy if decision.injection_settings else None
        if self.isolation is not None and decision.job is not None and settings is not None \
                and any(p["kind"] == "NetworkPolicy" for p in decision.injections):
            self.isolation.expect(decision.job, settings, uid, admission_id)

    async def withdraw(self, namespace: str, records: list[dict], admission_id: str) -> None:
        """Delete what ``records`` say this submission created, now that it was refused: each object
        only while it is still the one we made for ``admission_id`` and nothing owns it, with the uid
        and resourceVersion it was read with as preconditions. Never raises: what stays is an orphan
        the reconciler removes after its grace period."""
        for record in records:
            if record.get("status") != "created":
                continue
            resource = INJECTED[record["kind"]]
            try:
                existing = await self.get(resource, namespace, record["name"])
                if existing is not None and self._this_submissions(record["kind"], existing, admission_id):
                    await self.delete(resource, existing)
                    log.info("deleted %s %s/%s: its submission was refused", record["kind"], namespace, record["name"])
            except Exception as exc:  # noqa: BLE001 - the reconciler removes it after its grace period
                log.warning("could not delete %s %s/%s of a refused submission: %s", record["kind"], namespace,
                            record["name"], summary(exc, self.timeout))

    async def _one(self, plan: dict, job: EffectiveJob, admission_id: str, decision: Decision) -> dict:
        if plan.get("by") == injections.BY_ADMISSION:
            return await self._inject(plan, job, admission_id, decision)
        return await self._guard(plan, job, admission_id, decision)

    async def _guard(self, plan: dict, job: EffectiveJob, admission_id: str, decision: Decision) -> dict:
        """A plan made after admission (by Trainer, or by our reconciler once the job is stored):
        nothing to create now, only an object that must not be there to refuse."""
        kind, name = plan["kind"], plan["name"]
        record: dict = {"kind": kind, "name": name, "namespace": job.namespace}
        later = "left-to-trainer" if plan["by"] == injections.BY_TRAINER else "deferred"
        try:
            existing = await self._current(kind, job.namespace, name)
            if existing is None:
                return {**record, "status": later}
            ours = self.provenance.verify(kind, existing) and _made_for(existing, job)
            if kind == "NetworkPolicy" and ours:
                return {**record, "status": later}  # the reconciler replaces it, or waits for its owner to go
            refused = await self._refusal(record, existing, job, ours, admission_id, decision)
            if refused:
                return refused
            await self.delete(INJECTED[kind], existing)  # our leftover: Trainer makes a key of its own
            return {**record, "status": later, "replaced": "a leftover of an earlier submission that was never admitted"}
        except Exception as exc:  # noqa: BLE001 - not known to be absent: the reviewer applies the failure mode
            reason = summary(exc, self.timeout)
            log.warning("could not look up %s %s/%s: %s", kind, job.namespace, name, reason)
            return {**record, "status": "failed", "reason": reason}

    async def _current(self, kind: str, namespace: str, name: str) -> dict | None:
        """The object of that name, read only when the watch shows one (a Secret's data is not in
        the watch) or the watch has not listed that namespace."""
        if self.existing is not None and self.existing.known(namespace):
            cached = self.existing.get(kind, namespace, name)
            if cached is None or kind == "NetworkPolicy":
                return cached
        return await self.get(INJECTED[kind], namespace, name)
    async def gone(self, namespace: str, records: list[dict], admission_id: str) -> list[dict]:
        """Those of ``records`` said created that are no longer this submission's objects (deleted, or
        replaced by another submission's), read back together; one that cannot be read counts as gone."""
        async def lost(record: dict) -> bool:
            try:
                existing = await self.get(INJECTED[record["kind"]], namespace, record["name"])
            except Exception:  # noqa: BLE001 - making it again reports the API trouble as a record
                return True
            return existing is None or not (_annotations(existing).get(injections.ADMISSION_ANNOTATION) == admission_id
                                            and self.provenance.verify(record["kind"], existing))
        created = [r for r in records if r.get("status") == "created"]
        return [r for r, lost_it in zip(created, await asyncio.gather(*map(lost, created))) if lost_it]

    async def _inject(self, plan: dict, job: EffectiveJob, admission_id: str, decision: Decision) -> dict:
        """Create first and look only on a name conflict: one API call in the common case."""
        kind, name = plan["kind"], plan["name"]
        record: dict = {"kind": kind, "name": name, "namespace": job.namespace}
        resource = INJECTED[kind]
        try:
            pair = await self.keys.take_async(plan["keyType"])
            body = self.provenance.stamp("Secret", secret(job, name, admission_id, pair))
            if not await self.create(resource, job.namespace, body):
                existing = await self.get(resource, job.namespace, name)
                if existing is not None:
                    ours = self.provenance.verify(kind, existing) and _made_for(existing, job)
                    if ours and self._this_submissions(kind, existing, admission_id) \
                            and _same_settings(existing, body):
                        # started by /mutate (here or on another replica), or a retried call
                        return {**record, "status": "created", **_key_fields(existing)}
                    refused = await self._refusal(record, existing, job, ours, admission_id, decision)
                    if refused:
                        return refused
                    await self.delete(resource, existing)
                    record["replaced"] = "a leftover of an earlier submission that was never admitted"
                if not await self.create(resource, job.namespace, body):
                    raise ApiError(409, "created again by someone else meanwhile")
            log.info("created %s %s/%s for %s %s", kind, job.namespace, name, job.kind, job.name)
            return {**record, "status": "created", **_key_fields(body)}
        except Exception as exc:  # noqa: BLE001 - an API failure becomes a record; the reviewer applies the failure mode
            reason = summary(exc, self.timeout)
            log.warning("could not create %s %s/%s: %s", kind, job.namespace, name, reason)
            return {**record, "status": "failed", "reason": reason}

    async def _refusal(self, record: dict, existing: dict, job: EffectiveJob, ours: bool, admission_id: str,
                       decision: Decision) -> dict | None:
        """The record for an existing object that must not be replaced (refused, or kept where the
        bundle adopts strangers); None when it is our leftover to replace."""
        kind = record["kind"]
        reason, fix, *adoptable = await self._keep_reason(kind, existing, job, ours, admission_id)
        if not reason:
            return None
        if _adopts(kind, decision) and adoptable != [False]:
            consequence = ("Trainer will use it" if kind == "Secret"
                           else "trainjob-admission added no NetworkPolicy for this job")
            return {**record, "status": "kept", "reason": f"{reason}; it was left as is and {consequence}",
                    **_key_fields(existing)}
        return {**record, "status": "refused", "reason": reason, "fix": fix, **_key_fields(existing)}

    def _this_submissions(self, kind: str, obj: dict, admission_id: str) -> bool:
        """Made by us for ``admission_id`` and owned by no job yet: the objects a submission may take
        as its own (another replica's /mutate began them) or withdraw (it was refused)."""
        return (bool(admission_id) and _annotations(obj).get(injections.ADMISSION_ANNOTATION) == admission_id
                and not obj["metadata"].get("ownerReferences") and self.provenance.verify(kind, obj))

    async def _keep_reason(self, kind: str, existing: dict, job: EffectiveJob, ours: bool,
                           admission_id: str) -> tuple[str, str] | tuple[str, str, bool]:
        """Why an existing object must not be replaced, the submitter's fix and, as a third item
        when False, that ``adoptExisting`` cannot keep it either; ("", "") when it is our leftover
        to replace."""
        name = existing["metadata"]["name"]
        if not ours:
            return ("already exists and was not created by trainjob-admission for this job",
                    f"delete {kind} {job.namespace}/{name} or rename the job")
        owners = existing["metadata"].get("ownerReferences") or []
        if owners:
            owner = owners[0]
            return (f"already exists and belongs to {owner.get('kind')} {owner.get('name')} (uid {owner.get('uid')})",
                    f"rename the job, or delete {owner.get('kind')} {owner.get('name')} first")
        other, seconds = _annotations(existing).get(injections.ADMISSION_ANNOTATION), age(existing["metadata"])
        if other != admission_id and seconds < IN_FLIGHT_SECONDS:
            # Another create of this name is being admitted: replacing its object would leave that job
            # without it (and our refusal's withdrawal would then delete what it holds).
            return (f"was created {seconds:.0f} s ago for another submission of {job.kind} {job.name} that is "
                    f"still being admitted",
                    f"wait for that submission: once it is stored, rename this job; if it was refused, retry "
                    f"in {math.ceil(IN_FLIGHT_SECONDS - seconds)} s", False)
        if await self.get_job(job.kind, job.namespace, job.name) is not None:  # not yet adopted, but a stored job of this name mounts it
            return (f"already exists for the {job.kind} {job.name} that is already in the cluster",
                    f"rename the job, or delete {job.kind} {job.name} first")
        return "", ""


def secret(job: EffectiveJob, name: str, admission_id: str, pair: keys.KeyPair) -> dict:
    """The Secret as Trainer's MPI plugin would write it (type, keys, immutable), with our metadata."""
    meta = injections.metadata(job, name)
    meta["annotations"].update({injections.ADMISSION_ANNOTATION: admission_id, KEY_TYPE_ANNOTATION: pair.key_type,
                                FINGERPRINT_ANNOTATION: pair.fingerprint})
    return {
        "apiVersion": "v1", "kind": "Secret", "metadata": meta,
        "type": "kubernetes.io/ssh-auth",
        "immutable": True,
        "data": {"ssh-privatekey": base64.b64encode(pair.private_pem).decode(),
                 "ssh-publickey": base64.b64encode(pair.public_openssh).decode()},
    }


def _annotations(obj: dict) -> dict:
    return obj["metadata"].get("annotations") or {}


def _made_for(obj: dict, job: EffectiveJob) -> bool:
    """Made for this job (same kind and name); whether by us, the provenance HMAC says."""
    return _annotations(obj).get(injections.JOB_ANNOTATION) == f"{job.kind}/{job.name}"


def _same_settings(existing: dict, body: dict) -> bool:
    """Whether the Secret ``existing`` is what ``body`` would be under the bundle as it is now: its
    key type (its keys are its own)."""
    return _annotations(existing).get(KEY_TYPE_ANNOTATION) == _annotations(body).get(KEY_TYPE_ANNOTATION)


def _adopts(kind: str, decision: Decision) -> bool:
    """The bundle's ``adoptExisting`` for this kind of object."""
    settings = decision.injection_settings
    section = settings.sshKey if kind == "Secret" else settings.networkPolicy
    return bool(section and section.adoptExisting)


def _key_fields(obj: dict) -> dict:
    """Key type and fingerprint of a Secret (ours from its annotations, another's from its public key)."""
    annotations = _annotations(obj)
    fields = {k: annotations[a] for k, a in (("keyType", KEY_TYPE_ANNOTATION), ("fingerprint", FINGERPRINT_ANNOTATION))
              if a in annotations}
    data = obj.get("data") or {}
    if "fingerprint" not in fields and "ssh-publickey" in data:
        try:
            fields["fingerprint"] = keys.fingerprint(base64.b64decode(data["ssh-publickey"]))
        except (ValueError, IndexError):
            pass  # not an authorized_keys line: nothing to report
    return fields
