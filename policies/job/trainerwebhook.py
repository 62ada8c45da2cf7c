"""What Kubeflow Trainer v2.3.0's own validating webhooks refuse in a TrainJob and its runtime, so
that a job Trainer would refuse is refused here with Trainer's reason, before it reaches Trainer.

Each rule names the upstream function it follows (github.com/kubeflow/trainer/v2@v2.3.0):

- pkg/webhooks/trainingruntime_webhook.go validateReplicatedJobs (both runtime webhooks): a
  replicated job labelled as the trainer or an initializer ancestor has replicas 1 and its
  container (node, dataset-initializer, model-initializer). A runtime it refuses cannot have been
  created while Trainer's webhook ran; a job naming one is refused here.
- pkg/runtime/core/clustertrainingruntime.go ValidateObjects: a warning for a ClusterTrainingRuntime
  labelled trainer.kubeflow.org/support=deprecated.
- pkg/runtime/framework/plugins/jobset/jobset.go Validate: initializers need their job, container
  and "initializer" volume mount; each runtimePatch's manager is a domain-prefixed path; patches
  change runtimePatches only while the job is or becomes suspended (checkRuntimePatchesImmutability;
  whether the JobSet still runs pods is not known here, so a suspended job's change is admitted).
  The patches' jobs, containers and env are policies/job/runtimepatch.py's.
- plugins/mpi/mpi.go, plugins/torch/torch.go (+ torchtune.go validateTorchTune),
  plugins/xgboost/xgboost.go, plugins/flux/flux.go, plugins/volcano/volcano.go Validate.

tests/unit/test_trainer_webhook.py replays Trainer's own test tables of these (transcribed into
tests/unit/fixtures/trainer-webhook-cases.yaml, each case naming its Go test).
"""
from __future__ import annotations

import re
from typing import Any, Callable

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # pkg/constants LabelTrainJobAncestor
REQUIRED_CONTAINER = {"trainer": "node", "model-initializer": "model-initializer",
                      "dataset-initializer": "dataset-initializer"}  # webhooks expectedContainerNames
SUPPORT_LABEL = "trainer.kubeflow.org/support"
DEPRECATION_POLICY = "https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy"
INITIALIZER_VOLUME = "initializer"  # plugins/jobset/constants VolumeNameInitializer
MPI_RESERVED = frozenset({"OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_keep_fqdn_hostnames",
                          "OMPI_MCA_orte_set_default_slots"})  # constants MPIReservedEnvNames
TORCH_RESERVED = frozenset({"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"})
XGBOOST_RESERVED = frozenset({"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"})
TORCHTUNE_ENTRYPOINT = ["tune", "run"]
TORCHTUNE_MODELS = frozenset({"llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B"})
TORCHTUNE_MULTI_NODE_MODEL = "llama3_3/70B"
TORCHTUNE_IMMUTABLE = frozenset({"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir", "tokenizer.merges_file"})
FLUX_INSTALLER = "flux-installer"
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"
# apimachinery validation: IsDNS1123Subdomain and the path part of IsDomainPrefixedPath (httpPathFmt)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HTTP_PATH = re.compile(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+")

Refusal = tuple[str, str]  # (field, what is wrong), as field.Error prints them


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _pod_spec(rjob: dict) -> dict:
    return _dict(_dict(_dict(_dict(rjob.get("template")).get("spec")).get("template")).get("spec"))


def _names(containers: Any) -> list[str]:
    return [c.get("name") for c in _list(containers) if isinstance(c, dict)]


def _ancestor(rjob: dict) -> Any:
    return _dict(_dict(_dict(rjob.get("template")).get("metadata")).get("labels")).get(ANCESTOR_LABEL)


def runtime_refusals(runtime: dict) -> list[Refusal]:
    """validateReplicatedJobs: what Trainer's runtime webhooks refuse in the runtime itself."""
    found = []
    jobs = _list(_dict(_dict(_dict(runtime.get("spec")).get("template")).get("spec")).get("replicatedJobs"))
    for index, rjob in enumerate(jobs):
        ancestor = _ancestor(_dict(rjob))
        if ancestor not in REQUIRED_CONTAINER:
            continue
        where = f"spec.template.spec.replicatedJobs[{index}]"
        if rjob.get("replicas", 1) != 1:  # the JobSet CRD defaults replicas to 1
            found.append((f"{where}.replicas", f"{rjob.get('replicas')}: always must be 1"))
        if REQUIRED_CONTAINER[ancestor] not in _names(_pod_spec(rjob).get("containers")):
            found.append((f"{where}.template.spec.template.spec.containers",
                          f"must contain the required container for the ancestor: {ancestor}"))
    return found


