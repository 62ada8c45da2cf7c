"""The sample jobs, runtimes and cluster state shipped as package data (``webhook/samples``):
the demo submits them, and ``policy lint`` runs every expression on them. examples/ links to them
for the docs. Loading them needs no server library."""
from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable

from trainjob_admission.policies.k8s.clusterstate import ClusterState, parse_objects

SAMPLE_DATA = resources.files("trainjob_admission.webhook").joinpath("samples")


def objects(resource: Traversable) -> list[dict]:
    return parse_objects(resource.read_text(encoding="utf-8"), f"samples/{resource.name}")


def sample_job(name: str) -> dict:
    """The job in samples/jobs/NAME (one object per file)."""
    [obj] = objects(SAMPLE_DATA / "jobs" / name)
    return obj


def sample_state() -> ClusterState:
    found = objects(SAMPLE_DATA / "cluster-state.yaml")
    for runtime in sorted((SAMPLE_DATA / "runtimes").iterdir(), key=lambda r: r.name):
        if runtime.name.endswith(".yaml"):
            found += objects(runtime)
    return ClusterState.from_objects(found)
