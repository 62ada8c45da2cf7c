"""TrainJob and runtime objects for tests and benches: built from keyword options, or read from the
examples (examples/jobs, examples/runtimes) and moved to a namespace or runtime.

    trainjob("resnet", ns, nodes=2, gpus=4)                  # 2 nodes x 4 GPUs on mpi-openmpi
    trainjob("oom", ns, runtime="rt", runtime_kind="TrainingRuntime", pod_labels={"kwok.x-k8s.io/oom": "true"})
    example_job("over-quota.yaml")                           # examples/jobs/over-quota.yaml as is
    runtime("mpi-rt", ns)                                    # examples/runtimes/mpi-openmpi.yaml as a TrainingRuntime in ns
    mpi_runtime(node=pod_spec(gpus=8), launcher_as_node=False)  # a runtime shaped for one engine test
    bare_trainjob(numNodes=2)                                # only the trainer fields a test is about
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
GPU = "nvidia.com/gpu"
IMAGE = "quay.io/acme-ml/horovod-resnet:0.28"
COMMAND = ("mpirun", "python", "/opt/train.py")
PATCH_MANAGER = "trainjob-admission.test/tests"  # runtimePatches need a domain-prefixed manager
NODE_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # marks the replicated job that trains


def runtime_ref(name: str, kind: str | None = None) -> dict:
    """spec.runtimeRef: the name alone (Trainer defaults to a ClusterTrainingRuntime), or with kind and apiGroup."""
    return {"name": name} if kind is None else {"name": name, "kind": kind, "apiGroup": "trainer.kubeflow.org"}


def trainjob(name: str, namespace: str | None = None, *, runtime: str = "mpi-openmpi", runtime_kind: str | None = None,
             nodes: int = 4, gpus: int = 1, gpu_requests: bool = False, memory: str = "2Gi",
             image: str | None = IMAGE, command: tuple[str, ...] | None = COMMAND, suspend: bool = False,
             labels: dict | None = None, pod_labels: dict | None = None, pod_annotations: dict | None = None,
             privileged: bool = False, manager: str = PATCH_MANAGER) -> dict:
    """A TrainJob: ``nodes`` nodes, each requesting 1 CPU and ``memory`` and limited to ``gpus`` GPUs
    (no GPU limit at 0; ``gpu_requests`` requests them too).

    image/command: the trainer's (None leaves them out); labels: the TrainJob's own; pod_labels,
    pod_annotations: on the launcher and node pods, and privileged: a privileged node container,
    both through one runtimePatch by ``manager``; namespace None leaves metadata.namespace out.
    """
    resources: dict = {"requests": {"cpu": "1", "memory": memory}}
    if gpus:
        if gpu_requests:
            resources["requests"][GPU] = str(gpus)
        resources["limits"] = {GPU: str(gpus)}
    trainer: dict = {"numNodes": nodes}
    if image is not None:
        trainer["image"] = image
    if command is not None:
        trainer["command"] = list(command)
    trainer["resourcesPerNode"] = resources
    spec: dict = {"runtimeRef": runtime_ref(runtime, runtime_kind), "trainer": trainer}
    if suspend:
        spec["suspend"] = True
    patched = _pod_patches(pod_labels, pod_annotations, privileged)
    if patched:
        spec["runtimePatches"] = [{"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": patched}}}}]
    metadata: dict = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}


def _pod_patches(labels: dict | None, annotations: dict | None, privileged: bool) -> list[dict]:
    """replicatedJobs entries of a runtimePatch: pod metadata on node and launcher, privileged on node."""
    meta = {key: value for key, value in (("labels", labels), ("annotations", annotations)) if value}
    entries = []
    for replicated_job in ("node", "launcher"):
        template: dict = {"metadata": meta} if meta else {}
        if privileged and replicated_job == "node":
            template["spec"] = {"containers": [{"name": "node", "securityContext": {"privileged": True}}]}
        if template:
            entries.append({"name": replicated_job, "template": {"spec": {"template": template}}})
    return entries


def example_job(file: str, namespace: str | None = None, *, runtime: str | None = None,
                runtime_kind: str | None = None) -> dict:
    """examples/jobs/<file> as is, or moved to ``namespace`` and/or onto ``runtime`` (see runtime_ref)."""
    obj = yaml.safe_load((EXAMPLES / "jobs" / file).read_text())
    if namespace is not None:
        obj["metadata"]["namespace"] = namespace
    if runtime is not None:
        obj["spec"]["runtimeRef"] = runtime_ref(runtime, runtime_kind)
    return obj


def undated(job: dict) -> dict:
    """An example job without the deadline (and MPIJob cleanPodPolicy) the examples set, as a
    user who sets none submits it: what /mutate's default deadline and the duration check are for."""
    job["spec"].pop("activeDeadlineSeconds", None)
    if isinstance(job["spec"].get("runPolicy"), dict):
        job["spec"]["runPolicy"] = {}
    return job


