"""Whether a job creates pods in this cluster now, later, or never: suspended and queued jobs,
and jobs MultiKueue runs on another cluster.

- TrainJob (trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go): ``spec.suspend`` and
  ``spec.managedBy``; MPIJob (mpi-operator v0.7.0 pkg/apis/kubeflow/v2beta1/types.go RunPolicy):
  ``spec.runPolicy.suspend`` and ``spec.runPolicy.managedBy``.
- Kueue's own mutating webhook suspends every job that names a ``kueue.x-k8s.io/queue-name``;
  mutating webhooks run before validating ones, so the object we judge already says
  ``suspend: true`` and that field is the truth (offline, review the job as Kueue leaves it).
- ``managedBy: kueue.x-k8s.io/multikueue``: Trainer and mpi-operator leave the job alone here and
  Kueue runs a copy on a worker cluster; nothing it creates counts in this namespace.
"""
from __future__ import annotations

from .effective_job import JobModelError

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
SUSPEND = {"TrainJob": ("spec", "suspend"), "MPIJob": ("spec", "runPolicy", "suspend")}  # where each kind says it


def _run_fields(obj: dict | None) -> dict:
    """The spec section holding suspend and managedBy for the object's kind."""
    spec = (obj or {}).get("spec")
    if not isinstance(spec, dict):
        return {}
    if (obj or {}).get("kind") == "MPIJob":
        run_policy = spec.get("runPolicy")
        return run_policy if isinstance(run_policy, dict) else {}
    return spec


def runs_elsewhere(obj: dict | None) -> bool:
    """MultiKueue dispatches it to another cluster: no pods, objects or injections here."""
    return _run_fields(obj).get("managedBy") == MULTIKUEUE


def check_stays_remote(old: dict | None, new: dict) -> None:
    """A job MultiKueue runs elsewhere must not start here by an UPDATE: it got no injected SSH
    key or NetworkPolicy at creation. TrainJob's managedBy is immutable in its CRD; an MPIJob's
    says so only in words (mpi-operator re-reads it on every sync), so refuse it here."""
    if runs_elsewhere(old) and not runs_elsewhere(new):
        field = "spec.runPolicy.managedBy" if new.get("kind") == "MPIJob" else "spec.managedBy"
        raise JobModelError(f"{field} cannot change from {MULTIKUEUE} once the job exists: the job was created to "
                            "run on a MultiKueue worker cluster; delete it and create it again to run it here")


def suspended(obj: dict | None) -> bool:
    """The job exists but creates no pods until it is resumed (by Kueue or by hand)."""
    return _run_fields(obj).get("suspend") is True
