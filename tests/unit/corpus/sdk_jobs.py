"""Writes jobs/sdk-*.yaml: TrainJobs exactly as the Kubeflow SDK (``kubeflow`` on PyPI, the version
pyproject.toml pins) builds them for ``TrainerClient().train(...)``, offline.

The SDK's own code builds each one: the runtime is read from Trainer's stock manifest in the Go
module cache and turned into the SDK's ``Runtime`` by ``KubernetesBackend.__get_runtime_from_cr``,
the spec by ``KubernetesBackend._get_trainjob_spec``, the options (``RuntimePatch``, ``Labels``) by
their own ``__call__``, and the object as ``train()`` assembles it before it calls the API.
Only the name is fixed (``train()`` picks a random one). Regenerate after a version bump:

    .venv/bin/python -m tests.unit.corpus.sdk_jobs
"""
from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import yaml
from kubeflow.trainer import options
from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend
from kubeflow.trainer.constants import constants
from kubeflow.trainer.types import types
from kubeflow_trainer_api import models

from tests.support import upstream

HERE = Path(__file__).resolve().parent
RUNTIMES = {
    "torch-distributed": "manifests/base/runtimes/torch_distributed.yaml",
    "deepspeed-distributed": "manifests/base/runtimes/deepspeed_distributed.yaml",
    "torchtune-llama3.2-1b": "manifests/base/runtimes/torchtune/llama3_2/llama3_2_1B.yaml",
}


def train_func():
    """What a data scientist passes as CustomTrainer(func=...): its source becomes the command."""
    import torch.distributed as dist

    dist.init_process_group()
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}")


def _runtime(name: str) -> types.Runtime:
    (obj,) = upstream.objects({"module": "trainer", "path": RUNTIMES[name]}, HERE)
    cr = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(obj)
    backend = object.__new__(KubernetesBackend)  # no cluster: only the pure builders are called
    return backend._KubernetesBackend__get_runtime_from_cr(cr)


def build(name: str, runtime: str, trainer, initializer=None, train_options: tuple = ()) -> dict:
    """train()'s object for these arguments, before create_namespaced_custom_object."""
    backend = object.__new__(KubernetesBackend)
    job_spec: dict = {}
    for option in train_options:
        option(job_spec, trainer, backend)
    spec = backend._get_trainjob_spec(runtime=_runtime(runtime), initializer=initializer, trainer=trainer,
                                      runtime_patches=(job_spec.get("spec") or {}).get("runtimePatches"))
    labels = (job_spec.get("metadata") or {}).get("labels")
    job = models.TrainerV1alpha1TrainJob(
        apiVersion=constants.API_VERSION, kind=constants.TRAINJOB_KIND,
        metadata=models.IoK8sApimachineryPkgApisMetaV1ObjectMeta(name=name, labels=labels), spec=spec)
    return job.to_dict()


def _pvc_patch(claim: str) -> options.RuntimePatch:
    """The RuntimePatch of opendatahub-io/distributed-workloads tests/trainer/resources/mnist.ipynb:
    a shared PVC mounted on the node container."""
    return options.RuntimePatch(training_runtime_spec=options.TrainingRuntimeSpecPatch(
        template=options.JobSetTemplatePatch(spec=options.JobSetSpecPatch(replicated_jobs=[
            options.ReplicatedJobPatch(name="node", template=options.JobTemplatePatch(
                spec=options.JobSpecPatch(template=options.PodTemplatePatch(spec=options.PodSpecPatch(
                    volumes=[{"name": "shared", "persistentVolumeClaim": {"claimName": claim}}],
                    containers=[options.ContainerPatch(
                        name="node", volume_mounts=[{"name": "shared", "mountPath": "/mnt/shared"}])])))))]))))


