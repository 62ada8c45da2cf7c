"""The effective job: what a TrainJob (or legacy MPIJob) will run once the Trainer reconciles it.

Policies are written against this model (CEL variable ``job``) instead of walking the runtime
by hand. The TrainJob overrides are applied in the order and with the rules of Kubeflow Trainer
v2.3.0; each step cites the upstream file it mirrors.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .. import PolicyError
from ..k8s import limitranger, podvalidation, redaction, versions
from ..k8s.clusterstate import TRAINER_GROUP, ClusterState
from ..k8s.podresources import pod_resources
from ..k8s.quantity import DEFAULT_ACCELERATORS, QuantityError, is_accelerator, numbers
from . import phases, runtimepatch, smp, trainerwebhook

MPIJOB_GROUP = "kubeflow.org"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # pkg/constants/constants.go
ANCESTOR_TRAINER = "trainer"
INITIALIZERS = ("dataset-initializer", "model-initializer")  # ancestors Trainer runs with 1 replica
BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"  # still read before spec.storageClassName
FLUX_INSTALLER = "flux-installer"  # pkg/constants FluxInstallerContainerName
FLUX_INSTALLER_IMAGE = "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy"  # pkg/constants FluxInstallerImage
LAUNCHER = "launcher"  # replicated job names the MPI plugin keys on (pkg/constants)
NODE = "node"  # both the worker replicated job and the trainer container are named "node"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # jobset v0.12 api/jobset/v1alpha2
# mpi-operator v2beta1 labels its pods with these (pkg/apis/kubeflow/v2beta1/constants.go).
MPIJOB_NAME_LABEL = "training.kubeflow.org/job-name"
INT32_MAX = 2**31 - 1  # the CRDs' counts are int32
MAX_REPLICATED_JOBS = 32  # after runtimePatches; real runtimes have 2-4 (initializers, launcher, node)
# A field podvalidation names inside a container: "containers[name=x].resources.limits.cpu".
_CONTAINER_REFUSAL = re.compile(r"(initContainers|containers)\[name=(.*?)\]\.(.*)", re.S)
_JSON_TYPES = {str: "string", bool: "boolean", float: "number", list: "list", dict: "mapping"}


class JobModelError(PolicyError, ValueError):
    """The object cannot be turned into an effective job (its runtime is missing, a value is bad)."""


class MutationRefused(JobModelError):
    """A mutation that cannot be made as the job asks (policies/decide/nodetargeting.py): reported under
    the mutation's own rule, by the bundle whose settings of it were used."""

    rule: str = "job-model"
    mutation: str = ""  # the bundle.Mutations field

    def __init__(self, message: str, remediation: str):
        super().__init__(message)
        self.remediation = remediation  # the fix, in the denial's remediation field


class PodRefused(JobModelError):
    """Pods the API server would refuse (policies/k8s/podvalidation.py): the job is refused, and
    ``job`` is the job without the refused values, so every other problem can be judged and
    reported too (a negative GPU count must not hide the quota and shape failures). The message is
    the first refusal; ``messages`` has one per pod set."""

    def __init__(self, messages: list[str], job: EffectiveJob):
        super().__init__(messages[0])
        self.messages, self.job = messages, job


class RuntimeNotFound(JobModelError):
    """The runtime the TrainJob names is not in the state: offline, state the reviewer left out."""

    def __init__(self, message: str, missing: str):
        super().__init__(message)
        self.missing = missing  # "no ClusterTrainingRuntime 'x'", for Decision.unchecked


@dataclass
class PodSet:
    """One replicated job: ``count`` identical pods built from ``pod``."""

    name: str
    role: str  # launcher | worker (every replicated job that trains) | initializer
    count: int
    pod: dict  # {"metadata": {...}, "spec": {...}} after all overrides
    template: str  # where the pod template lives, for field paths in messages
    # Fields of the "node" container Trainer copies from spec.trainer: "image" (and command,
    # args), "resources" (resourcesPerNode). Messages name spec.trainer for these, else the template.
    from_trainer: frozenset[str] = frozenset()
    requests: dict[str, int] = field(default_factory=dict)  # per pod, cpu in millicores
    limits: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)  # per pod, accelerator name -> count
    depends_on: tuple[tuple[str, str], ...] = ()  # JobSet dependsOn: (replicated job, "Ready"|"Complete")
    # Containers Trainer adds to the pod (Flux's installer): judged, but no runtimePatch can name them.
    added_containers: frozenset[str] = frozenset()
    replicas: int = 1  # the batch Jobs JobSet creates for it, one per replica (object-count quotas)
    patches: tuple[str, ...] = ()  # the runtimePatches that change its pods ("spec.runtimePatches[0]")

    @property
    def source(self) -> str:
        """Where its pods come from, for messages: the template and the patches on it."""
        return f"{self.template} with {', '.join(self.patches)}" if self.patches else self.template

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())

    def as_cel(self) -> dict:
        return {
            "name": self.name,
            "role": self.role,
            "count": self.count,
            "pod": self.pod,
            "requests": self.requests,
            "limits": self.limits,
            "cpu": self.requests.get("cpu", 0),
            "memory": self.requests.get("memory", 0),
            "gpus": self.gpu_count,
            "gpusByResource": self.gpus,
            "images": images_of(self.pod.get("spec", {})),
            "dependsOn": [{"name": name, "status": status} for name, status in self.depends_on],
        }


