"""UPDATEs are judged against the runtime Trainer runs the job with: its `<job>-runtime-snapshot`
ConfigMap when Trainer would use it (pkg/runtime/core/snapshot.go), else the live runtime; and an
UPDATE that shapes no pod passes when both are gone, so Kueue and Trainer are never blocked."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.job.snapshot import InvalidSnapshot, running_state, snapshot_runtime
from trainjob_admission.policies.k8s.clusterstate import ClusterState

SCRIPT = Path(sys.executable).parent / "trainjob-admission"  # the console script, as a user runs it
UID = "0b7c6a4e-5d1f-4a43-9a35-6f3f2f0e9d11"
# GPUs per worker above the bundle's maxPerWorker (8): what a runtime edited after submission asks.
GPU_CHECK = {"checks": {"gpu": {"maxPerWorker": 8}}}


def gpu_runtime(build, gpus: int, name: str = "rt") -> dict:
    return build.runtime(name, node=build.pod_spec(gpus=gpus), launcher_as_node=False)


def job(build, uid: str = UID, **trainer) -> dict:
    obj = build.trainjob(**trainer)
    obj["metadata"]["uid"] = uid
    obj["spec"]["runtimeRef"].update(kind="ClusterTrainingRuntime", apiGroup="trainer.kubeflow.org")  # as defaulted
    return obj


def snapshot(runtime: dict, owner_uid: str = UID, *, name: str = "job-runtime-snapshot", controller: bool = True,
             data: str | None = None) -> dict:
    """The ConfigMap as Trainer applies it: controller-owned by the TrainJob, the runtime as YAML."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "team-a", "ownerReferences": [
                {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "job",
                 "uid": owner_uid, "controller": controller, "blockOwnerDeletion": True}]},
            "data": {"runtime": yaml.safe_dump(runtime) if data is None else data}}


def test_an_update_is_judged_against_the_snapshot_not_the_edited_runtime(build, make_bundle, review):
    """The runtime now asks 16 GPUs per worker; the job runs with the 4 of its snapshot."""
    bundles = [make_bundle(GPU_CHECK)]
    state = build.state(gpu_runtime(build, 16), snapshot(gpu_runtime(build, 4)))
    old, new = job(build), job(build, labels={"team": "vision"})
    decision = review(new, bundles, state, operation="UPDATE", old=old)
    assert decision.allowed and not decision.warnings
    assert decision.job.pod_sets[0].gpus == {"nvidia.com/gpu": 4}
    # A CREATE of the same job has no snapshot of its own: the live runtime decides it.
    assert not review(job(build), bundles, state).allowed


def test_a_spec_change_is_judged_against_the_snapshot(build, make_bundle, review):
    """The runtime was edited down to 1 GPU; the snapshot's 12 per worker is what a new
    numNodes would really start."""
    bundles = [make_bundle(GPU_CHECK)]
    state = build.state(gpu_runtime(build, 1), snapshot(gpu_runtime(build, 12)))
    decision = review(job(build, numNodes=3), bundles, state, operation="UPDATE", old=job(build, numNodes=2))
    assert not decision.allowed
    assert "12" in " ".join(m for r in decision.results for m in r.messages)


def test_a_deleted_runtime_does_not_block_updates_of_a_job_with_a_snapshot(build, make_bundle, review):
    state = build.state(snapshot(gpu_runtime(build, 4)))  # no runtime at all
    old = job(build)
    new = copy.deepcopy(old)
    new["spec"]["suspend"] = True
    decision = review(new, [make_bundle(GPU_CHECK)], state, operation="UPDATE", old=old)
    assert decision.allowed and not decision.warnings
    assert decision.job is not None  # judged, not waved through


