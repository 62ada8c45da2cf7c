"""Cluster state and PolicyBundle status without a cluster: the cache writes that watches make,
and the status a bundle gets for each compile outcome (the API round trip is in
tests/cluster/test_kube.py)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.k8s.clusterstate import ClusterState
from trainjob_admission.webhook.cli.main import main
from trainjob_admission.webhook.kube.resources import (
    LIMIT_RANGES, NAMESPACES, RESOURCE_QUOTAS, STATE_RESOURCES, TRAINING_RUNTIMES,
)
from trainjob_admission.webhook.kube.statewatch import StateSink
from trainjob_admission.webhook.loops.bundleset import BundleRegistry
from trainjob_admission.webhook.loops.clusterbundles import ClusterBundles, _with_transition_times

GOOD = yaml.safe_load((Path(__file__).parent / "fixtures" / "bundles" / "good.yaml").read_text())


def quota(namespace: str, name: str) -> dict:
    return {"kind": "ResourceQuota", "metadata": {"namespace": namespace, "name": name}, "spec": {"hard": {}}}


def test_writes_swap_dicts_so_a_reader_keeps_a_consistent_snapshot():
    state = ClusterState.from_objects([quota("a", "q1"), quota("a", "q2")])
    held_outer, held_inner = state.quotas, state.quotas["a"]
    state.delete(quota("a", "q1"))
    state.upsert(quota("b", "q3"))
    assert held_inner.keys() == {"q1", "q2"} and held_outer.keys() == {"a"}  # what a reader held is untouched
    assert [q["metadata"]["name"] for q in state.namespace_quotas("a")] == ["q2"]
    state.delete(quota("a", "q2"))
    assert "a" not in state.quotas and state.namespace_quotas("a") == []


def test_replace_drops_what_is_gone_for_that_kind_only():
    state = ClusterState.from_objects([quota("a", "q1"), {"kind": "Namespace", "metadata": {"name": "a"}}])
    StateSink(state, "ResourceQuota").replace([quota("b", "q9")])
    assert state.quotas.keys() == {"b"} and "a" in state.namespaces
    StateSink(state, "TrainingRuntime").apply("ADDED", {"kind": "TrainingRuntime", "metadata": {"namespace": "b", "name": "rt"}})
    assert state.runtime("b", {"kind": "TrainingRuntime", "name": "rt"})
    with pytest.raises(ValueError):
        state.replace("Secret", [])


@pytest.mark.parametrize("kind", ["Node", "ConfigMap", "Namespace", "ResourceQuota", "Pod", "TrainingRuntime"])
@pytest.mark.parametrize("metadata", [["x"], "x", {"name": {"a": 1}}, {"name": "n", "namespace": 5}])
def test_an_object_with_metadata_no_api_server_serves_is_ignored(kind, metadata):
    """A hand-written state file's object whose metadata is not a mapping of strings: left out
    of the state, never a traceback in `review`."""
    odd = {"kind": kind, "metadata": metadata, "spec": {"nodeName": "n"}}
    state = ClusterState.from_objects([odd, quota("a", "q1")])
    state.upsert(odd)
    state.delete(odd)
    assert [q["metadata"]["name"] for q in state.namespace_quotas("a")] == ["q1"]
    assert not state.nodes and not state.namespaces and not state.runtimes and not state.pods


def test_resource_paths():
    assert NAMESPACES.path(name="team-a") == "/api/v1/namespaces/team-a"
    assert RESOURCE_QUOTAS.path("team-a") == "/api/v1/namespaces/team-a/resourcequotas"
    assert LIMIT_RANGES.path("team-a") == "/api/v1/namespaces/team-a/limitranges"
    assert LIMIT_RANGES in STATE_RESOURCES  # watched by serve, read by review --kubeconfig
    assert TRAINING_RUNTIMES.path() == "/apis/trainer.kubeflow.org/v1alpha1/trainingruntimes"


def cr(generation: int, uid: str = "u1", **spec_changes) -> dict:
    obj = copy.deepcopy(GOOD)
    obj["metadata"] = {"name": obj["metadata"]["name"], "generation": generation, "uid": uid}
    obj["spec"].update(spec_changes)
    return obj


def observe(bundles: ClusterBundles, obj: dict) -> dict:
    bundles._compile(obj)
    return bundles.desired_status(obj)


def test_status_for_good_then_broken_then_fixed():
    registry = BundleRegistry([])
    bundles = ClusterBundles(api=None, registry=registry)
    name = GOOD["metadata"]["name"]

    st = observe(bundles, cr(1))
    assert st["compiled"] and st["active"] and st["activeGeneration"] == 1 and st["errorCount"] == 0
    assert [c["status"] for c in st["conditions"]] == ["True", "True"]
    digest = st["digest"]
    assert [b.source for b in registry.active] == [f"cluster:{name}"]

    st = observe(bundles, cr(2, mode="block"))
    assert st["compiled"] is False and st["active"] is True and st["activeGeneration"] == 1 and st["digest"] == digest
    assert st["errorCount"] == 1 and "spec.mode" in st["errors"][0]
    ready = st["conditions"][0]
    assert ready["reason"] == "LastGoodEnforced" and "generation 1" in ready["message"] and "still enforced" in ready["message"]
    assert registry.active[0].digest == digest

    st = observe(bundles, cr(3, version="9.9.9"))
    assert st["activeGeneration"] == 3 and st["activeVersion"] == "9.9.9" and st["digest"] != digest


def test_recreated_object_does_not_inherit_the_old_last_good():
    bundles = ClusterBundles(api=None, registry=BundleRegistry([]))
    observe(bundles, cr(1, uid="old"))
    st = observe(bundles, cr(1, uid="new", mode="block"))
    assert st["active"] is False and "activeGeneration" not in st
    assert st["conditions"][0]["reason"] == "NotEnforced"
    assert bundles.registry.active == ()


def test_a_file_bundle_of_the_same_name_shadows_the_cluster_one(tmp_path):
    path = tmp_path / "same.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    registry = BundleRegistry([str(path)])
    registry.poll()
    bundles = ClusterBundles(api=None, registry=registry)
    st = observe(bundles, cr(1, priority=1000))  # later in order than the file's
    assert st["active"] is False and st["conditions"][0]["reason"] == "Shadowed"
    assert str(path) in st["conditions"][0]["message"]


def test_transition_time_moves_only_when_the_condition_status_does():
    old = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"},
                          {"type": "Compiled", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    new = _with_transition_times({"conditions": [{"type": "Ready", "status": "False"}, {"type": "Compiled", "status": "True"}]}, old)
    assert new["conditions"][1]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert new["conditions"][0]["lastTransitionTime"] > "2020"


def test_missing_kubeconfig_is_not_found(tmp_path, capsys):
    job = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "allowed.yaml"
    assert main(["review", "-f", str(job), "--kubeconfig", str(tmp_path / "nope")]) == 3
    assert main(["serve", "--cert-dir", str(tmp_path), "--kubeconfig", str(tmp_path / "nope")]) == 3
    assert capsys.readouterr().err.count("not found") == 2


def test_unreadable_kubeconfig_is_invalid(tmp_path, capsys):
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [")
    job = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "allowed.yaml"
    assert main(["review", "-f", str(job), "--kubeconfig", str(bad)]) == 2
    assert "cannot load kubeconfig" in capsys.readouterr().err