@dataclass
class EffectiveJob:
    kind: str
    name: str
    namespace: str
    labels: dict[str, str]
    runtime: dict  # {"name", "kind"}
    mpi: dict  # {"implementation", "numProcPerNode", "runLauncherAsNode", "sshAuthMountPath"}
    pod_sets: list[PodSet]
    pod_selector: dict[str, str]  # labels every pod of this job will carry
    # The JobSet's own objects (policies/capacity/objectcounts.py): PVC templates of its volumeClaimPolicies,
    # and whether it gets a headless Service (network.enableDNSHostnames, defaulted to true).
    volume_claims: list[dict] = field(default_factory=list)
    headless_service: bool = False
    # Whether Trainer copies the runtime into ConfigMap <job>-runtime-snapshot (v2.3 on,
    # policies/k8s/versions.py TrainerRuntimeSnapshot): one more ConfigMap for object-count quotas.
    runtime_snapshot: bool = False
    # What the submitter is warned of: Trainer's webhook warnings (a deprecated runtime) and the pod
    # fields this cluster's API server drops (policies/k8s/versions.py drop_disabled_fields).
    warnings: tuple[str, ...] = ()

    def role(self, role: str) -> PodSet | None:
        return next((ps for ps in self.pod_sets if ps.role == role), None)

    @property
    def launcher(self) -> PodSet | None:
        return self.role("launcher")

    @property
    def workers(self) -> PodSet | None:
        """The first replicated job that trains (the one numNodes sets): messages name it."""
        return self.role("worker")

    @property
    def worker_sets(self) -> list[PodSet]:
        """Every replicated job that trains and has pods, whatever the runtime calls it."""
        return [ps for ps in self.with_pods if ps.role == "worker"]

    @property
    def with_pods(self) -> list[PodSet]:
        """The pod sets that create pods: per-pod rules have nothing to judge in a set of 0
        (an MPIJob's Worker without replicas, parallelism: 0)."""
        return [ps for ps in self.pod_sets if ps.count]

    @property
    def worker_count(self) -> int:
        """Worker pods over every replicated job that trains (CEL ``job.workers``)."""
        return sum(ps.count for ps in self.worker_sets)

    @property
    def num_nodes(self) -> int:
        return self.worker_count + (1 if self.mpi.get("runLauncherAsNode") and self.launcher else 0)

    def peak(self, amount: Callable[[PodSet], int]) -> tuple[int, list[PodSet]]:
        """The most of ``amount`` per pod the job holds at one moment: replicated jobs chained by
        dependsOn Complete never run together (policies/job/phases.py)."""
        return phases.peak(self.pod_sets, amount, self._concurrent)

    @property
    def all_concurrent(self) -> bool:
        """No dependsOn Complete orders the pod sets: every peak is the sum (the common case)."""
        return len(self._concurrent) == 1 and len(self._concurrent[0]) == len(self.pod_sets)

    @functools.cached_property
    def _concurrent(self) -> list[tuple[int, ...]]:
        """phases.groups, once per job: the quota check and ``job.peak`` ask for many resources."""
        return phases.groups(self.pod_sets)

    @functools.cached_property
    def totals(self) -> dict[str, Any]:
        """Sums over all pods; kept once asked (checks, CEL and messages ask often): the pod sets
        are final when build returns. Read only."""
        requests: dict[str, int] = {}
        limits: dict[str, int] = {}
        gpus: dict[str, int] = {}
        for ps in self.pod_sets:
            for target, per_pod in ((requests, ps.requests), (limits, ps.limits), (gpus, ps.gpus)):
                for resource, amount in per_pod.items():
                    target[resource] = target.get(resource, 0) + amount * ps.count
        return {
            "pods": sum(ps.count for ps in self.pod_sets),
            "cpu": requests.get("cpu", 0),
            "memory": requests.get("memory", 0),
            "cpuLimits": limits.get("cpu", 0),
            "memoryLimits": limits.get("memory", 0),
            "gpus": sum(gpus.values()),
            "gpusByResource": gpus,
            "requests": requests,
            "limits": limits,
        }

    @property
    def peak_totals(self) -> dict[str, Any]:
        """``peak`` of the pods and of every resource requested or limited (CEL ``job.peak``)."""
        if self.all_concurrent:
            totals = self.totals
            return {"pods": totals["pods"], "requests": totals["requests"], "limits": totals["limits"]}
        requests = {r for ps in self.pod_sets for r in ps.requests}
        limits = {r for ps in self.pod_sets for r in ps.limits}
        return {
            "pods": self.peak(lambda ps: 1)[0],
            "requests": {r: self.peak(lambda ps, r=r: ps.requests.get(r, 0))[0] for r in sorted(requests)},
            "limits": {r: self.peak(lambda ps, r=r: ps.limits.get(r, 0))[0] for r in sorted(limits)},
        }

    def as_cel(self) -> dict:
        """The CEL variable ``job``; plain JSON types only."""
        launcher, workers = self.launcher, self.workers
        return {
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "runtime": self.runtime,
            "mpi": self.mpi,
            "slots": self.mpi.get("numProcPerNode", 1),
            "numNodes": self.num_nodes,
            "launcher": launcher.as_cel() if launcher else None,
            "worker": workers.as_cel() if workers else None,
            "workers": self.worker_count,
            "podSets": [ps.as_cel() for ps in self.pod_sets],
            "images": sorted({image for ps in self.pod_sets for image in images_of(ps.pod.get("spec", {}))}),
            "totals": self.totals,
            "peak": self.peak_totals,
        }