def runtime(name: str | None = None, namespace: str | None = None, *, labels: dict | None = None,
            file: str = "mpi-openmpi.yaml") -> dict:
    """examples/runtimes/<file> (a ClusterTrainingRuntime) as is; given a name, renamed, with its
    metadata replaced by name, namespace and labels: a TrainingRuntime in ``namespace`` when one is
    given (cleaned up with it), else a ClusterTrainingRuntime."""
    obj = yaml.safe_load((EXAMPLES / "runtimes" / file).read_text())
    if name is None:
        return obj
    obj["kind"] = "TrainingRuntime" if namespace else "ClusterTrainingRuntime"
    obj["metadata"] = {"name": name}
    if namespace:
        obj["metadata"]["namespace"] = namespace
    if labels:
        obj["metadata"]["labels"] = dict(labels)
    return obj


def pod_spec(cpu: str = "1", memory: str = "2Gi", gpus: int = 0, secure: bool = True, name: str = "node",
             image: str = "quay.io/acme-ml/openmpi-runtime:4.1", **extra: Any) -> dict:
    """A one-container pod spec; ``secure`` makes it Pod Security "restricted" conformant."""
    container: dict = {"name": name, "image": image, "resources": {"requests": {"cpu": cpu, "memory": memory}}}
    if gpus:
        container["resources"]["limits"] = {"nvidia.com/gpu": gpus}
    spec: dict = {"containers": [container], **extra}
    if secure:
        spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
        container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return spec


def mpi_runtime(name: str = "rt", *, launcher_as_node: bool = True, num_proc: int | None = 1, mpi: bool = True,
                 node: dict | None = None, launcher: dict | None = None, ancestor: str = "launcher",
                 ml_num_nodes: int = 1, kind: str = "ClusterTrainingRuntime", namespace: str | None = None,
                 node_parallelism: int | None = None) -> dict:
    """An MPI runtime shaped like examples/runtimes/mpi-openmpi.yaml: replicated jobs node and
    launcher; ``ancestor`` names the one labelled as the trainer ancestor."""
    jobs = []
    for job_name, spec in (("node", node if node is not None else pod_spec()),
                           ("launcher", launcher if launcher is not None else pod_spec())):
        template: dict = {"spec": {"template": {"spec": copy.deepcopy(spec)}}}
        if job_name == ancestor:
            template["metadata"] = {"labels": {NODE_LABEL: "trainer"}}
        if job_name == "node" and node_parallelism is not None:
            template["spec"]["parallelism"] = node_parallelism
        jobs.append({"name": job_name, "template": template})
    ml_policy: dict = {"numNodes": ml_num_nodes}
    if mpi:
        ml_policy["mpi"] = {"mpiImplementation": "OpenMPI", "runLauncherAsNode": launcher_as_node,
                            "sshAuthMountPath": "/home/mpiuser/.ssh"}
        if num_proc is not None:
            ml_policy["mpi"]["numProcPerNode"] = num_proc
    metadata: dict = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind, "metadata": metadata,
            "spec": {"mlPolicy": ml_policy, "template": {"spec": {"replicatedJobs": jobs}}}}


def bare_trainjob(name: str = "job", namespace: str = "team-a", runtime: str = "rt", *,
                  runtime_kind: str | None = None, labels: dict | None = None,
                  runtime_patches: list | None = None, **trainer: Any) -> dict:
    """A TrainJob with exactly the ``spec.trainer`` fields given (none: no trainer at all), for
    tests of what the engine makes of each field; :func:`trainjob` is a complete, submittable one."""
    ref: dict = {"name": runtime}
    if runtime_kind:
        ref["kind"] = runtime_kind
    obj: dict = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                 "metadata": {"name": name, "namespace": namespace}, "spec": {"runtimeRef": ref}}
    if labels:
        obj["metadata"]["labels"] = dict(labels)
    if trainer:
        obj["spec"]["trainer"] = trainer
    if runtime_patches is not None:
        obj["spec"]["runtimePatches"] = runtime_patches
    return obj


def edit_binding(namespace: str, subject: str, kind: str = "User") -> dict:
    """A RoleBinding giving ``subject`` (a User or Group) the ClusterRole edit in ``namespace``,
    as a namespace's users get it."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{subject}-edit", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}]}
