"""TrainJob and runtime objects for tests and benches: built from keyword options, or read from the
examples (examples/jobs, examples/runtimes) and moved to a namespace or runtime.

    trainjob("resnet", ns, nodes=2, gpus=4)                  # 2 nodes x 4 GPUs on mpi-openmpi
    trainjob("oom", ns, runtime="rt", runtime_kind="TrainingRuntime", pod_labels={"kwok.x-k8s.io/oom": "true"})
    example_job("over-quota.yaml")                           # examples/jobs/over-quota.yaml as is
    runtime("mpi-rt", ns)                                    # examples/runtimes/mpi-openmpi.yaml as a TrainingRuntime in ns
"""
from __future__ import annotations

from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
GPU = "nvidia.com/gpu"
IMAGE = "quay.io/acme-ml/horovod-resnet:0.28"
COMMAND = ("mpirun", "python", "/opt/train.py")
PATCH_MANAGER = "trainjob-admission.test/tests"  # runtimePatches need a domain-prefixed manager


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