def containers_of(pod_spec: dict) -> list[tuple[str, dict]]:
    """(list key, container) for what a pod runs: its init containers, then its containers."""
    return [(key, c) for key in ("initContainers", "containers") for c in pod_spec.get(key) or []]


def images_of(pod_spec: dict) -> list[str]:
    return [c.get("image", "") for _, c in containers_of(pod_spec)]


def all_containers(pod_spec: dict) -> list[tuple[str, int, dict]]:
    return [
        (key, index, container)
        for key in ("initContainers", "containers", "ephemeralContainers")
        for index, container in enumerate(pod_spec.get(key) or [])
        if isinstance(container, dict)
    ]


def _finish(pod_set: PodSet, accelerators: tuple[str, ...]) -> PodSet:
    malformed = _malformed(pod_set.pod)
    if malformed:
        raise JobModelError(f"{pod_set.source}: {malformed}: the API server refuses such a pod template")
    try:
        pod_set.requests, pod_set.limits = pod_resources(pod_set.pod.get("spec") or {})
    except QuantityError as exc:
        raise JobModelError(f"{pod_set.source}: {exc}") from exc
    pod_set.gpus = {name: amount for name, amount in pod_set.requests.items() if is_accelerator(name, accelerators)}
    return pod_set


def _malformed(pod: dict) -> str | None:
    """The first field of a pod template that is not of its schema's type, where the model reads
    it: /mutate sees an object before the API server checks it against the schema."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return "spec is not an object"
    for key in ("containers", "initContainers", "ephemeralContainers"):
        containers = spec.get(key)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return f"spec.{key} is not a list"
        for index, container in enumerate(containers):
            if not isinstance(container, dict):
                return f"spec.{key}[{index}] is not an object"
            if not isinstance(container.get("resources") or {}, dict):
                return f"spec.{key}[{index}].resources is not an object"
    return None


def _container(pod_spec: dict, name: str) -> dict | None:
    return next((c for c in pod_spec.get("containers") or [] if c.get("name") == name), None)


def _upsert_env(container: dict, env: list[dict]) -> None:
    """Trainer's apply.UpsertEnvVars: an entry replaces the one of its name whole (a value
    replaces a valueFrom, not merged into it), others are appended in order."""
    merged = [e for e in container.get("env") or [] if isinstance(e, dict)]
    at = {str(e.get("name")): i for i, e in reversed(list(enumerate(merged)))}  # the first of a name, in O(n)
    for entry in env:
        if not isinstance(entry, dict):
            continue
        name = str(entry.get("name"))
        if name in at:
            merged[at[name]] = smp.clone(entry)
        else:
            at[name] = len(merged)
            merged.append(smp.clone(entry))
    container["env"] = merged


def build(obj: dict, state: ClusterState, accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS) -> EffectiveJob:
    """Dispatch on apiVersion/kind; raises JobModelError with a message for the submitter.
    ``accelerators``: the resource patterns counted as GPUs (PodSet.gpus, totals["gpus"])."""
    kind = obj.get("kind")
    group = str(obj.get("apiVersion", "")).split("/")[0]
    try:
        if kind == "TrainJob" and group == TRAINER_GROUP:
            return _as_admitted(from_trainjob(obj, state, accelerators), state, accelerators)
        if kind == "MPIJob" and group == MPIJOB_GROUP:
            return _as_admitted(from_mpijob(obj, accelerators), state, accelerators)
    except (AttributeError, TypeError) as exc:
        # /mutate sees the object before the API server checks it against its schema, so a value of
        # the wrong type anywhere (a string where an object belongs) is refused here as it would be.
        meta = obj.get("metadata")
        name = meta.get("name", "") if isinstance(meta, dict) else ""
        raise JobModelError(f"{kind} {name}: a field is not of the type its "
                            f"schema requires ({exc}); the API server refuses such an object") from exc
    raise JobModelError(f"unsupported object {obj.get('apiVersion')}/{kind}: expected trainer.kubeflow.org TrainJob or kubeflow.org MPIJob")


def _as_admitted(job: EffectiveJob, state: ClusterState, accelerators: tuple[str, ...]) -> EffectiveJob:
    """Each pod as the API server will store it in the job's namespace: without the fields this
    cluster's version drops (policies/k8s/versions.py), the default PriorityClass (Priority
    admission), the RuntimeClass's overhead (RuntimeClass admission), requests defaulted from
    limits, then the LimitRange defaults (policies/k8s/limitranger.py), counted again; then refused
    if the API server would refuse it (policies/k8s/podvalidation.py). Nothing is recounted (or
    spent) without a dropped field, overhead or LimitRange. The runtime's PVCs get the default
    StorageClass (DefaultStorageClass admission)."""
    limit_ranges = state.namespace_limit_ranges(job.namespace)
    defaults = limitranger.container_defaults(limit_ranges) if limit_ranges else None
    priority_class, storage_class = state.default_priority_class(), state.default_storage_class()
    for claim in job.volume_claims:
        claim_spec = claim.get("spec")
        if storage_class and isinstance(claim_spec, dict) and claim_class(claim) is None:
            claim["spec"] = {**claim_spec, "storageClassName": storage_class}  # not in place: the runtime is shared
    refusals: dict[str, list[str]] = {}  # what is refused -> the pod sets it is refused in
    for pod_set in job.pod_sets:
        pod_spec = pod_set.pod["spec"]
        dropped = versions.drop_disabled_fields(pod_spec, state.versions)
        job.warnings += tuple(f"the API server drops {pod_set.name} pods: {field} in this cluster "
                              f"({state.versions.kubernetes_text}): the pods run without it; set what it sets "
                              "per container instead" for field in dropped)
        if priority_class and not pod_spec.get("priorityClassName"):
            pod_spec["priorityClassName"] = priority_class  # the Priority admission plugin
        overhead = _runtime_class_overhead(pod_spec, state)
        if overhead is not None:
            pod_spec["overhead"] = overhead
        if defaults is not None:
            limitranger.apply(pod_spec, defaults)
        if dropped or overhead is not None or defaults is not None:
            _finish(pod_set, accelerators)
        refused = podvalidation.refusals(pod_spec) or podvalidation.priority_refusals(pod_spec, state.priority_classes)
        if not refused and pod_spec.get("resources"):
            containers_only = {k: v for k, v in pod_spec.items() if k not in ("resources", "overhead")}
            refused = podvalidation.pod_level_refusals(pod_spec, pod_resources(containers_only)[0])
        if refused:
            refusals.setdefault(_refusal(job, pod_set, refused), []).append(pod_set.name)
            _drop(pod_spec, refused)
            _finish(pod_set, accelerators)
    if refusals:  # one message per value (resourcesPerNode reaches the launcher and the nodes alike)
        raise PodRefused([f"{' and '.join(names)} pods would be refused by Kubernetes: {what}"
                          for what, names in refusals.items()], job)
    return job


def _drop(pod_spec: dict, refused: list[tuple[str, str]]) -> None:
    """The pod without the values the API server refuses (fields as podvalidation names them:
    ``containers[name=x].resources.limits.nvidia.com/gpu``, ``resources.requests.cpu``,
    ``priorityClassName``), so the rest of the job can still be judged. Only pods of this job's
    model are changed: they are its own clones."""
    for path, _ in refused:
        in_container = _CONTAINER_REFUSAL.fullmatch(path)
        where = pod_spec
        if in_container:
            key, name, path = in_container.groups()
            where = next((c for c in pod_spec.get(key) or [] if isinstance(c, dict) and c.get("name") == name), {})
        head, _, rest = path.partition(".")
        if head != "resources":
            where.pop(head, None)
            continue
        section, _, resource = rest.partition(".")
        values = (where.get("resources") or {}).get(section)
        if isinstance(values, dict):
            values.pop(resource, None)


def claim_class(claim: dict) -> str | None:
    """A PVC's StorageClass as Kubernetes reads it (storage/util GetPersistentVolumeClaimClass):
    the old annotation first, then spec.storageClassName; None when it has neither, the only case
    DefaultStorageClass admission fills in (PersistentVolumeClaimHasClass). JobSet copies the
    template's annotations onto the claims it creates."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    if isinstance(annotations, dict) and BETA_STORAGE_CLASS in annotations:
        return str(annotations[BETA_STORAGE_CLASS])
    value = (claim.get("spec") or {}).get("storageClassName")
    return None if value is None else str(value)


