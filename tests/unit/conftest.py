"""Shared fixtures for the unit tier: the shipped examples, bundles built from dicts, and small
runtime/TrainJob builders so each test states only what it is about."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from trainjob_admission.policies.bundle.compile import Bundle, compile_document
from trainjob_admission.policies.bundle.load import default_bundles, load_bundles
from trainjob_admission.policies.bundle.schema import API_VERSION, KIND
from trainjob_admission.policies.decide.decision import Decision
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.k8s.clusterstate import ClusterState, load_objects
from tests.support.objects import bare_trainjob, mpi_runtime, pod_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
STATE_FILES = [
    EXAMPLES / "cluster-state.yaml",
    EXAMPLES / "runtimes" / "mpi-openmpi.yaml",
    EXAMPLES / "runtimes" / "mpi-privileged.yaml",
]


def load_one(path: Path) -> dict:
    objects = load_objects(path)
    assert len(objects) == 1, f"{path}: expected one object"
    return objects[0]


@pytest.fixture(scope="session")
def _example_objects() -> list[dict]:
    return [obj for path in STATE_FILES for obj in load_objects(path)]


@pytest.fixture
def example_state(_example_objects) -> ClusterState:
    """team-a (restricted, cost-center label, GPU quota 24/32 used) + both example runtimes."""
    return ClusterState.from_objects(copy.deepcopy(_example_objects))


@pytest.fixture
def example_job() -> Callable[[str], dict]:
    def load(name: str) -> dict:
        return load_one(EXAMPLES / "jobs" / f"{name}.yaml")

    return load


@pytest.fixture(scope="session")
def default() -> list[Bundle]:
    return default_bundles()


@pytest.fixture(scope="session")
def production() -> list[Bundle]:
    return load_bundles([str(EXAMPLES / "bundles" / "production.yaml")])


def bundle_document(spec: dict | None = None, name: str = "test") -> dict:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec or {}}


@pytest.fixture
def make_bundle() -> Callable[..., Bundle]:
    def make(spec: dict | None = None, name: str = "test") -> Bundle:
        return compile_document(bundle_document(spec, name), f"<{name}>")

    return make


@pytest.fixture
def review() -> Callable[..., Decision]:
    def run(obj: dict, bundles: list[Bundle], state: ClusterState, operation: str = "CREATE",
            old: dict | None = None, **kwargs: Any) -> Decision:
        return evaluate(AdmissionInput(copy.deepcopy(obj), operation=operation, old_object=old, **kwargs), bundles, state)

    return run


def namespace_obj(name: str = "team-a", labels: dict | None = None, annotations: dict | None = None) -> dict:
    meta: dict = {"name": name, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def quota_obj(hard: dict, used: dict | None = None, name: str = "compute", namespace: str = "team-a",
              **spec_extra: Any) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": dict(hard), **spec_extra},
            "status": {"hard": dict(hard), "used": dict(used or {})}}


def state_of(*objects: dict) -> ClusterState:
    return ClusterState.from_objects(copy.deepcopy(list(objects)))


def dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False)


@pytest.fixture(scope="session")
def build():
    """The builders above, for tests (conftest modules are not importable by name)."""
    import types

    return types.SimpleNamespace(
        pod_spec=pod_spec, runtime=mpi_runtime, trainjob=bare_trainjob, namespace=namespace_obj,
        quota=quota_obj, state=state_of, bundle_document=bundle_document, load_one=load_one,
        examples=EXAMPLES, fixtures=FIXTURES, root=ROOT, state_files=STATE_FILES,
    )
