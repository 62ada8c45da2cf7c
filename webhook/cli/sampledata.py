"""The sample jobs, runtimes, cluster state and bundles shipped as package data
(``webhook/samples``): the demo submits them, ``policy lint`` runs every expression on them, and
``--help`` examples name them where this install keeps them. They are copies of examples/ (the
source; `make samples` copies, tests/unit/test_examples.py holds the two equal). Loading them needs
no server library."""
from __future__ import annotations

import shlex
from importlib import resources
from importlib.abc import Traversable

from trainjob_admission.policies.k8s.clusterstate import ClusterState, parse_objects

SAMPLE_DATA = resources.files("trainjob_admission.webhook").joinpath("samples")
# What examples/ has that the wheel ships (the docs' other examples need the repository).
SHIPPED = ("cluster-state.yaml", "jobs", "runtimes", "bundles")


def help_samples() -> str:
    """The line of a --help example that names this install's sample files as $S."""
    return f"  S={shlex.quote(str(SAMPLE_DATA))}   # the samples installed with this tool (examples/ in the repository)\n"


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