def _runtime_class_overhead(pod_spec: dict, state: ClusterState) -> dict | None:
    """overhead.podFixed of the pod's RuntimeClass, which admission copies into spec.overhead."""
    name = pod_spec.get("runtimeClassName")
    runtime_class = state.runtime_class(name) if isinstance(name, str) and name else None
    fixed = ((runtime_class or {}).get("overhead") or {}).get("podFixed")
    return dict(fixed) if isinstance(fixed, dict) and fixed else None


def container_field(job: EffectiveJob, ps: PodSet, container: str, field: str, key: str = "containers") -> str:
    """Where the submitter sets ``field`` ("image", "resources.requests.cpu") of one container of
    ``ps`` (in its ``key`` list): spec.trainer where Trainer copies that field into the container,
    else the pod template — an MPIJob's replica spec, a TrainJob's runtime via spec.runtimePatches
    for the fields a patch keeps (policies/job/runtimepatch.py), the runtime alone for the rest."""
    if job.kind != "TrainJob":
        return f"spec.mpiReplicaSpecs.{ps.name.capitalize()}.template.spec.{key}[name={container}].{field}"
    section = field.partition(".")[0]
    if key == "containers" and container == NODE and section in ps.from_trainer:
        return "spec.trainer.image" if section == "image" else f"spec.trainer.resourcesPerNode{field[len(section):]}"
    if section in runtimepatch.CONTAINER_FIELDS:
        return (f"{field} of {key}[name={container}] in replicatedJobs[{ps.name}] through spec.runtimePatches "
                f"(now set by {ps.source})")
    return runtime_only(f"{key}[name={container}].{field}", ps)