def warnings(runtime: dict) -> list[str]:
    """ClusterTrainingRuntime ValidateObjects: the deprecated runtime's warning."""
    meta = _dict(runtime.get("metadata"))
    if runtime.get("kind") != "ClusterTrainingRuntime" or _dict(meta.get("labels")).get(SUPPORT_LABEL) != "deprecated":
        return []
    return [f'Referenced ClusterTrainingRuntime "{meta.get("name")}" is deprecated and will be removed in a future '
            f"release of Kubeflow Trainer. See runtime deprecation policy: {DEPRECATION_POLICY}"]


def trainjob_refusals(trainjob: dict, runtime: dict, jobset_spec: dict,
                      gpus_per_node: Callable[[], int]) -> list[Refusal]:
    """What the plugins' Validate refuse in a TrainJob on ``runtime`` whose JobSet spec, with the
    job's runtimePatches merged, is ``jobset_spec`` (newRuntimeInfo); ``gpus_per_node`` counts
    them as GetNumGPUPerNode does, asked only by torchtune's checks."""
    spec = _dict(trainjob.get("spec"))
    ml_policy = _dict(runtime.get("spec")).get("mlPolicy")
    jobs = {str(rjob.get("name")): rjob for rjob in _list(jobset_spec.get("replicatedJobs")) if isinstance(rjob, dict)}
    found = _initializers(spec, jobs) + _managers(spec)
    if isinstance(ml_policy, dict):
        trainer = _dict(spec.get("trainer"))
        found += _mpi(trainer, _dict(ml_policy.get("mpi")), jobs) if ml_policy.get("mpi") is not None else []
        if ml_policy.get("torch") is not None:
            found += _torch(spec, _dict(ml_policy["torch"]), jobs, gpus_per_node)
        if ml_policy.get("xgboost") is not None:
            found += _reserved_each(trainer, XGBOOST_RESERVED, "is reserved for the XGBoost runtime")
        if ml_policy.get("flux") is not None:
            found += _flux(trainer, _dict(ml_policy["flux"]), jobs)
    if _dict(_dict(runtime.get("spec")).get("podGroupPolicy")).get("volcano") is not None:
        found += _volcano(spec, runtime, jobset_spec)
    return found


def _initializers(spec: dict, jobs: dict[str, dict]) -> list[Refusal]:
    """jobset.go Validate: spec.initializer.dataset / .model need their job, container and mount."""
    found = []
    initializer = _dict(spec.get("initializer"))
    for key, job, config in (("dataset", "dataset-initializer", "datasetConfig"), ("model", "model-initializer", "modelConfig")):
        if initializer.get(key) is None:
            continue
        rjob = jobs.get(job)
        pod = _pod_spec(rjob) if rjob is not None else {}
        if rjob is None:
            found.append(("spec.runtimeRef", f"must have {job} job when trainJob is configured with input {config}"))
        elif job not in _names(pod.get("initContainers")) + _names(pod.get("containers")):
            found.append(("spec.runtimeRef", f"must have container with name - {job} in the {job} job"))
        elif not any(INITIALIZER_VOLUME in [m.get("name") for m in _list(c.get("volumeMounts")) if isinstance(m, dict)]
                     for c in _list(pod.get("containers")) if isinstance(c, dict) and c.get("name") == job):
            found.append(("spec.runtimeRef", f"must have volumeMount with name - {INITIALIZER_VOLUME} in container {job} "
                                             f"of the {job} job"))
    return found


