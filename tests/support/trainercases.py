"""Kubeflow Trainer's own webhook test cases, as transcribed in
tests/unit/fixtures/trainer-webhook-cases.yaml, turned into the objects a user would submit: the
runtime each case's Trainer plugin reads and the TrainJob (and, for an UPDATE, the job before).
The unit tier replays them through the engine; the cluster tier through the real Trainer."""
from __future__ import annotations

import copy
import functools
from pathlib import Path

import yaml

CASES = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "trainer-webhook-cases.yaml"
TRAINER = "trainer.kubeflow.org/v1alpha1"


@functools.cache
def fixtures() -> dict:
    return yaml.safe_load(CASES.read_text())


def cases() -> list[dict]:
    return fixtures()["cases"]


def runtime(case: dict, kind: str = "ClusterTrainingRuntime", namespace: str | None = None) -> dict:
    """The case's runtime (the default one: its trainer "node" job)."""
    spec = case.get("runtime") or {"template": {"spec": {"replicatedJobs": [fixtures()["node-job"]]}}}
    meta: dict = {"name": case.get("runtimeName", "test-runtime"), "labels": case.get("runtimeLabels") or {}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": TRAINER, "kind": kind, "metadata": meta, "spec": copy.deepcopy(spec)}


def trainjob(case: dict, spec: dict, kind: str = "ClusterTrainingRuntime", namespace: str = "default") -> dict:
    """A TrainJob "test" with ``spec`` (the case's ``job`` or ``old``) on the case's runtime."""
    ref = {"name": case.get("runtimeName", "test-runtime")}
    if kind != "ClusterTrainingRuntime":
        ref["kind"] = kind
    body = {"runtimeRef": ref, **copy.deepcopy(spec)}
    if "runtimeRef" in spec:
        body["runtimeRef"] = {**copy.deepcopy(spec["runtimeRef"]), **({"kind": kind} if kind != "ClusterTrainingRuntime" else {})}
    return {"apiVersion": TRAINER, "kind": "TrainJob", "metadata": {"name": "test", "namespace": namespace}, "spec": body}


def priority_classes(case: dict) -> list[dict]:
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": 100}
            for name in case.get("priorityClasses") or []]