def runtime_only(what: str, ps: PodSet) -> str:
    """A value of a TrainJob's pod that only its runtime sets, named for a fix."""
    return f"{what} of {ps.source} (only the runtime sets it; spec.runtimePatches cannot change it)"


def _refusal(job: EffectiveJob, pod_set: PodSet, refused: list[tuple[str, str]]) -> str:
    """The first refusal, at the field the submitter sets: a container's through container_field
    (spec.trainer.resourcesPerNode for the node container Trainer fills from it), else the pod's."""
    field, problem = refused[0]
    in_container = _CONTAINER_REFUSAL.fullmatch(field)
    if in_container:
        key, container, rest = in_container.groups()
        where = container_field(job, pod_set, container, rest, key)
    elif job.kind == "TrainJob":
        where = f"{field} in {pod_set.source} (the runtime sets it; spec.runtimePatches cannot change it)"
    else:
        where = f"spec.mpiReplicaSpecs.{pod_set.name.capitalize()}.template.spec.{field}"
    more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
    return f"{where}: {problem}{more}"


def from_trainjob(trainjob: dict, state: ClusterState,
                  accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS) -> EffectiveJob:
    meta = trainjob.get("metadata") or {}
    name, namespace = meta.get("name") or meta.get("generateName") or "", meta.get("namespace", "")
    spec = trainjob.get("spec") or {}
    ref = spec.get("runtimeRef") or {}
    ref_kind = ref.get("kind") or "ClusterTrainingRuntime"
    runtime = state.runtime(namespace, ref)
    if runtime is None:
        where = f" in namespace {namespace}" if ref_kind == "TrainingRuntime" else ""
        raise RuntimeNotFound(
            f"runtime {ref_kind} {ref.get('name')!r} not found{where}: "
            "set spec.runtimeRef to an installed runtime (kubectl get clustertrainingruntimes,trainingruntimes)",
            f"no {ref_kind} {ref.get('name')!r}{where}",
        )
    runtime_spec = runtime.get("spec") or {}
    runtime_name = f"{runtime.get('kind')} {(runtime.get('metadata') or {}).get('name')}"
    # A present mlPolicy, even {}, makes Trainer apply numNodes and resourcesPerNode (non-nil in Go).
    has_ml_policy = runtime_spec.get("mlPolicy") is not None
    ml_policy = runtime_spec.get("mlPolicy") or {}
    mpi_policy = ml_policy.get("mpi")
    trainer = spec.get("trainer") or {}
    run_launcher_as_node = bool(mpi_policy and mpi_policy.get("runLauncherAsNode"))
    per_node = trainer.get("resourcesPerNode")
    merges_per_node = state.versions.enabled("TrainerMergesResourcesPerNode")
    # Read before it merges into the runtime's pods, so that a bad quantity is reported at its field.
    per_node_gpus = _gpus_in(per_node, "spec.trainer.resourcesPerNode") if per_node else None
    node_resources: dict | None = None  # the first node/trainer job's "node" container (ExtractResourcePerNodeFromRuntime)
    requested = (count_field(trainer["numNodes"], "spec.trainer.numNodes") if trainer.get("numNodes") is not None
                 else None)

    # 1. runtimePatches merge into the JobSet spec in list order (core/trainingruntime.go,
    #    mergeRuntimePatches), each pruned to the fields the CRD keeps (policies/job/runtimepatch.py).
    #    Read only (merge copies what it changes); each pod below is cloned before it is changed.
    jobset_spec = (runtime_spec.get("template") or {}).get("spec") or {}
    patches = spec.get("runtimePatches") or []
    containers_by_job = {
        rjob.get("name", ""): {c.get("name", "") for _, c in containers_of(_pod_template(rjob).get("spec") or {})}
        for rjob in jobset_spec.get("replicatedJobs") or []
    } if patches else {}
    patched_by: dict[str, list[str]] = {}  # replicated job -> the patches that change its pods, for messages
    for index, patch in enumerate(patches):
        template = runtimepatch.template_patch(patch, state.versions)
        try:
            runtimepatch.check_names(template, containers_by_job, index)
        except runtimepatch.PatchError as exc:
            raise JobModelError(str(exc)) from exc
        if template.get("spec"):
            jobset_spec = smp.merge(jobset_spec, template["spec"])
            for rjob in template["spec"].get("replicatedJobs") or [] if _cited(patch) else []:
                patched_by.setdefault(rjob.get("name", ""), []).append(f"spec.runtimePatches[{index}]")
    refused = trainerwebhook.runtime_refusals(runtime)
    if refused:
        raise JobModelError(trainerwebhook.message(refused, f"{runtime_name}") + " (the runtime could not have been "
                            "created with Trainer's webhook running): use a runtime that Trainer accepts")
    refused = trainerwebhook.trainjob_refusals(trainjob, runtime, jobset_spec,
                                               lambda: _gpus_per_node(jobset_spec, per_node_gpus))
    if refused:
        raise JobModelError(trainerwebhook.message(refused))
    replicated_jobs = jobset_spec.get("replicatedJobs") or []
    if not replicated_jobs:
        raise JobModelError(f"runtime {runtime_name} has no replicatedJobs, so Trainer would create no pods: "
                            "set spec.runtimeRef to a runtime that runs your training")
    if len(replicated_jobs) > MAX_REPLICATED_JOBS:
        # Bounds the work below (each job's pod is cloned, and trainer.env copied into each
        # trainer job): a runtime of many small jobs must not multiply into gigabytes.
        raise JobModelError(f"runtime {runtime_name} has {len(replicated_jobs)} replicated jobs, "
                            f"more than {MAX_REPLICATED_JOBS}: training runtimes have a handful (initializers, "
                            "launcher, node)")

    pod_sets: list[PodSet] = []
    first_trainer = next((rjob.get("name") for rjob in replicated_jobs if _ancestor(rjob) == ANCESTOR_TRAINER), None)
    first_node = next((rjob.get("name") for rjob in replicated_jobs if rjob.get("name") == NODE), None)
    for rjob in replicated_jobs:
        rjob_name = rjob.get("name", "")
        job_template = rjob.get("template") or {}
        ancestor = _ancestor(rjob)
        is_trainer = ancestor == ANCESTOR_TRAINER and has_ml_policy
        pod = smp.clone(_pod_template(rjob))
        pod.setdefault("metadata", {})
        pod_spec = pod.setdefault("spec", {})

        # 2. Pod count: parallelism, or mlPolicy.numNodes for the trainer ancestor (core/trainingruntime.go, newRuntimeInfo).
        parallelism = (job_template.get("spec") or {}).get("parallelism")
        where = f"replicatedJobs[{rjob_name}]"
        count = 1 if parallelism is None else count_field(parallelism, f"{where}.template.spec.parallelism", minimum=0)
        if is_trainer:
            count = (1 if ml_policy.get("numNodes") is None
                     else count_field(ml_policy["numNodes"], "the runtime's spec.mlPolicy.numNodes"))

        # 3. resourcesPerNode merges into the "node" container of the trainer ancestor, and of the
        #    "node" job when the MPI launcher runs as a node (newRuntimeInfo + MergeResourceRequirements);
        #    Trainer v2.2 replaces that container's resources with it instead (TrainerMergesResourcesPerNode).
        node_container = _container(pod_spec, NODE)
        from_trainer: set[str] = set()
        if node_container is not None and (is_trainer or (run_launcher_as_node and rjob_name == NODE)
                                           or (ancestor == ANCESTOR_TRAINER and not merges_per_node)):
            from_trainer.add("resources")
            if trainer.get("resourcesPerNode") and merges_per_node:
                node_container["resources"] = smp.merge(node_container.get("resources") or {}, trainer["resourcesPerNode"])
            elif isinstance(per_node, dict) and (per_node.get("limits") is not None or per_node.get("requests") is not None):
                node_container["resources"] = {key: smp.clone(per_node[key]) for key in ("limits", "requests")
                                               if per_node.get(key) is not None}
        if node_resources is None and node_container is not None and (rjob_name == NODE or ancestor == ANCESTOR_TRAINER):
            node_resources = node_container.get("resources") or {}

        # 4. numNodes: the MPI plugin sets the first "node" job (minus one when the launcher is a
        #    node, plugins/mpi/mpi.go EnforceMLPolicy); the others set the first trainer ancestor
        #    (FindPodSetByAncestor in plugins/plainml, torch, jax, xgboost).
        if requested is not None:
            if mpi_policy is not None and rjob_name == first_node:
                count = max(requested - 1, 1) if run_launcher_as_node else requested
            elif mpi_policy is None and rjob_name == first_trainer:
                count = requested

        # 5. image/command/args go to the trainer ancestor's "node" container, env also to the
        #    launcher-as-node "node" job (plugins/jobset/builder.go, Trainer); the replicas of the
        #    trainer and initializer jobs become 1 (builder.go Trainer, Initializer).
        replicas = 1 if rjob.get("replicas") is None else count_field(rjob["replicas"], f"{where}.replicas", minimum=0)
        if ancestor == ANCESTOR_TRAINER or ancestor in INITIALIZERS:
            replicas = 1
        if ancestor == ANCESTOR_TRAINER and node_container is not None:
            from_trainer.add("image")
            for key in ("image", "command", "args"):
                if trainer.get(key) is not None:
                    node_container[key] = smp.clone(trainer[key])
        if node_container is not None and trainer.get("env") and (
            ancestor == ANCESTOR_TRAINER or (run_launcher_as_node and rjob_name == NODE)
        ):
            _upsert_env(node_container, trainer["env"])
        added: frozenset[str] = frozenset()
        if ml_policy.get("flux") is not None and rjob_name == NODE:
            added = frozenset({_add_flux_installer(pod_spec, node_container)})

        # JobSet labels every pod with the JobSet name, which is the TrainJob's name.
        pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), JOBSET_NAME_LABEL: name}
        pod_sets.append(_finish(PodSet(rjob_name, _role(rjob_name, ancestor, mpi_policy is not None), replicas * count,
                                       pod, f"{runtime_name}, replicatedJobs[{rjob_name}] pod template",
                                       frozenset(from_trainer),
                                       depends_on=_depends_on(rjob), added_containers=added, replicas=replicas,
                                       patches=tuple(patched_by.get(rjob_name, ()))),
                                accelerators))

    mpi: dict[str, Any] = {}
    if mpi_policy is not None:
        # 6. Slots: numProcPerNode from the TrainJob, else GPUs per node when the runtime says 1 (mpi.go).
        slots = int(mpi_policy.get("numProcPerNode") or 1)
        if trainer.get("numProcPerNode") is not None:
            slots = count_field(trainer["numProcPerNode"], "spec.trainer.numProcPerNode")
        elif slots == 1:
            gpus = per_node_gpus if per_node_gpus is not None else (
                _gpus_in(node_resources, f"{runtime_name} node container resources") if node_resources else 0)
            slots = gpus if gpus > 1 else 1
        mpi = {
            "implementation": mpi_policy.get("mpiImplementation") or "OpenMPI",
            "numProcPerNode": slots,
            "runLauncherAsNode": run_launcher_as_node,
            "sshAuthMountPath": mpi_policy.get("sshAuthMountPath") or "/root/.ssh",
        }
    return EffectiveJob(
        kind="TrainJob",
        name=name,
        namespace=namespace,
        labels=dict(meta.get("labels") or {}),
        runtime={"name": ref.get("name", ""), "kind": ref_kind},
        mpi=mpi,
        pod_sets=pod_sets,
        pod_selector={JOBSET_NAME_LABEL: name},
        volume_claims=[dict(claim) for policy in jobset_spec.get("volumeClaimPolicies") or [] if isinstance(policy, dict)
                       for claim in policy.get("templates") or [] if isinstance(claim, dict)],  # shallow: read only
        warnings=tuple(trainerwebhook.warnings(runtime)),
        headless_service=not (isinstance(jobset_spec.get("network"), dict)
                              and jobset_spec["network"].get("enableDNSHostnames") is False),
        runtime_snapshot=state.versions.enabled("TrainerRuntimeSnapshot"),
    )


