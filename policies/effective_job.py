"""The effective job: what a TrainJob (or legacy MPIJob) will run once the Trainer reconciles it.

Policies are written against this model (CEL variable ``job``) instead of walking the runtime
by hand. The TrainJob overrides are applied in the order and with the rules of Kubeflow Trainer
v2.3.0; each step cites the upstream file it mirrors.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import limitranger, redaction, smp
from .resources import DEFAULT_ACCELERATORS, QuantityError, is_accelerator, numbers
from .state import TRAINER_GROUP, ClusterState

MPIJOB_GROUP = "kubeflow.org"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # pkg/constants/constants.go
ANCESTOR_TRAINER = "trainer"
LAUNCHER = "launcher"  # replicated job names the MPI plugin keys on (pkg/constants)
NODE = "node"  # both the worker replicated job and the trainer container are named "node"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # jobset v0.12 api/jobset/v1alpha2
# mpi-operator v2beta1 labels its pods with these (pkg/apis/kubeflow/v2beta1/constants.go).
MPIJOB_NAME_LABEL = "training.kubeflow.org/job-name"
INT32_MAX = 2**31 - 1  # the CRDs' counts are int32
MAX_REPLICATED_JOBS = 32  # after runtimePatches; real runtimes have 2-4 (initializers, launcher, node)
_JSON_TYPES = {str: "string", bool: "boolean", float: "number", list: "list", dict: "mapping"}


class JobModelError(ValueError):
    """The object cannot be turned into an effective job (its runtime is missing, a value is bad)."""


class RuntimeNotFound(JobModelError):
    """The runtime the TrainJob names is not in the state: offline, state the reviewer left out."""

    def __init__(self, message: str, missing: str):
        super().__init__(message)
        self.missing = missing  # "no ClusterTrainingRuntime 'x'", for Decision.unchecked


@dataclass
class PodSet:
    """One replicated job: ``count`` identical pods built from ``pod``."""

    name: str
    role: str  # launcher | worker | other
    count: int
    pod: dict  # {"metadata": {...}, "spec": {...}} after all overrides
    source: str  # where the pod template lives, for field paths in messages
    # Fields of the "node" container Trainer copies from spec.trainer: "image" (and command,
    # args), "resources" (resourcesPerNode). Messages name spec.trainer for these, else the template.
    from_trainer: frozenset[str] = frozenset()
    requests: dict[str, int] = field(default_factory=dict)  # per pod, cpu in millicores
    limits: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)  # per pod, accelerator name -> count

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

    def role(self, role: str) -> PodSet | None:
        return next((ps for ps in self.pod_sets if ps.role == role), None)

    @property
    def launcher(self) -> PodSet | None:
        return self.role("launcher")

    @property
    def workers(self) -> PodSet | None:
        return self.role("worker")

    @property
    def num_nodes(self) -> int:
        workers = self.workers.count if self.workers else 0
        return workers + (1 if self.mpi.get("runLauncherAsNode") and self.launcher else 0)

    @property
    def totals(self) -> dict[str, Any]:
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
            "workers": workers.count if workers else 0,
            "podSets": [ps.as_cel() for ps in self.pod_sets],
            "images": sorted({image for ps in self.pod_sets for image in images_of(ps.pod.get("spec", {}))}),
            "totals": self.totals,
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


def pod_resources(pod_spec: dict) -> tuple[dict[str, int], dict[str, int]]:
    """Per-pod requests and limits as the scheduler and quota count them.

    Effective request = max(sum of app containers + restartable (sidecar) init containers,
    each init container plus the sidecars started before it), as PodRequests/PodLimits in
    k8s.io/component-helpers/resource/helpers.go; a request left out defaults to the limit (API
    defaulting).
    """

    def container_numbers(container: dict, key: str) -> tuple[dict[str, int], dict[str, int]]:
        resources = container.get("resources") or {}
        field = f"spec.{key}[{container.get('name')}].resources"
        limits = numbers(resources.get("limits"), f"{field}.limits")
        requests = {**limits, **numbers(resources.get("requests"), f"{field}.requests")}
        return requests, limits

    def add(into: dict[str, int], amounts: dict[str, int]) -> None:
        for name, amount in amounts.items():
            into[name] = into.get(name, 0) + amount

    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        container_requests, container_limits = container_numbers(container, "containers")
        add(requests, container_requests)
        add(limits, container_limits)
    # Sidecars keep running while later init containers run, so each init container's use
    # includes the sidecars started before it.
    sidecar_requests: dict[str, int] = {}
    sidecar_limits: dict[str, int] = {}
    init_peak_requests: dict[str, int] = {}
    init_peak_limits: dict[str, int] = {}
    for init in pod_spec.get("initContainers") or []:
        init_requests, init_limits = container_numbers(init, "initContainers")
        if init.get("restartPolicy") == "Always":
            add(requests, init_requests)
            add(limits, init_limits)
            add(sidecar_requests, init_requests)
            add(sidecar_limits, init_limits)
            use_requests, use_limits = dict(sidecar_requests), dict(sidecar_limits)
        else:
            use_requests, use_limits = dict(init_requests), dict(init_limits)
            add(use_requests, sidecar_requests)
            add(use_limits, sidecar_limits)
        for peak, use in ((init_peak_requests, use_requests), (init_peak_limits, use_limits)):
            for name, amount in use.items():
                peak[name] = max(peak.get(name, 0), amount)
    for total, peak in ((requests, init_peak_requests), (limits, init_peak_limits)):
        for name, amount in peak.items():
            total[name] = max(total.get(name, 0), amount)
    for name, amount in numbers(pod_spec.get("overhead"), "spec.overhead").items():
        requests[name] = requests.get(name, 0) + amount
    return requests, limits


def _finish(pod_set: PodSet, accelerators: tuple[str, ...]) -> PodSet:
    try:
        pod_set.requests, pod_set.limits = pod_resources(pod_set.pod.get("spec") or {})
    except QuantityError as exc:
        raise JobModelError(f"{pod_set.source}: {exc}") from exc
    pod_set.gpus = {name: amount for name, amount in pod_set.requests.items() if is_accelerator(name, accelerators)}
    return pod_set


def _container(pod_spec: dict, name: str) -> dict | None:
    return next((c for c in pod_spec.get("containers") or [] if c.get("name") == name), None)


def _upsert_env(container: dict, env: list[dict]) -> None:
    container["env"] = smp.merge(container.get("env") or [], env, "env")


def build(obj: dict, state: ClusterState, accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS) -> EffectiveJob:
    """Dispatch on apiVersion/kind; raises JobModelError with a message for the submitter.
    ``accelerators``: the resource patterns counted as GPUs (PodSet.gpus, totals["gpus"])."""
    kind = obj.get("kind")
    group = str(obj.get("apiVersion", "")).split("/")[0]
    if kind == "TrainJob" and group == TRAINER_GROUP:
        return _with_limit_ranges(from_trainjob(obj, state, accelerators), state, accelerators)
    if kind == "MPIJob" and group == MPIJOB_GROUP:
        return _with_limit_ranges(from_mpijob(obj, accelerators), state, accelerators)
    raise JobModelError(f"unsupported object {obj.get('apiVersion')}/{kind}: expected trainer.kubeflow.org TrainJob or kubeflow.org MPIJob")


def _with_limit_ranges(job: EffectiveJob, state: ClusterState, accelerators: tuple[str, ...]) -> EffectiveJob:
    """Each pod as the API server will create it in the job's namespace: requests defaulted from
    limits, then the LimitRange defaults (policies/limitranger.py), counted again. Nothing to do
    (and nothing spent) in a namespace without a LimitRange."""
    limit_ranges = state.namespace_limit_ranges(job.namespace)
    if limit_ranges:
        defaults = limitranger.container_defaults(limit_ranges)
        for pod_set in job.pod_sets:
            limitranger.apply(pod_set.pod["spec"], defaults)
            _finish(pod_set, accelerators)
    return job


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
    ml_policy = runtime_spec.get("mlPolicy") or {}
    mpi_policy = ml_policy.get("mpi")
    trainer = spec.get("trainer") or {}
    run_launcher_as_node = bool(mpi_policy and mpi_policy.get("runLauncherAsNode"))
    per_node = trainer.get("resourcesPerNode")
    # Read before it merges into the runtime's pods, so that a bad quantity is reported at its field.
    per_node_gpus = _gpus_in(per_node) if per_node else None
    requested = (count_field(trainer["numNodes"], "spec.trainer.numNodes") if trainer.get("numNodes") is not None
                 else None)

    # 1. runtimePatches merge into the JobSet spec in list order (core/trainingruntime.go, mergeRuntimePatches).
    #    Read only (merge copies what it changes); each pod below is cloned before it is changed.
    jobset_spec = (runtime_spec.get("template") or {}).get("spec") or {}
    for patch in spec.get("runtimePatches") or []:
        patch_spec = (((patch or {}).get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        if patch_spec:
            jobset_spec = smp.merge(jobset_spec, patch_spec)
    replicated_jobs = jobset_spec.get("replicatedJobs") or []
    if len(replicated_jobs) > MAX_REPLICATED_JOBS:
        # Bounds the work below (each job's pod is cloned, and trainer.env copied into each
        # trainer job): a few patches of many small jobs must not multiply into gigabytes.
        raise JobModelError(f"the runtime with spec.runtimePatches has {len(replicated_jobs)} replicated jobs, "
                            f"more than {MAX_REPLICATED_JOBS}: training runtimes have a handful (initializers, "
                            "launcher, node); remove the extra replicatedJobs from spec.runtimePatches")

    pod_sets: list[PodSet] = []
    for rjob in replicated_jobs:
        rjob_name = rjob.get("name", "")
        job_template = rjob.get("template") or {}
        ancestor = ((job_template.get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)
        is_trainer = ancestor == ANCESTOR_TRAINER and bool(ml_policy)
        pod = smp.clone((job_template.get("spec") or {}).get("template") or {})
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
        #    "node" job when the MPI launcher runs as a node (newRuntimeInfo + MergeResourceRequirements).
        node_container = _container(pod_spec, NODE)
        from_trainer: set[str] = set()
        if node_container is not None and (is_trainer or (run_launcher_as_node and rjob_name == NODE)):
            from_trainer.add("resources")
            if trainer.get("resourcesPerNode"):
                node_container["resources"] = smp.merge(node_container.get("resources") or {}, trainer["resourcesPerNode"])

        # 4. numNodes: the MPI plugin sets the "node" job (minus one when the launcher is a node,
        #    plugins/mpi/mpi.go EnforceMLPolicy); other policies set the trainer ancestor (plugins/plainml).
        if requested is not None:
            if mpi_policy is not None and rjob_name == NODE:
                count = max(requested - 1, 1) if run_launcher_as_node else requested
            elif mpi_policy is None and ancestor == ANCESTOR_TRAINER:
                count = requested

        # 5. image/command/args go to the trainer ancestor's "node" container, env also to the
        #    launcher-as-node "node" job (plugins/jobset/builder.go, Trainer); replicas become 1.
        replicas = 1 if rjob.get("replicas") is None else count_field(rjob["replicas"], f"{where}.replicas", minimum=0)
        if ancestor == ANCESTOR_TRAINER:
            replicas = 1
            if node_container is not None:
                from_trainer.add("image")
                for key in ("image", "command", "args"):
                    if trainer.get(key) is not None:
                        node_container[key] = smp.clone(trainer[key])
        if node_container is not None and trainer.get("env") and (
            ancestor == ANCESTOR_TRAINER or (run_launcher_as_node and rjob_name == NODE)
        ):
            _upsert_env(node_container, trainer["env"])

        # JobSet labels every pod with the JobSet name, which is the TrainJob's name.
        pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), JOBSET_NAME_LABEL: name}
        role = "launcher" if rjob_name == LAUNCHER else "worker" if rjob_name == NODE else "other"
        if mpi_policy is None and ancestor == ANCESTOR_TRAINER:
            role = "worker"
        source = f"{runtime.get('kind')} {runtime.get('metadata', {}).get('name')}, replicatedJobs[{rjob_name}] pod template"
        pod_sets.append(_finish(PodSet(rjob_name, role, replicas * count, pod, source, frozenset(from_trainer)),
                                accelerators))

    mpi: dict[str, Any] = {}
    if mpi_policy is not None:
        # 6. Slots: numProcPerNode from the TrainJob, else GPUs per node when the runtime says 1 (mpi.go).
        slots = int(mpi_policy.get("numProcPerNode") or 1)
        if trainer.get("numProcPerNode") is not None:
            slots = count_field(trainer["numProcPerNode"], "spec.trainer.numProcPerNode")
        elif slots == 1:
            node_set = next((ps for ps in pod_sets if ps.role == "worker"), None)
            gpus = per_node_gpus if per_node_gpus is not None else (
                _trainer_gpus(node_set.requests, node_set.limits) if node_set else 0)
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
    )


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


def _gpus_in(resources: dict) -> int:
    try:
        requests = numbers(resources.get("requests"), "spec.trainer.resourcesPerNode.requests")
        limits = numbers(resources.get("limits"), "spec.trainer.resourcesPerNode.limits")
    except QuantityError as exc:
        raise JobModelError(str(exc)) from exc
    return _trainer_gpus(requests, limits)


def _trainer_gpus(requests: dict[str, int], limits: dict[str, int]) -> int:
    """GPUs per node as Trainer's MPI plugin counts them for slots: resources whose name contains
    "gpu" (runtime.GetNumGPUPerNode), not the service's accelerator families (resources.py)."""
    found = sum(v for k, v in requests.items() if "gpu" in k.lower())
    return found or sum(v for k, v in limits.items() if "gpu" in k.lower())


def from_mpijob(mpijob: dict, accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS) -> EffectiveJob:
    """Legacy kubeflow.org/v2beta1 MPIJob: Launcher and Worker replica specs, slotsPerWorker."""
    meta = mpijob.get("metadata") or {}
    name, namespace = meta.get("name") or "", meta.get("namespace", "")
    spec = mpijob.get("spec") or {}
    replica_specs = spec.get("mpiReplicaSpecs") or {}
    pod_sets = []
    for key, role in (("Launcher", "launcher"), ("Worker", "worker")):
        replica = replica_specs.get(key)
        if not replica:
            continue
        pod = smp.clone(replica.get("template") or {})
        pod.setdefault("metadata", {})
        pod.setdefault("spec", {})
        pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), MPIJOB_NAME_LABEL: name}
        replicas = replica.get("replicas")
        count = 1 if replicas is None else count_field(replicas, f"spec.mpiReplicaSpecs.{key}.replicas", minimum=0)
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