def _managers(spec: dict) -> list[Refusal]:
    """jobset.go Validate: IsDomainPrefixedPath(spec.runtimePatches.manager)."""
    found = []
    for patch in _list(spec.get("runtimePatches")):
        if not isinstance(patch, dict):
            continue  # not an object: the API server's schema refuses it (policies/k8s/fieldvalidation.py)
        manager = patch.get("manager")
        if not isinstance(manager, str) or not manager:
            found.append(("spec.runtimePatches.manager", "Required value"))
            continue
        host, _, path = manager.partition("/")
        if not host or not path:
            found.append(("spec.runtimePatches.manager",
                          f'"{manager}": must be a domain-prefixed path (such as "acme.io/foo")'))
            continue
        if len(host) > 253 or not _DNS_SUBDOMAIN.fullmatch(host):
            found.append(("spec.runtimePatches.manager", f'"{host}": a lowercase RFC 1123 subdomain must consist of '
                                                         "lower case alphanumeric characters, '-' or '.'"))
        if not _HTTP_PATH.fullmatch(path):
            found.append(("spec.runtimePatches.manager", f'"{path}": Invalid path'))
    return found


def _env_names(trainer: dict) -> list[str]:
    return [str(e.get("name")) for e in _list(trainer.get("env")) if isinstance(e, dict)]


def _reserved(trainer: dict, reserved: frozenset[str]) -> list[Refusal]:
    """mpi.go and torch.go: every reserved name, sorted, in one error on spec.trainer.env."""
    names = sorted({n for n in _env_names(trainer) if n in reserved})
    return [("spec.trainer.env", f"must not have reserved envs, invalid envs configured: [{' '.join(names)}]")] if names else []


def _reserved_each(trainer: dict, reserved: frozenset[str], detail: str) -> list[Refusal]:
    """xgboost.go: one Forbidden per reserved entry, by index."""
    return [(f"spec.trainer.env[{i}]", f"Forbidden: {name} {detail}")
            for i, name in enumerate(_env_names(trainer)) if name in reserved]


def _mpi(trainer: dict, mpi: dict, jobs: dict[str, dict]) -> list[Refusal]:
    found = []
    num_nodes = trainer.get("numNodes")
    if num_nodes is not None and isinstance(num_nodes, int) and num_nodes >= 2 and mpi.get("runLauncherAsNode") is True \
            and ("launcher" not in jobs or "node" not in jobs):
        found.append(("spec.trainer.numNodes", "must have 1 when MPI trainingRuntime with enabled runLauncherAsNode "
                                               "does not have either launcher and node"))
    return found + _reserved(trainer, MPI_RESERVED)


def _torch(spec: dict, torch: dict, jobs: dict[str, dict], gpus_per_node: Callable[[], int]) -> list[Refusal]:
    found = []
    for target in _list(_dict(torch.get("envInjection")).get("targets")):  # validateEnvInjectionTargets
        target = _dict(target)
        pod = _pod_spec(jobs.get(str(target.get("jobName")), {}))
        known = _names(pod.get("containers")) + _names(pod.get("initContainers"))
        for container in _list(target.get("containerNames")):
            if container not in known:
                found.append(("spec.runtimeRef", f'envInjection target podSet "{target.get("jobName")}" container '
                                                 f'"{container}" not found in runtime template'))
    if not isinstance(spec.get("trainer"), dict):
        return found
    trainer = spec["trainer"]
    found += _reserved(trainer, TORCH_RESERVED)
    if trainer.get("command") == TORCHTUNE_ENTRYPOINT:
        found += _torchtune(spec, trainer, gpus_per_node)
    return found