def _gpus_per_node(jobset_spec: dict, per_node_gpus: int | None) -> int:
    """GPUs per node as Trainer's torchtune validation counts them: spec.trainer.resourcesPerNode,
    else the "node" container of the first "node" or trainer-ancestor job (runtime.go
    ExtractResourcePerNodeFromRuntime, GetNumGPUPerNode)."""
    if per_node_gpus is not None:
        return per_node_gpus
    for rjob in jobset_spec.get("replicatedJobs") or []:
        if isinstance(rjob, dict) and (rjob.get("name") == NODE or _ancestor(rjob) == ANCESTOR_TRAINER):
            node = _container(_pod_template(rjob).get("spec") or {}, NODE)
            if node is not None and isinstance(node.get("resources"), dict):
                return _gpus_in(node["resources"], f"replicatedJobs[{rjob.get('name')}] node container resources")
    return 0


def _add_flux_installer(pod_spec: dict, node_container: dict | None) -> str:
    """The init container Trainer's Flux plugin adds to the "node" pods (plugins/flux/flux.go
    EnforceMLPolicy): its image is FLUX_VIEW_IMAGE from the trainer's env, else Trainer's default;
    it sets no resources or securityContext, so Pod Security and registries judge it as it is."""
    image = next((e.get("value") for e in (node_container or {}).get("env") or []
                  if isinstance(e, dict) and e.get("name") == "FLUX_VIEW_IMAGE" and isinstance(e.get("value"), str)),
                 FLUX_INSTALLER_IMAGE)
    pod_spec["initContainers"] = [*(pod_spec.get("initContainers") or []),
                                  {"name": FLUX_INSTALLER, "image": image,
                                   "command": ["/bin/bash", "/etc/flux-config/init.sh"]}]
    return FLUX_INSTALLER