@pytest.mark.parametrize("configmap, reason", [
    (lambda rt: snapshot(rt, owner_uid="another-uid"), "owned by another object"),
    (lambda rt: snapshot(rt, controller=False), "owned by another object"),
    (lambda rt: {**snapshot(rt), "data": {"other": "x"}}, "missing 'runtime' data key"),
    (lambda rt: snapshot(rt, data="spec: [unclosed"), "unable to unmarshal"),
    (lambda rt: snapshot(rt, data="- a list"), "unable to unmarshal"),
    (lambda rt: snapshot({**rt, "metadata": {"name": "other-rt"}}), "wrong runtime"),
    (lambda rt: snapshot({**rt, "kind": "TrainingRuntime"}), "wrong runtime"),
    (lambda rt: snapshot({**rt, "apiVersion": "example.com/v1"}), "wrong runtime"),
])
def test_a_snapshot_trainer_refuses_falls_back_to_the_live_runtime_with_a_warning(build, make_bundle, review,
                                                                                  configmap, reason):
    """A forged or stale ConfigMap never picks the runtime: the live one (16 GPUs) decides."""
    state = build.state(gpu_runtime(build, 16), configmap(gpu_runtime(build, 2)))
    decision = review(job(build, labels={"x": "y"}), [make_bundle(GPU_CHECK)], state, operation="UPDATE", old=job(build))
    assert not decision.allowed
    (warning,) = [w for w in decision.warnings if "runtime snapshot" in w]
    assert reason in warning and "job-runtime-snapshot" in warning and "Delete that ConfigMap" in warning


def test_a_snapshot_with_field_names_in_another_case_is_refused_not_misread(build, make_bundle, review):
    """Go's encoding/json (sigs.k8s.io/yaml) reads `NumNodes` as numNodes; a hand-edited snapshot
    must not judge as 1 small pod while Trainer rebuilds 100 nodes of 8 GPUs."""
    edited = gpu_runtime(build, 1)
    node = next(j for j in edited["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
    container = node["template"]["spec"]["template"]["spec"]["containers"][0]
    container["Resources"] = {"limits": {"nvidia.com/gpu": 8}}
    del container["resources"]
    state = build.state(gpu_runtime(build, 1), snapshot(edited))
    decision = review(job(build, labels={"a": "b"}), [make_bundle(GPU_CHECK)], state, operation="UPDATE", old=job(build))
    assert not decision.allowed
    (message,) = {m["message"] for m in decision.messages}
    assert "spells field spec.template.spec.replicatedJobs[].template.spec.template.spec.containers[].Resources" in message
    # label keys and resource names are data: capitals there are fine
    fine = gpu_runtime(build, 1)
    fine["metadata"]["labels"] = {"Team": "Vision"}
    state = build.state(gpu_runtime(build, 1), snapshot(fine))
    assert review(job(build, labels={"a": "b"}), [make_bundle(GPU_CHECK)], state, operation="UPDATE", old=job(build)).allowed


def test_trainer_checks_kind_and_group_only_where_the_ref_sets_them():
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "rt"}, "spec": {}}
    bare = {"metadata": {"uid": UID}, "spec": {"runtimeRef": {"name": "rt"}}}
    cm = snapshot({**runtime, "kind": "Whatever"})
    assert snapshot_runtime(cm, bare)["kind"] == "Whatever"  # as getRuntimeSnapshot: nil kind matches any
    with pytest.raises(InvalidSnapshot, match="wrong runtime"):
        snapshot_runtime(cm, {**bare, "spec": {"runtimeRef": {"name": "rt", "kind": "ClusterTrainingRuntime"}}})


def test_a_yaml_bomb_in_a_snapshot_is_refused_before_it_is_built():
    bomb = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    with pytest.raises(InvalidSnapshot, match="aliases"):
        snapshot_runtime(snapshot({}, data=bomb), {"metadata": {"uid": UID}, "spec": {"runtimeRef": {"name": "rt"}}})