def _torchtune(spec: dict, trainer: dict, gpus_per_node: Callable[[], int]) -> list[Refusal]:
    """torchtune.go validateTorchTune, with getRecipeAndConfig's choice of config."""
    found = []
    runtime_name = str(_dict(spec.get("runtimeRef")).get("name", ""))
    fields = runtime_name.split("-")
    model = f"{fields[1].replace('.', '_')}/{fields[2].upper()}" if len(fields) == 3 else ""  # getModelFromRuntimeRef
    if model not in TORCHTUNE_MODELS:
        found.append(("spec.runtimeRef.name", f"must have a supported pretrained model, invalid model configured: {model}"))
    num_nodes = trainer.get("numNodes") if isinstance(trainer.get("numNodes"), int) else 1
    if num_nodes > 1 and model != TORCHTUNE_MULTI_NODE_MODEL:
        found.append(("spec.trainer.numNodes", f"must be 1 for {model} model"))
    args = [str(a) for a in _list(trainer.get("args"))]
    qlora = _bool_arg(args, "model.quantize_base") and not _bool_arg(args, "model.use_dora")
    lora = any("model.lora_attn_modules" in a for a in args)
    procs = trainer.get("numProcPerNode")
    single = num_nodes == 1 and (procs == 1 or gpus_per_node() == 1)
    config = ("_qlora_single_device" if single and qlora else "" if single
              else "_qlora" if num_nodes == 1 and qlora else "")
    if "_qlora" in config:
        if model == "qwen2_5/1.5B":
            found.append(("spec.runtimeRef.name", f"QLoRA is not supported for {model} model"))
        if config != "_qlora_single_device" and model in ("llama3_2/1B", "llama3_2/3B"):
            found += [("spec.trainer.numProcPerNode", f"must be auto or 1 for {model} model when using QLoRA"),
                      ("spec.trainer.resourcesPerNode", f"must have gpu resource with value 1 for {model} model when "
                                                        "using QLoRA")]
    if num_nodes > 1 and (lora or qlora):
        found.append(("spec.trainer.numNodes", "LoRA fine-tuning is not supported for multi-node training in TorchTune"))
    for index, arg in enumerate(args):
        key = arg.split("=", 1)[0]
        if key in TORCHTUNE_IMMUTABLE:
            found.append((f"spec.trainer.args[{index}]",
                          f'must not set immutable config "{key}" in trainer args; it is managed by the runtime'))
    return found


def _bool_arg(args: list[str], item: str) -> bool:
    """torchtune.go isBoolArgEnabled: NAME=true (any case) whose name contains ``item``."""
    return any(item in name and value.strip().lower() == "true"
               for name, sep, value in (a.partition("=") for a in args) if sep)


def _flux(trainer: dict, flux: dict, jobs: dict[str, dict]) -> list[Refusal]:
    found = []
    procs = trainer.get("numProcPerNode", flux.get("numProcPerNode"))
    if isinstance(procs, int) and procs < 1:
        found.append(("spec.trainer.numProcPerNode", f"{procs}: must be greater than or equal to 1 for Flux TrainJob"))
    if FLUX_INSTALLER in _names(_pod_spec(jobs.get("node", {})).get("initContainers")):
        found.append(("spec.trainer.initContainers", f"{FLUX_INSTALLER}: InitContainer 'flux-installer' is reserved"))
    return found


def _volcano(spec: dict, runtime: dict, jobset_spec: dict) -> list[Refusal]:
    """volcano.go Validate: a queue annotation, where set on the JobSet template (or by a
    runtimePatch), is not empty. Its PriorityClass check is the Priority admission plugin's
    (policies/k8s/podvalidation.py priority_refusals), which refuses the same pods."""
    annotations = dict(_dict(_dict(_dict(_dict(runtime.get("spec")).get("template")).get("metadata")).get("annotations")))
    for patch in _list(spec.get("runtimePatches")):
        template = _dict(_dict(_dict(patch).get("trainingRuntimeSpec")).get("template"))
        annotations.update(_dict(_dict(template.get("metadata")).get("annotations")))
    if annotations.get(VOLCANO_QUEUE) == "":
        return [(f"spec.annotations[{VOLCANO_QUEUE}]", "Volcano queue name must not be empty")]
    return []


def update_refusals(old: dict, new: dict) -> list[Refusal]:
    """jobset.go checkRuntimePatchesImmutability: runtimePatches change only while the job is
    suspended before or after the update."""
    old_spec, new_spec = _dict(old.get("spec")), _dict(new.get("spec"))
    if _without_time(old_spec.get("runtimePatches")) == _without_time(new_spec.get("runtimePatches")):
        return []
    if old_spec.get("suspend") is True or new_spec.get("suspend") is True:
        return []
    return [("spec.runtimePatches", "Forbidden: RuntimePatches can only be modified when the TrainJob is suspended "
                                    "before or after the update")]


def _without_time(patches: Any) -> Any:
    """Trainer's defaulter keeps a patch's time when nothing else of it changed, so the time alone
    never differs between an object and its update (TrainJobDefaulter)."""
    return patches if not isinstance(patches, list) else [
        {k: v for k, v in p.items() if k != "time"} if isinstance(p, dict) else p for p in patches]


def message(refused: list[Refusal], what: str = "the TrainJob") -> str:
    """One job-model message naming every refusal, as the webhook's aggregate error lists them."""
    return f"Trainer's webhook refuses {what}: " + "; ".join(f"{field}: {detail}" for field, detail in refused)