def _cited(patch: dict) -> bool:
    """Whether messages name this runtimePatch as one that shapes the pods: the submitter's (and
    other tools') patches, never the service's own (runtimepatch.OWN_MANAGER)."""
    return not (isinstance(patch, dict) and patch.get("manager") == runtimepatch.OWN_MANAGER)


def with_patch(job: EffectiveJob, obj: dict, index: int) -> EffectiveJob:
    """``job``, built from ``obj`` without its ``spec.runtimePatches[index]``, with that patch
    merged into its pods as Trainer merges it, for a patch of pod metadata, securityContext,
    tolerations and node affinity only (the service's own mutation, policies/decide/mutations.py): such a
    patch changes no count, resource, role or container, so the pods need not be built again, which
    would double the cost of every mutated CREATE. tests/unit/test_corpus.py holds it equal to
    build(obj)."""
    patch = runtimepatch.template_patch(obj["spec"]["runtimePatches"][index])
    by_name = {rjob.get("name"): rjob for rjob in (patch.get("spec") or {}).get("replicatedJobs") or []}
    pod_sets = []
    for ps in job.pod_sets:
        pod_patch = _pod_template(by_name[ps.name]) if ps.name in by_name else None
        if pod_patch:
            cited = (f"spec.runtimePatches[{index}]",) if _cited(obj["spec"]["runtimePatches"][index]) else ()
            ps = replace(ps, pod=smp.merge(ps.pod, pod_patch), patches=(*ps.patches, *cited))
        pod_sets.append(ps)
    return replace(job, labels=dict((obj.get("metadata") or {}).get("labels") or {}), pod_sets=pod_sets)


