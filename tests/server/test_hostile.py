"""Property-based hostile input: whatever arrives, the server answers cleanly, never crashes,
logs every request, and never allows what policy denies."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainjob_admission.webhook.cli.demo import admission_review

from tests.support.objects import example_job

pytestmark = pytest.mark.server

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=40,
)
FIELDS = ["spec", "metadata", "kind", "apiVersion"]
SPEC_FIELDS = ["trainer", "runtimeRef", "runtimePatches", "mpiReplicaSpecs"]


def _mangle(base: dict, data: st.DataObject) -> dict:
    """Replace a random part of a real TrainJob with random JSON."""
    obj = copy.deepcopy(base)
    target = data.draw(st.sampled_from(FIELDS + SPEC_FIELDS))
    value = data.draw(json_values)
    if target in SPEC_FIELDS:
        obj.setdefault("spec", {})[target] = value
    else:
        obj[target] = value
    return obj


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_objects_never_crash_the_server(shared_server, data):
    before = len(shared_server.records())
    review = admission_review(example_job("allowed.yaml"))
    review["request"]["object"] = _mangle(review["request"]["object"], data)
    status, body = shared_server.post(data.draw(st.sampled_from(["/validate", "/mutate"])), review)
    assert status in (200, 400), body
    if status == 200:
        assert body["response"]["uid"] == review["request"]["uid"]
    assert len(shared_server.records()) == before + 1  # logged, whatever happened


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=json_values | st.binary(max_size=200))
def test_random_bodies_get_clean_errors(shared_server, payload):
    body = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
    status, reply = shared_server.post("/validate", body)
    assert status in (200, 400)
    if status == 200:
        assert reply["response"]["allowed"] is False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpus=st.integers(9, 10_000), extra=json_values)
def test_deny_worthy_jobs_stay_denied_whatever_else_is_sent(shared_server, gpus, extra):
    obj = example_job("too-many-gpus.yaml")
    obj["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = gpus
    obj["metadata"]["annotations"] = {"noise": json.dumps(extra)[:1000]}
    assert shared_server.review(obj)["allowed"] is False
