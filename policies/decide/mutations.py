"""Mutations as JSONPatch on the submitted object.

Pod-level changes reach pods through ``spec.runtimePatches`` under our own manager name: in
Trainer v2.3 that is the only supported way to patch pod metadata and spec of a TrainJob
(pkg/apis/trainer/v1alpha1/trainjob_types.go, RuntimePatch). Legacy MPIJobs are patched in
their replica templates directly.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..bundle.schema import Mutations
from ..checks import duration
from ..job import effective_job, queueing, runtimepatch, smp
from ..job.effective_job import EffectiveJob, all_containers
from . import nodetargeting
from .patch_diff import make_patch

MANAGER = runtimepatch.OWN_MANAGER
ISTIO_INJECT = "sidecar.istio.io/inject"


def job_labels(obj: dict, settings: Mutations, namespace: dict,
               local_queues: Mapping[tuple[str, str], dict] | None = None) -> dict[str, str]:
    """Labels to add to the job itself: Kueue queue and priority, cost attribution. The default
    queue only where that LocalQueue exists (``local_queues``; None: not known, added as set):
    Kueue would keep a job naming a missing one suspended for ever."""
    existing = (obj.get("metadata") or {}).get("labels") or {}
    ns_name = (namespace.get("metadata") or {}).get("name", "")
    ns_labels = (namespace.get("metadata") or {}).get("labels") or {}
    wanted: dict[str, str] = {}
    scheduling = settings.scheduling
    if scheduling:
        queue = ((ns_labels.get(scheduling.namespaceQueueLabel) if scheduling.namespaceQueueLabel else None)
                 or scheduling.queues.get(ns_name) or scheduling.defaultQueue)
        if queue and (local_queues is None or (ns_name, queue) in local_queues):
            wanted[scheduling.queueLabel] = queue
        priority = scheduling.priorityClasses.get(ns_name) or scheduling.priorityClass
        if priority:
            wanted[scheduling.priorityLabel] = priority
    if settings.costLabels:
        for key in settings.costLabels.fromNamespaceLabels:
            if key in ns_labels:
                wanted[key] = ns_labels[key]
    return {k: v for k, v in wanted.items() if k not in existing}


def pod_metadata(settings: Mutations, cost_labels: dict[str, str]) -> dict:
    metadata: dict = {}
    if settings.istio and settings.istio.disableSidecar:
        # Istio reads the label (current) and the annotation (older releases); set both.
        metadata = {"labels": {ISTIO_INJECT: "false"}, "annotations": {ISTIO_INJECT: "false"}}
    if cost_labels:
        metadata.setdefault("labels", {}).update(cost_labels)
    return metadata


def security_defaults(pod_spec: dict, added: frozenset[str] = frozenset()) -> dict:
    """The smallest pod-spec patch that makes a silent pod restricted-conformant; never
    overrides a value the runtime or the user set. ``added``: containers Trainer adds itself,
    which a runtimePatch cannot name (PodSet.added_containers): left as they are."""
    patch: dict = {}
    pod_sc = pod_spec.get("securityContext") or {}
    wanted_pod: dict = {}
    if "runAsNonRoot" not in pod_sc:
        wanted_pod["runAsNonRoot"] = True
    if "seccompProfile" not in pod_sc:
        wanted_pod["seccompProfile"] = {"type": "RuntimeDefault"}
    if wanted_pod:
        patch["securityContext"] = wanted_pod
    for key, _, container in all_containers(pod_spec):
        if key == "ephemeralContainers" or container.get("name") in added:
            continue
        sc = container.get("securityContext") or {}
        wanted: dict = {}
        if "allowPrivilegeEscalation" not in sc:
            wanted["allowPrivilegeEscalation"] = False
        if "drop" not in (sc.get("capabilities") or {}):
            wanted["capabilities"] = {"drop": ["ALL"]}
        if wanted:
            patch.setdefault(key, []).append({"name": container.get("name"), "securityContext": wanted})
    return patch


def plan(obj: dict, job: EffectiveJob, settings: Mutations, namespace: dict,
         deadline: duration.Defaults | None = None,
         local_queues: Mapping[tuple[str, str], dict] | None = None) -> tuple[list[dict], dict]:
    """JSONPatch operations for ``obj`` (empty when there is nothing to change) and the object
    they produce, so the caller need not apply them to a copy again. ``deadline``: what the
    duration limits (policies/checks/duration.py) set on a job that lacks it."""
    labels = job_labels(obj, settings, namespace, local_queues)
    cost = {k: v for k, v in labels.items() if settings.costLabels and k in settings.costLabels.fromNamespaceLabels}
    metadata = pod_metadata(settings, cost)
    defaults = settings.securityDefaults is not None and settings.securityDefaults.enabled
    targeting = settings.nodeTargeting
    product = nodetargeting.requested_product(obj, targeting) if targeting else None
    resource_tolerations = settings.extendedResourceTolerations is not None and settings.extendedResourceTolerations.enabled
    mutated = smp.clone(obj)
    if labels:
        mutated.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
    if job.kind == "TrainJob":
        replicated = []
        for ps in job.pod_sets:  # every pod the job creates: launcher, nodes and initializers alike
            pod_patch: dict = {}
            if metadata:
                pod_patch["metadata"] = smp.clone(metadata)
            pod_spec = ps.pod.get("spec") or {}
            spec_patch = security_defaults(pod_spec, ps.added_containers) if defaults else {}
            if targeting:  # only the pods that request the accelerators (never a launcher without)
                spec_patch.update(nodetargeting.pod_spec_patch(pod_spec, ps.requests, targeting, product))
            if resource_tolerations:  # after node targeting: its tolerations count as the pod's
                spec_patch.update(nodetargeting.resource_tolerations({**pod_spec, **spec_patch}, ps.requests))
            if spec_patch:
                pod_patch["spec"] = spec_patch
            if pod_patch:
                replicated.append({"name": ps.name, "template": {"spec": {"template": pod_patch}}})
        patches = [p for p in (mutated.get("spec") or {}).get("runtimePatches") or []
                   if not (isinstance(p, dict) and p.get("manager") == MANAGER)]
        if replicated:
            patches.append({"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": replicated}}}})
        if patches or (mutated.get("spec") or {}).get("runtimePatches"):
            mutated.setdefault("spec", {})["runtimePatches"] = patches
    elif job.kind == "MPIJob":
        for key in ("Launcher", "Worker"):
            template = (((mutated.get("spec") or {}).get("mpiReplicaSpecs") or {}).get(key) or {}).get("template")
            if template is None:
                continue
            for part in ("labels", "annotations"):
                if metadata.get(part):
                    template.setdefault("metadata", {}).setdefault(part, {}).update(metadata[part])
            if defaults:
                template["spec"] = _merge_defaults(template.get("spec") or {})
            requests = next((ps.requests for ps in job.pod_sets if ps.name == key.lower()), {})
            if targeting:
                found = nodetargeting.pod_spec_patch(template.get("spec") or {}, requests, targeting, product)
                if found:
                    template["spec"] = smp.merge(template.get("spec") or {}, found)
            if resource_tolerations:
                found = nodetargeting.resource_tolerations(template.get("spec") or {}, requests)
                if found:
                    template["spec"] = smp.merge(template.get("spec") or {}, found)
    if local_queues is not None and settings.scheduling and labels.get(settings.scheduling.queueLabel):
        # Kueue's own webhook suspends a job naming a queue, but it ran before ours added the label
        # (webhooks run in name order): created running, Trainer would start pods Kueue has not admitted.
        set_default(mutated, queueing.SUSPEND[job.kind], True, replace_set=True)
    if deadline is not None and deadline.seconds is not None:
        set_default(mutated, duration.FIELDS[job.kind], deadline.seconds)
    if deadline is not None and deadline.limited and job.kind == "MPIJob":
        set_default(mutated, duration.CLEAN_POD_POLICY.split("."), duration.STOPS_WORKERS[0])
    return _minimal_patch(obj, mutated), mutated


def set_default(obj: dict, path: Sequence[str], value: object, *, replace_set: bool = False) -> None:
    """The field at ``path`` set to ``value`` unless it has one (or whatever it has, with
    ``replace_set``): the default deadline, the MPIJob cleanPodPolicy that stops the workers
    with it, a queued job's suspend. Top-level fields: neither Trainer nor mpi-operator puts them
    into a pod, so the effective job stays as it was built."""
    *parents, name = path
    holder = obj
    for key in parents:
        child = holder.get(key)
        if child is None:
            child = holder[key] = {}
        if not isinstance(child, dict):
            return  # a malformed job: the API server refuses it, and the check reports it
        holder = child
    if replace_set or holder.get(name) is None:
        holder[name] = value


def mutated_job(planned_on: EffectiveJob, mutated: dict) -> EffectiveJob | None:
    """The effective job of ``mutated`` from the job its mutation was planned on, without building
    it again (effective_job.with_patch): for a TrainJob, whose mutation is labels and one
    runtimePatch of pod metadata, securityContext, tolerations and node affinity. None for an
    MPIJob (its templates change: build it)."""
    if planned_on.kind != "TrainJob":
        return None
    patches = (mutated.get("spec") or {}).get("runtimePatches") or []
    own = next((i for i, p in enumerate(patches) if isinstance(p, dict) and p.get("manager") == MANAGER), None)
    if own is None:
        return replace(planned_on, labels=dict((mutated.get("metadata") or {}).get("labels") or {}))
    return effective_job.with_patch(planned_on, mutated, own)


def with_own_patch(planned_on: EffectiveJob, obj: dict) -> EffectiveJob | None:
    """The effective job of ``obj`` from ``planned_on``, the job built from ``obj`` without our
    runtimePatch (:func:`without_own_patch`), when that patch is one and the last, as /mutate adds
    it; None otherwise (Trainer merges patches in order, so one after ours may change what ours
    set: build it)."""
    patches = (obj.get("spec") or {}).get("runtimePatches") or []
    own = [i for i, p in enumerate(patches) if isinstance(p, dict) and p.get("manager") == MANAGER]
    if own != [len(patches) - 1]:
        return None
    return mutated_job(planned_on, obj)


def without_own_patch(obj: dict) -> dict | None:
    """``obj`` without the runtimePatch we added earlier (None when it has none): the security
    defaults are planned on the pods without it, so planning again on a mutated object (as
    /validate does) keeps that patch instead of finding nothing missing and removing it."""
    spec = obj.get("spec")
    patches = spec.get("runtimePatches") if isinstance(spec, dict) else None  # ill-typed: the job model refuses it
    if not isinstance(patches, list) or not any(isinstance(p, dict) and p.get("manager") == MANAGER for p in patches):
        return None
    base = smp.clone(obj)
    base["spec"]["runtimePatches"] = [p for p in patches if not (isinstance(p, dict) and p.get("manager") == MANAGER)]
    return base


def _merge_defaults(pod_spec: dict) -> dict:
    return smp.merge(pod_spec, security_defaults(pod_spec))


def _minimal_patch(before: dict, after: dict) -> list[dict]:
    """A JSONPatch from before to after, in the same order on every run (the diff walk costs far
    more than the equality check that usually finds nothing to do)."""
    return [] if before == after else make_patch(before, after)
