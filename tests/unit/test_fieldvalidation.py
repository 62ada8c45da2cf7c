"""Strict field validation (policies/k8s/fieldvalidation.py): a job whose fields the API server
would refuse under kubectl's default --validate=strict is refused offline too, by path, with the
nearest known name; every job of the corpus and of examples/ passes it; and the built-in schema
table is exactly what hack/fieldschemas.py derives from the pinned CRDs in the Go module cache."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.k8s import fieldvalidation
from trainjob_admission.policies.k8s.clusterstate import load_objects, parse_objects
from tests.support import corpus, upstream

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = fieldvalidation.Schemas.builtin()
JOB = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
       "metadata": {"name": "typo", "namespace": "team-a", "labels": {"team": "a"}},
       "spec": {"runtimeRef": {"name": "torch-distributed"},
                "trainer": {"numNodes": 2, "image": "quay.io/acme/train:1",
                            "resourcesPerNode": {"limits": {"nvidia.com/gpu": 2, "cpu": "4"}},
                            "env": [{"name": "A", "value": "1"}]},
                "runtimePatches": [{"manager": "acme.io/x"}]}}


def messages(obj: dict) -> list[str]:
    return [message for message, _ in fieldvalidation.problems(obj, SCHEMAS)]


def edited(change) -> dict:
    obj = copy.deepcopy(JOB)
    change(obj)
    return obj


def test_a_valid_job_has_no_problem():
    assert fieldvalidation.problems(JOB, SCHEMAS) == []


@pytest.mark.parametrize("change, expected", [
    (lambda o: o["spec"]["trainer"].update(numNode=4), 'unknown field "spec.trainer.numNode" (did you mean numNodes?)'),
    (lambda o: o["spec"]["trainer"].update(resourcesPerNod={}),
     'unknown field "spec.trainer.resourcesPerNod" (did you mean resourcesPerNode?)'),
    (lambda o: o["metadata"].update(lables={}), 'unknown field "metadata.lables" (did you mean labels?)'),
    (lambda o: o["spec"].update(xyzzy=1), 'unknown field "spec.xyzzy"'),
    (lambda o: o["spec"]["trainer"].update(numNodes="4"),
     'spec.trainer.numNodes: Invalid value: \'4\': spec.trainer.numNodes in body must be of type integer: string'),
    (lambda o: o["spec"].update(suspend="yes"), "spec.suspend in body must be of type boolean: string"),
    (lambda o: o["spec"]["trainer"]["resourcesPerNode"]["limits"].update(cpu="4 cores"),
     "spec.trainer.resourcesPerNode.limits.cpu: Invalid value: '4 cores': spec.trainer.resourcesPerNode.limits.cpu in "
     "body should match '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)"),
    (lambda o: o["spec"]["trainer"].update(image="x" * 501), "spec.trainer.image: Too long: may not be more than 500"),
    (lambda o: o["spec"]["trainer"]["env"].append({"name": "A", "value": "2"}),
     'spec.trainer.env[1]: Duplicate value: {"name": "A"}'),
    (lambda o: o["spec"]["trainer"]["resourcesPerNode"]["limits"].update(cpu=[4]),
     "spec.trainer.resourcesPerNode.limits.cpu: Invalid value: a value of type list: must be an integer or a string"),
    (lambda o: o["spec"]["runtimePatches"][0].pop("manager"), "spec.runtimePatches[0].manager: Required value"),
])
def test_what_the_api_server_refuses_is_named_by_path(change, expected):
    found = messages(edited(change))
    assert any(expected in m for m in found), found


def test_an_enum_names_what_it_supports():
    mpijob = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "m"},
              "spec": {"mpiImplementation": "MVAPICH", "mpiReplicaSpecs": {}}}
    assert messages(mpijob) == ['spec.mpiImplementation: Unsupported value: \'MVAPICH\': supported values: "OpenMPI", '
                                '"Intel", "MPICH"']


def test_a_null_where_the_schema_has_no_nullable_is_dropped_not_refused():
    assert messages(edited(lambda o: o["spec"].update(suspend=None))) == []


def test_duplicate_fields_in_the_text_are_refused():
    text = yaml.safe_dump(JOB).replace("numNodes: 2", "numNodes: 2\n    numNodes: 3")
    (obj,) = parse_objects(text, "<typo>")
    assert obj["spec"]["trainer"]["numNodes"] == 3  # the last one written, as a decoder keeps it
    assert messages(obj) == ['duplicate field "spec.trainer.numNodes"']


def test_crds_of_the_cluster_state_are_used_over_the_builtin_ones():
    crd = {"kind": "CustomResourceDefinition", "spec": {"group": "trainer.kubeflow.org", "names": {"kind": "TrainJob"},
           "versions": [{"name": "v1alpha1", "served": True, "schema": {"openAPIV3Schema": {
               "type": "object", "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]}}
    schemas = fieldvalidation.Schemas.from_crds([crd], SCHEMAS)
    typo = edited(lambda o: o["spec"]["trainer"].update(numNode=4))
    assert fieldvalidation.problems(typo, schemas) == [] and messages(typo)


def test_every_job_of_the_corpus_and_the_examples_passes():
    """No false refusal: the real-world jobs and our own examples are valid as written."""
    jobs = {case.id: case.job() for case in corpus.cases() if not case.id.startswith("shape-typo-")}  # typos on purpose
    for path in sorted((ROOT / "examples" / "jobs").glob("*.yaml")):
        jobs.update({f"{path.name}#{i}": obj for i, obj in enumerate(load_objects(path))})
    assert len(jobs) > 60
    refused = {name: messages(obj) for name, obj in jobs.items() if messages(obj)}
    assert refused == {}


def test_the_builtin_schemas_are_derived_from_the_pinned_crds():
    """hack/fieldschemas.py --check: the table equals what the CRDs in the Go module cache give."""
    try:
        upstream.module_dir("trainer"), upstream.module_dir("mpi-operator")
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))
    result = subprocess.run([sys.executable, str(ROOT / "hack" / "fieldschemas.py"), "--check"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert set(SCHEMAS.kinds) == {"trainer.kubeflow.org/v1alpha1/TrainJob", "kubeflow.org/v2beta1/MPIJob",
                                  "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime",
                                  "trainer.kubeflow.org/v1alpha1/TrainingRuntime"}


def test_review_of_a_typod_job_exits_1_with_the_path_and_the_name_meant(tmp_path):
    typo = edited(lambda o: o["spec"]["trainer"].update(numNode=4))
    del typo["spec"]["trainer"]["numNodes"]
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(typo))
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "trainjob-admission"), "review", "-f", str(tmp_path / "typo.yaml"),
                             "--cluster-state", str(ROOT / "examples" / "cluster-state.yaml")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'x kubernetes/field-validation: unknown field "spec.trainer.numNode" (did you mean numNodes?)' in result.stdout
    assert "fix: rename numNode to numNodes" in result.stdout