def custom(runtime: str, num_nodes: int, resources: dict) -> tuple[str, dict]:
    """(the call, train()'s arguments) for a CustomTrainer on ``runtime``."""
    call = (f"train(runtime={runtime!r}, trainer=CustomTrainer(func, num_nodes={num_nodes}, "
            f"resources_per_node={resources!r}))")
    trainer = types.CustomTrainer(func=train_func, num_nodes=num_nodes, resources_per_node=resources)
    return call, dict(runtime=runtime, trainer=trainer)


# name -> (the call, train()'s arguments)
JOBS = {
    "sdk-torch-cpu": custom("torch-distributed", 2, {"cpu": 2, "memory": "8Gi"}),
    "sdk-torch-gpu": custom("torch-distributed", 4, {"gpu": 2, "cpu": 8, "memory": "32Gi"}),
    "sdk-torch-gpu-fills-quota": custom("torch-distributed", 8, {"gpu": 8, "cpu": 32, "memory": "256Gi"}),
    "sdk-torch-gpu-over-quota": custom("torch-distributed", 9, {"gpu": 8, "cpu": 32, "memory": "256Gi"}),
    "sdk-torch-gpu-16-per-node": custom("torch-distributed", 2, {"gpu": 16}),
    "sdk-torch-memory-only": custom("torch-distributed", 3, {"memory": "16Gi"}),
    "sdk-torch-mnist-odh": (
        "train(runtime='torch-distributed', trainer=CustomTrainer(func, num_nodes=2, resources_per_node="
        "{'cpu': 2, 'memory': '8Gi'}), options=[RuntimePatch(... PVC 'shared' on node ...), "
        "Labels({'kueue.x-k8s.io/queue-name': 'team-queue'})]) as in opendatahub-io/distributed-workloads "
        "tests/trainer/resources/mnist.ipynb",
        dict(custom("torch-distributed", 2, {"cpu": 2, "memory": "8Gi"})[1],
             train_options=(_pvc_patch("shared-data"),
                            options.Labels(labels={"kueue.x-k8s.io/queue-name": "team-queue"})))),
    "sdk-deepspeed-cpu": custom("deepspeed-distributed", 2, {"cpu": 2, "memory": "4Gi"}),
    "sdk-deepspeed-gpu": custom("deepspeed-distributed", 3, {"gpu": 1, "cpu": 4, "memory": "16Gi"}),
    "sdk-torchtune-llama": (
        "train(runtime='torchtune-llama3.2-1b', initializer=Initializer(dataset=HuggingFaceDatasetInitializer("
        "'hf://tatsu-lab/alpaca'), model=HuggingFaceModelInitializer('hf://meta-llama/Llama-3.2-1B-Instruct')), "
        "trainer=BuiltinTrainer(TorchTuneConfig(num_nodes=1, resources_per_node={'gpu': 2})))",
        dict(runtime="torchtune-llama3.2-1b",
             initializer=types.Initializer(
                 dataset=types.HuggingFaceDatasetInitializer(storage_uri="hf://tatsu-lab/alpaca"),
                 model=types.HuggingFaceModelInitializer(storage_uri="hf://meta-llama/Llama-3.2-1B-Instruct")),
             trainer=types.BuiltinTrainer(config=types.TorchTuneConfig(num_nodes=1,
                                                                       resources_per_node={"gpu": 2})))),
}


def main() -> None:
    sdk = f"kubeflow=={version('kubeflow')}, kubeflow-trainer-api=={version('kubeflow-trainer-api')}"
    for name, (call, kwargs) in JOBS.items():
        obj = build(name, **kwargs)
        header = (f"# source: the Kubeflow SDK ({sdk}), generated offline by tests/unit/corpus/sdk_jobs.py\n"
                  f"# call: TrainerClient().{call}\n# runtime from {upstream.version('trainer')} "
                  f"{RUNTIMES[kwargs['runtime']]}\n")
        (HERE / "jobs" / f"{name}.yaml").write_text(header + yaml.safe_dump(obj, sort_keys=False))


if __name__ == "__main__":
    main()
