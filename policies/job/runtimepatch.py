"""spec.runtimePatches as Trainer v2.2 and v2.3 apply them: only the fields their CRD keeps, only onto
replicated jobs and containers the runtime has.

The TrainJob CRD's schema for a patch (RuntimePatch .. ContainerPatch in
pkg/apis/trainer/v1alpha1/trainjob_types.go) exposes a few pod fields; the API server prunes every
other field before anyone reads the object, so a patch cannot change resources, images, replicas or
parallelism. v2.2's schema lacks the pods' terminationGracePeriodSeconds (policies/k8s/versions.py
RuntimePatchTerminationGracePeriod). Offline ``review`` reads the file as written, so it prunes the same way here; the
webhook then sees what the API server stored. A patch can only change what the runtime has: one
naming another replicated job or container would add one with no image, which the API server refuses
when Trainer creates the JobSet (plugins/jobset/jobset.go Validate means to refuse it earlier).
"""
from __future__ import annotations

from typing import Any

from .. import PolicyError
from ..k8s.versions import NEWEST, Versions

# Field -> nested schema (a dict), or True for a value kept whole (a full Kubernetes type).
_META = {key: True for key in ("annotations", "finalizers", "labels", "name", "namespace")}
# The manager of the service's own runtimePatch (Istio off, security defaults, node targeting):
# messages never cite it as a patch the submitter wrote.
OWN_MANAGER = "trainjob-admission.io/webhook"
CONTAINER_FIELDS = ("env", "volumeMounts", "securityContext")  # with its name, all a patch may set
_CONTAINER = {key: True for key in ("name", *CONTAINER_FIELDS)}
_POD_SPEC = {
    **{key: True for key in ("serviceAccountName", "volumes", "imagePullSecrets", "securityContext", "nodeSelector",
                             "affinity", "tolerations", "schedulingGates", "terminationGracePeriodSeconds")},
    "initContainers": [_CONTAINER],
    "containers": [_CONTAINER],
}
_REPLICATED_JOB = {
    "name": True,
    "template": {"metadata": _META, "spec": {"template": {"metadata": _META, "spec": _POD_SPEC}}},
}
SCHEMA = {"metadata": _META, "spec": {"replicatedJobs": [_REPLICATED_JOB]}}  # trainingRuntimeSpec.template
# Trainer v2.2's: the same without the pods' terminationGracePeriodSeconds
_POD_SPEC_V2_2 = {key: value for key, value in _POD_SPEC.items() if key != "terminationGracePeriodSeconds"}
SCHEMA_V2_2 = {"metadata": _META, "spec": {"replicatedJobs": [{
    "name": True, "template": {"metadata": _META, "spec": {"template": {"metadata": _META, "spec": _POD_SPEC_V2_2}}}}]}}
_NO_ENV = ("dataset-initializer", "model-initializer", "node")  # containers whose env Trainer sets itself


class PatchError(PolicyError, ValueError):
    """A patch Trainer cannot apply, for a job-model denial."""


def pruned(value: Any, schema: Any) -> Any:
    """``value`` with every field the schema does not list dropped, as structural pruning does."""
    if schema is True:
        return value
    if isinstance(schema, list):
        return [pruned(item, schema[0]) for item in value] if isinstance(value, list) else value
    if not isinstance(value, dict):
        return value
    return {key: pruned(item, schema[key]) for key, item in value.items() if key in schema}


def template_patch(patch: Any, versions: Versions = NEWEST) -> dict:
    """The pruned ``trainingRuntimeSpec.template`` of one runtimePatches entry ({} if it has none),
    by the schema of the cluster's Trainer."""
    template = ((patch or {}).get("trainingRuntimeSpec") or {}).get("template") if isinstance(patch, dict) else None
    schema = SCHEMA if versions.enabled("RuntimePatchTerminationGracePeriod") else SCHEMA_V2_2
    return pruned(template, schema) if isinstance(template, dict) else {}


def check_names(template: dict, containers_by_job: dict[str, set[str]], index: int) -> None:
    """Raise PatchError where the patch names a replicated job or container the runtime lacks, or
    sets env of a container Trainer fills itself."""
    where = f"spec.runtimePatches[{index}]"
    for rjob in (template.get("spec") or {}).get("replicatedJobs") or []:
        name = (rjob or {}).get("name", "")
        if name not in containers_by_job:
            raise PatchError(f"{where} names replicated job {name!r}, which the runtime does not have "
                             f"(it has {', '.join(sorted(containers_by_job)) or 'none'}): a patch cannot add one (it would "
                             "have no image and Trainer's JobSet would be refused); patch one of those jobs")
        pod_spec = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {})
        for key in ("initContainers", "containers"):
            for container in pod_spec.get(key) or []:
                cname = (container or {}).get("name", "")
                if cname not in containers_by_job[name]:
                    raise PatchError(f"{where} names {key[:-1]} {cname!r} in replicated job {name!r}, which has "
                                     f"only {', '.join(sorted(containers_by_job[name])) or 'no containers'}: a patch cannot add one "
                                     "(it would have no image and its pods would be refused); patch one of those")
                if key == "containers" and cname in _NO_ENV and container.get("env"):
                    raise PatchError(f"{where} sets env of container {cname!r}; Trainer refuses env in a patch for "
                                     "the node and initializer containers: set spec.trainer.env (or "
                                     "spec.initializer.*.env) instead")