def _pod_template(rjob: dict) -> dict:
    return ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}


def _ancestor(rjob: dict) -> str | None:
    return (((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)


def _role(rjob_name: str, ancestor: str | None, is_mpi: bool) -> str:
    """What a replicated job does, by Trainer's labels rather than its name: only the MPI plugin's
    "launcher" coordinates and initializers only fetch; every other job runs the training code
    (a runtime cannot take its pods out of per-worker limits by naming its job differently)."""
    if is_mpi and rjob_name == LAUNCHER:
        return "launcher"
    if ancestor in INITIALIZERS:
        return "initializer"
    return "worker"


def _depends_on(rjob: dict) -> tuple[tuple[str, str], ...]:
    return tuple((str(d.get("name", "")), str(d.get("status", ""))) for d in rjob.get("dependsOn") or []
                 if isinstance(d, dict))


def count_field(value: Any, field: str, minimum: int = 1) -> int:
    """A count the submitter sets, as the API server's int32 holds it: "4", 4.5, true and numbers
    below ``minimum`` are refused by name rather than coerced (``int("4")``, ``int(True)``; a
    negative count would shrink the job's totals), since an offline review or a forged
    AdmissionReview never passed the CRD's schema."""
    if type(value) is not int:
        what = _JSON_TYPES.get(type(value), type(value).__name__)
        raise JobModelError(f"{field} must be an integer, got {redaction.shown(value)} (a {what})")
    if not minimum <= value <= INT32_MAX:
        raise JobModelError(f"{field} must be an integer from {minimum} to {INT32_MAX}, got {value!r:.32}")
    return value


def _gpus_in(resources: dict, where: str) -> int:
    """GPUs per node as Trainer's MPI plugin counts them for slots (runtime.GetNumGPUPerNode): the
    first resource whose name contains "gpu", in the requests, else in the limits; not the
    service's accelerator families (resources.py). Go's map order makes "first" arbitrary when a
    container names two such resources; here it is the order written."""
    try:
        requests = numbers(resources.get("requests"), f"{where}.requests")
        limits = numbers(resources.get("limits"), f"{where}.limits")
    except QuantityError as exc:
        raise JobModelError(str(exc)) from exc
    first = [next((v for k, v in amounts.items() if "gpu" in k.lower()), 0) for amounts in (requests, limits)]
    return first[0] or first[1]


def from_mpijob(mpijob: dict, accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS) -> EffectiveJob:
    """Legacy kubeflow.org/v2beta1 MPIJob: Launcher and Worker replica specs, slotsPerWorker."""
    meta = mpijob.get("metadata") or {}
    name, namespace = meta.get("name") or "", meta.get("namespace", "")
    spec = mpijob.get("spec") or {}
    replica_specs = spec.get("mpiReplicaSpecs") or {}
    pod_sets = []
    # mpi-operator's defaults (pkg/apis/kubeflow/v2beta1/default.go): 1 launcher, 0 workers.
    for key, role, default_replicas in (("Launcher", "launcher", 1), ("Worker", "worker", 0)):
        replica = replica_specs.get(key)
        if not replica:
            continue
        if not isinstance(replica, dict) or not isinstance(replica.get("template") or {}, dict):
            raise JobModelError(f"MPIJob {name}: spec.mpiReplicaSpecs.{key} and its template must be objects")
        pod = smp.clone(replica.get("template") or {})
        pod.setdefault("metadata", {})
        pod.setdefault("spec", {})
        pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), MPIJOB_NAME_LABEL: name}
        replicas = replica.get("replicas")
        count = (default_replicas if replicas is None
                 else count_field(replicas, f"spec.mpiReplicaSpecs.{key}.replicas", minimum=0))
        source = f"MPIJob {name}, spec.mpiReplicaSpecs.{key}.template"
        pod_sets.append(_finish(PodSet(role, role, count, pod, source), accelerators))
    return EffectiveJob(
        kind="MPIJob",
        name=name,
        namespace=namespace,
        labels=dict(meta.get("labels") or {}),
        runtime={"name": "", "kind": "MPIJob"},
        mpi={
            "implementation": spec.get("mpiImplementation") or "OpenMPI",
            "numProcPerNode": (1 if spec.get("slotsPerWorker") is None
                               else count_field(spec["slotsPerWorker"], "spec.slotsPerWorker")),
            "runLauncherAsNode": bool(spec.get("runLauncherAsWorker")),
            "sshAuthMountPath": spec.get("sshAuthMountPath") or "/root/.ssh",
        },
        pod_sets=pod_sets,
        pod_selector={MPIJOB_NAME_LABEL: name},
    )
