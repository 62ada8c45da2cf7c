"""Where a stored job stood when it was deleted, for the decision log's deletion record: the
audit trail says who deleted a job and whether it had finished.

Read from the status the controllers write: TrainJob (trainer v2.3.0
pkg/apis/trainer/v1alpha1/trainjob_types.go: conditions Suspended, Complete, Failed; jobsStatus
with each child Job's active and ready counts) and v2beta1 MPIJob (mpi-operator v0.7.0
pkg/apis/kubeflow/v2beta1/types.go: conditions Created, Running, Restarting, Succeeded,
Suspended, Failed).
"""
from __future__ import annotations

MAX_CONDITIONS = 16  # TrainJob allows 8; a forged status must not make a record long
MAX_TYPE = 64


def lifecycle(obj: dict | None) -> dict:
    """``{"state", "conditions"}``: ``state`` is Complete, Failed, Suspended, Running or Pending
    (nothing started yet, or no status at all); ``conditions`` the condition types that are True."""
    status = (obj or {}).get("status")
    status = status if isinstance(status, dict) else {}
    conditions = status.get("conditions") if isinstance(status.get("conditions"), list) else []
    true = sorted({str(c.get("type", ""))[:MAX_TYPE] for c in conditions[:MAX_CONDITIONS]
                   if isinstance(c, dict) and c.get("status") == "True" and c.get("type")})
    jobs = status.get("jobsStatus") if isinstance(status.get("jobsStatus"), list) else []
    running = "Running" in true or any(isinstance(j, dict) and ((_count(j.get("active")) or _count(j.get("ready"))))
                                       for j in jobs[:100])
    if {"Complete", "Succeeded"} & set(true):
        state = "Complete"
    elif "Failed" in true:
        state = "Failed"
    elif "Suspended" in true:
        state = "Suspended"
    else:
        state = "Running" if running else "Pending"
    return {"state": state, "conditions": true}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