def test_a_training_runtime_snapshot_replaces_the_namespaced_runtime(build):
    live = build.runtime("rt", kind="TrainingRuntime", namespace="team-a")
    frozen = build.runtime("rt", kind="TrainingRuntime", namespace="team-a", node=build.pod_spec(cpu="7"))
    obj = job(build)
    obj["spec"]["runtimeRef"]["kind"] = "TrainingRuntime"
    state, warning = running_state("UPDATE", obj, build.state(live, snapshot(frozen)))
    assert not warning
    assert state.runtime("team-a", obj["spec"]["runtimeRef"]) == frozen
    base = build.state(live, snapshot(frozen))
    assert running_state("CREATE", obj, base)[0] is base  # a CREATE never has a snapshot of its own


def test_the_state_keeps_only_runtime_snapshots_and_overlays_leave_it_alone(build):
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "team-a"}}
    cm = snapshot(build.runtime())
    state = ClusterState.from_objects([other, cm])
    assert state.snapshots == {("team-a", "job-runtime-snapshot"): cm}
    state.upsert({**other, "metadata": {"name": "more", "namespace": "team-a"}})
    assert list(state.snapshots) == [("team-a", "job-runtime-snapshot")]
    overlay = ClusterState().with_snapshot(cm)
    assert overlay.snapshot("team-a", "job-runtime-snapshot") == cm
    assert ClusterState().with_snapshot(other).snapshots == {}


# --- neither a snapshot nor a runtime -----------------------------------------------------------------

def suspended(obj: dict) -> dict:
    out = copy.deepcopy(obj)
    out["spec"]["suspend"] = True
    return out


@pytest.mark.parametrize("change", [
    lambda o: suspended(o),  # Kueue preempts
    lambda o: {**o, "metadata": {**o["metadata"], "labels": {"kueue.x-k8s.io/queue-name": "q"}}},
    lambda o: {**o, "metadata": {**o["metadata"], "finalizers": ["trainer.kubeflow.org/x"]}},
])
def test_an_update_that_shapes_no_pod_passes_with_a_warning_when_the_runtime_is_gone(build, make_bundle, review, change):
    old = job(build)
    decision = review(change(old), [make_bundle(GPU_CHECK)], build.state(), operation="UPDATE", old=old)
    assert decision.allowed
    (warning,) = decision.warnings
    assert "no ClusterTrainingRuntime 'rt'" in warning and "admitted unchecked" in warning


@pytest.mark.parametrize("update", [
    lambda b: (job(b, numNodes=4), job(b, numNodes=2)),  # grows
    lambda b: (job(b), None),  # no old object: nothing to compare with
])
def test_an_update_that_shapes_pods_is_still_denied_when_the_runtime_is_gone(build, make_bundle, review, update):
    new, old = update(build)
    decision = review(new, [make_bundle(GPU_CHECK)], build.state(), operation="UPDATE", old=old)
    assert not decision.allowed
    assert any("not found" in m for r in decision.results for m in r.messages)


# --- offline ----------------------------------------------------------------------------------------

def test_review_reads_the_snapshot_from_the_state_file(build, tmp_path):
    """`review --operation UPDATE --cluster-state` with the live runtime over the limit and the snapshot within."""
    state = tmp_path / "state.yaml"
    state.write_text(yaml.safe_dump_all([gpu_runtime(build, 16), snapshot(gpu_runtime(build, 4)),
                                         build.namespace()]))
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(yaml.safe_dump(build.bundle_document(GPU_CHECK)))
    jobfile = tmp_path / "job.yaml"
    jobfile.write_text(yaml.safe_dump(job(build)))

    def review_cli(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), "review", "-f", str(jobfile), "--bundle", str(bundle),
                               "--cluster-state", str(state), "-o", "json", *extra],
                              capture_output=True, text=True, cwd=build.root, timeout=120)

    update, create = review_cli("--operation", "UPDATE"), review_cli()
    assert update.returncode == 0, update.stdout + update.stderr
    assert json.loads(update.stdout)["allowed"] is True
    assert create.returncode == 1 and "16" in create.stdout
