"""The effective job: TrainJob + runtime -> pod sets and totals, per Kubeflow Trainer v2.3."""
from __future__ import annotations

import copy
import math
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainjob_admission.policies.job import smp
from trainjob_admission.policies.job.effective_job import JOBSET_NAME_LABEL, MPIJOB_NAME_LABEL, JobModelError
from trainjob_admission.policies.job.effective_job import (  # the fixture `build` holds the test builders
    build as effective,
)
from trainjob_admission.policies.k8s.podresources import pod_resources
from trainjob_admission.policies.k8s.quantity import QuantityError, numbers, to_number

GI = 1 << 30


def _job(build_kit, runtime: dict, **trainer):
    state = build_kit.state(runtime)
    return effective(build_kit.trainjob(runtime=runtime["metadata"]["name"], **trainer), state)


def _container(pod_set, name="node"):
    return next(c for c in pod_set.pod["spec"]["containers"] if c["name"] == name)


# --- numNodes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("num_nodes, workers", [(1, 1), (2, 1), (4, 3), (65, 64)])
def test_num_nodes_with_launcher_as_node_counts_launcher(build, num_nodes, workers):
    job = _job(build, build.runtime(launcher_as_node=True), numNodes=num_nodes)
    assert job.workers.count == workers  # max(n - 1, 1), plugins/mpi/mpi.go
    assert job.launcher.count == 1
    assert job.num_nodes == workers + 1
    assert job.totals["pods"] == workers + 1


@pytest.mark.parametrize("num_nodes", [1, 3, 8])
def test_num_nodes_without_launcher_as_node(build, num_nodes):
    job = _job(build, build.runtime(launcher_as_node=False), numNodes=num_nodes)
    assert job.workers.count == num_nodes
    assert job.launcher.count == 1
    assert job.num_nodes == num_nodes  # the launcher is not a node
    assert job.totals["pods"] == num_nodes + 1


def test_without_num_nodes_the_runtime_parallelism_stands(build):
    job = _job(build, build.runtime(node_parallelism=3))
    assert job.workers.count == 3


def test_example_allowed_job_has_three_workers_and_a_launcher_node(example_job, example_state):
    job = effective(example_job("allowed"), example_state)
    assert [(ps.name, ps.role, ps.count) for ps in job.pod_sets] == [("node", "worker", 3), ("launcher", "launcher", 1)]
    assert job.num_nodes == 4
    assert job.totals["gpus"] == 4
    assert job.pod_selector == {JOBSET_NAME_LABEL: "resnet-allreduce"}
    assert job.launcher.pod["metadata"]["labels"][JOBSET_NAME_LABEL] == "resnet-allreduce"


# --- resourcesPerNode -------------------------------------------------------------------------

def test_resources_per_node_merge_keeps_runtime_keys_and_overrides_given_ones(build):
    node = build.pod_spec(cpu="1", memory="2Gi")
    node["containers"][0]["resources"]["limits"] = {"ephemeral-storage": "10Gi"}
    runtime = build.runtime(launcher_as_node=True, node=node, launcher=copy.deepcopy(node))
    job = _job(build, runtime, numNodes=3, resourcesPerNode={"requests": {"cpu": "4"}, "limits": {"nvidia.com/gpu": 2}})
    for ps in (job.workers, job.launcher):  # trainer ancestor (launcher) and the node job (launcher is a node)
        resources = _container(ps)["resources"]
        assert resources["requests"] == {"cpu": "4", "memory": "2Gi"}
        assert resources["limits"] == {"ephemeral-storage": "10Gi", "nvidia.com/gpu": 2}
        assert ps.requests["cpu"] == 4000 and ps.requests["memory"] == 2 * GI
        assert ps.gpus == {"nvidia.com/gpu": 2}


def test_resources_per_node_goes_only_to_the_trainer_ancestor_when_launcher_is_not_a_node(build):
    # Usual upstream shape without runLauncherAsNode: the node job is the trainer ancestor.
    runtime = build.runtime(launcher_as_node=False, ancestor="node")
    job = _job(build, runtime, numNodes=2, resourcesPerNode={"requests": {"cpu": "8"}, "limits": {"nvidia.com/gpu": 4}})
    assert job.workers.requests["cpu"] == 8000 and job.workers.gpu_count == 4
    assert job.launcher.requests["cpu"] == 1000 and job.launcher.gpu_count == 0
    assert job.totals["gpus"] == 8


def test_resources_per_node_skips_other_containers(build):
    node = build.pod_spec()
    node["containers"].append({"name": "metrics", "image": "quay.io/x/m:1", "resources": {"requests": {"cpu": "100m"}}})
    job = _job(build, build.runtime(node=node, launcher=copy.deepcopy(node)), numNodes=2,
               resourcesPerNode={"requests": {"cpu": "3"}})
    assert _container(job.workers, "metrics")["resources"] == {"requests": {"cpu": "100m"}}
    assert job.workers.requests["cpu"] == 3100


# --- image / command / args / env -------------------------------------------------------------

def test_image_command_args_go_only_to_the_trainer_ancestor_node_container(build):
    launcher = build.pod_spec()
    launcher["containers"].append({"name": "helper", "image": "quay.io/x/helper:1"})
    runtime = build.runtime(launcher=launcher)
    job = _job(build, runtime, numNodes=2, image="quay.io/acme-ml/train:2", command=["mpirun"], args=["python", "t.py"])
    node_in_launcher = _container(job.launcher)
    assert node_in_launcher["image"] == "quay.io/acme-ml/train:2"
    assert node_in_launcher["command"] == ["mpirun"] and node_in_launcher["args"] == ["python", "t.py"]
    assert _container(job.launcher, "helper")["image"] == "quay.io/x/helper:1"
    worker = _container(job.workers)
    assert worker["image"] == "quay.io/acme-ml/openmpi-runtime:4.1"
    assert "command" not in worker and "args" not in worker
    assert job.as_cel()["images"] == sorted({"quay.io/acme-ml/train:2", "quay.io/x/helper:1",
                                             "quay.io/acme-ml/openmpi-runtime:4.1"})


def test_env_reaches_launcher_and_launcher_as_node_workers(build):
    job = _job(build, build.runtime(launcher_as_node=True), numNodes=2, env=[{"name": "NCCL_DEBUG", "value": "INFO"}])
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in _container(job.launcher)["env"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in _container(job.workers)["env"]
    job = _job(build, build.runtime(launcher_as_node=False), numNodes=2, env=[{"name": "NCCL_DEBUG", "value": "INFO"}])
    assert "env" not in _container(job.workers)


# --- numProcPerNode ---------------------------------------------------------------------------

@pytest.mark.parametrize("runtime_slots, trainer_slots, gpus, expected", [
    (1, None, 4, 4),     # runtime says 1: one slot per GPU
    (1, None, 1, 1),
    (1, None, 0, 1),
    (2, None, 8, 2),     # runtime chose: kept
    (1, 3, 8, 3),        # TrainJob numProcPerNode wins
])
def test_num_proc_per_node(build, runtime_slots, trainer_slots, gpus, expected):
    trainer: dict = {"numNodes": 2}
    if gpus:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": gpus}}
    if trainer_slots is not None:
        trainer["numProcPerNode"] = trainer_slots
    job = _job(build, build.runtime(num_proc=runtime_slots), **trainer)
    assert job.mpi["numProcPerNode"] == expected
    assert job.as_cel()["slots"] == expected


def test_num_proc_per_node_from_runtime_gpus_when_trainjob_sets_none(build):
    runtime = build.runtime(node=build.pod_spec(gpus=2), launcher=build.pod_spec(gpus=2))
    assert _job(build, runtime, numNodes=2).mpi["numProcPerNode"] == 2


# --- runtimePatches ---------------------------------------------------------------------------

def _patch(manager: str, job_name: str, pod_spec: dict, metadata: dict | None = None) -> dict:
    template: dict = {"spec": pod_spec}
    if metadata:
        template["metadata"] = metadata
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": job_name, "template": {"spec": {"template": template}}}]}}}}


def test_runtime_patches_merge_by_name_and_later_patch_wins(build):
    node = build.pod_spec()
    node["containers"][0]["env"] = [{"name": "A", "value": "runtime"}, {"name": "B", "value": "runtime"}]
    node["containers"].append({"name": "sidecar", "image": "quay.io/x/s:1"})
    node["volumes"] = [{"name": "data", "emptyDir": {}}]
    node["containers"][1]["env"] = [{"name": "A", "value": "runtime"}, {"name": "B", "value": "runtime"}]
    runtime = build.runtime(node=node)
    first = _patch("example.com/one", "node", {
        "securityContext": {"fsGroup": 2000},
        "containers": [{"name": "node", "securityContext": {"readOnlyRootFilesystem": True}},
                       {"name": "sidecar", "env": [{"name": "A", "value": "first"}, {"name": "C", "value": "first"}]}],
        "volumes": [{"name": "data", "emptyDir": {"medium": "Memory"}}, {"name": "scratch", "emptyDir": {}}],
    }, metadata={"labels": {"team": "a"}})
    second = _patch("example.com/two", "node", {
        "containers": [{"name": "sidecar", "env": [{"name": "A", "value": "second"}]}],
    })
    job = _job(build, runtime, numNodes=3)  # baseline without patches
    assert len(_container(job.workers)["env"]) == 2
    state = build.state(runtime)
    job = build_job = build_from(build, state, runtime_patches=[first, second])
    worker = build_job.workers
    node_c = _container(worker)
    assert _container(worker, "sidecar")["env"] == [{"name": "A", "value": "second"}, {"name": "B", "value": "runtime"},
                                                    {"name": "C", "value": "first"}]
    assert node_c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                         "readOnlyRootFilesystem": True}
    assert node_c["image"] == "quay.io/acme-ml/openmpi-runtime:4.1"  # untouched keys stay
    assert [c["name"] for c in worker.pod["spec"]["containers"]] == ["node", "sidecar"]
    assert worker.pod["spec"]["volumes"] == [{"name": "data", "emptyDir": {"medium": "Memory"}},
                                             {"name": "scratch", "emptyDir": {}}]
    assert worker.pod["spec"]["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000,
                                                     "seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 2000}
    assert worker.pod["metadata"]["labels"]["team"] == "a"
    # The launcher was not named by any patch.
    assert "env" not in _container(job.launcher) and "team" not in job.launcher.pod["metadata"]["labels"]


def build_from(build_kit, state, **kwargs):
    return effective(build_kit.trainjob(numNodes=3, **kwargs), state)


def test_runtime_patch_fields_the_crd_prunes_take_no_effect(build):
    """The TrainJob CRD keeps only a few pod fields in a patch (ContainerPatch: name, env,
    volumeMounts, securityContext): resources, images, replicas and parallelism never arrive."""
    runtime = build.runtime()
    state = build.state(runtime)
    baseline = build_from(build, state)
    patch = _patch("acme.io/x", "node", {"containers": [{"name": "node", "image": "evil.io/x:1",
                                                 "resources": {"limits": {"nvidia.com/gpu": 2}}}],
                                 "hostNetwork": True, "nodeName": "n1"})
    patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0].update(replicas=5)
    job = build_from(build, state, runtime_patches=[patch])
    assert [(ps.name, ps.count, ps.requests, ps.limits) for ps in job.pod_sets] == [
        (ps.name, ps.count, ps.requests, ps.limits) for ps in baseline.pod_sets]
    assert _container(job.workers)["image"] == _container(baseline.workers)["image"]
    assert "hostNetwork" not in job.workers.pod["spec"] and "nodeName" not in job.workers.pod["spec"]


@pytest.mark.parametrize("patched, message", [
    ({"name": "helper", "template": {"spec": {"template": {"spec": {"containers": [{"name": "x"}]}}}}},
     r"^spec\.runtimePatches\[0\] names replicated job 'helper', which the runtime does not have \(it has launcher, node\)"),
    ({"name": "node", "template": {"spec": {"template": {"spec": {"containers": [{"name": "extra"}]}}}}},
     r"names container 'extra' in replicated job 'node', which has only node"),
    ({"name": "node", "template": {"spec": {"template": {"spec": {"containers": [
        {"name": "node", "env": [{"name": "X", "value": "1"}]}]}}}}},
     r"sets env of container 'node'; Trainer refuses env in a patch .* set spec\.trainer\.env"),
])
def test_runtime_patch_naming_what_the_runtime_lacks_is_an_error(build, patched, message):
    patch = {"manager": "test.io/x", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [patched]}}}}
    with pytest.raises(JobModelError, match=message):
        build_from(build, build.state(build.runtime()), runtime_patches=[patch])


def test_runtime_patches_do_not_modify_the_cached_runtime(build):
    runtime = build.runtime()
    state = build.state(runtime)
    before = copy.deepcopy(state.cluster_runtimes["rt"])
    build_from(build, state, runtime_patches=[_patch("acme.io/x", "node", {"containers": [{"name": "node", "image": "evil"}]})],
               resourcesPerNode={"requests": {"cpu": "9"}}, image="quay.io/a/b:1")
    assert state.cluster_runtimes["rt"] == before


# --- resource accounting ----------------------------------------------------------------------

def test_pod_resources_sidecars_add_and_init_containers_take_the_max():
    spec = {
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                       {"name": "b", "resources": {"requests": {"cpu": "500m"}}}],
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}}},
            {"name": "setup", "resources": {"requests": {"cpu": "100m", "memory": "4Gi"}}},
        ],
    }
    requests, limits = pod_resources(spec)
    assert requests["cpu"] == 1750  # 1 + 0.5 + sidecar 0.25 > sidecar + setup 0.35
    # setup runs while the sidecar (started before it) runs: 512Mi + 4Gi
    assert requests["memory"] == 512 * (1 << 20) + 4 * GI
    assert limits == {}


def test_pod_resources_init_container_started_before_a_sidecar_does_not_add_it():
    spec = {
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}],
        "initContainers": [
            {"name": "setup", "resources": {"requests": {"cpu": "3"}}},
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
        ],
    }
    assert pod_resources(spec)[0]["cpu"] == 3000  # max(1 + 1, 3)


def test_pod_resources_request_defaults_to_limit_and_overhead_adds():
    spec = {"containers": [{"name": "a", "resources": {"limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": 1},
                                                        "requests": {"cpu": "1"}}}],
            "overhead": {"cpu": "250m"}}
    requests, limits = pod_resources(spec)
    assert requests == {"cpu": 1250, "memory": GI, "nvidia.com/gpu": 1}
    assert limits == {"cpu": 2250, "memory": GI, "nvidia.com/gpu": 1}  # overhead adds to limits that are set


def test_units_cpu_millicores_memory_bytes_gpus_by_resource_name(build):
    node = build.pod_spec(cpu="1500m", memory="1G")
    node["containers"][0]["resources"]["limits"] = {"amd.com/gpu": 2, "nvidia.com/mig-1g.5gb": 1}
    job = _job(build, build.runtime(node=node, launcher_as_node=False, ancestor="node"), numNodes=3)
    assert job.workers.requests["cpu"] == 1500
    assert job.workers.requests["memory"] == 10**9
    assert job.workers.gpus == {"amd.com/gpu": 2, "nvidia.com/mig-1g.5gb": 1}
    totals = job.totals
    assert totals["gpusByResource"] == {"amd.com/gpu": 6, "nvidia.com/mig-1g.5gb": 3}
    assert totals["gpus"] == 9
    assert totals["cpu"] == 3 * 1500 + 1000  # workers + launcher
    assert totals["memory"] == 3 * 10**9 + 2 * GI


def test_bad_quantity_is_a_job_model_error_naming_where(build):
    with pytest.raises(JobModelError, match=r"^spec\.trainer\.resourcesPerNode\.requests\.cpu: 'lots' is not a Kubernetes quantity"):
        _job(build, build.runtime(), numNodes=2, resourcesPerNode={"requests": {"cpu": "lots"}})


# --- legacy MPIJob ----------------------------------------------------------------------------

def test_legacy_mpijob(example_job, example_state):
    job = effective(example_job("legacy-mpijob"), example_state)
    assert job.kind == "MPIJob"
    assert [(ps.role, ps.count) for ps in job.pod_sets] == [("launcher", 1), ("worker", 2)]
    assert job.mpi["numProcPerNode"] == 1 and job.mpi["runLauncherAsNode"] is False
    assert job.num_nodes == 2
    assert job.totals == {**job.totals, "pods": 3, "cpu": 5000, "memory": 18 * GI, "gpus": 2}
    assert job.pod_selector == {MPIJOB_NAME_LABEL: "horovod-legacy"}
    assert job.workers.pod["metadata"]["labels"][MPIJOB_NAME_LABEL] == "horovod-legacy"


def test_legacy_mpijob_slots_per_worker_and_launcher_as_worker(example_job, example_state):
    obj = example_job("legacy-mpijob")
    obj["spec"].update(slotsPerWorker=4, runLauncherAsWorker=True)
    obj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 5
    job = effective(obj, example_state)
    assert job.mpi["numProcPerNode"] == 4
    assert job.workers.count == 5 and job.num_nodes == 6


# --- errors -----------------------------------------------------------------------------------

def test_missing_cluster_runtime_is_a_clear_error(build):
    with pytest.raises(JobModelError) as info:
        build_from(build, build.state(build.runtime("other")))
    text = str(info.value)
    assert "ClusterTrainingRuntime 'rt' not found" in text
    assert "spec.runtimeRef" in text and "kubectl get clustertrainingruntimes" in text


def test_missing_namespaced_runtime_names_the_namespace(build):
    runtime = build.runtime("rt", kind="TrainingRuntime", namespace="team-b")
    state = build.state(runtime)
    with pytest.raises(JobModelError, match="TrainingRuntime 'rt' not found in namespace team-a"):
        effective(build.trainjob(runtime="rt", runtime_kind="TrainingRuntime"), state)
    job = effective(build.trainjob(runtime="rt", runtime_kind="TrainingRuntime", namespace="team-b"), state)
    assert job.runtime == {"name": "rt", "kind": "TrainingRuntime"}


@pytest.mark.parametrize("value, why", [
    ("4", "got '4' (a string)"), (True, "got True (a boolean)"), (4.5, "got 4.5 (a number)"),
    (-5, "from 1 to 2147483647, got -5"), (0, "from 1 to 2147483647, got 0"), (2**31, "got 2147483648"),
])
def test_num_nodes_must_be_a_positive_integer_not_coerced(build, value, why):
    """A forged review or an offline file never passed the CRD; -5 would shrink the job's totals."""
    for field in ("numNodes", "numProcPerNode"):
        trainer = {"numNodes": 2, field: value}
        with pytest.raises(JobModelError) as info:
            _job(build, build.runtime(), **trainer)
        assert str(info.value).startswith(f"spec.trainer.{field} must be an integer") and why in str(info.value)


def _with_jobs(runtime: dict, *replicated_jobs: dict) -> dict:
    """The runtime with more replicated jobs (a runtime may have any; a patch cannot add them)."""
    runtime["spec"]["template"]["spec"]["replicatedJobs"] += list(replicated_jobs)
    return runtime


@pytest.mark.parametrize("field, value", [("replicas", -6), ("replicas", "-6"), ("parallelism", -6),
                                          ("parallelism", "abc"), ("replicas", 2.5)])
def test_counts_in_the_runtime_are_integers_too(build, pod_spec_gpus, field, value):
    """A negative 'ghost' job would subtract its GPUs from the totals the quota check compares."""
    ghost: dict = {"name": "ghost", "template": {"spec": {"template": {"spec": pod_spec_gpus}}}}
    if field == "replicas":
        ghost["replicas"] = value
    else:
        ghost["template"]["spec"]["parallelism"] = value
    with pytest.raises(JobModelError, match=rf"^replicatedJobs\[ghost\]\.(template\.spec\.)?{field} must be an integer"):
        _job(build, _with_jobs(build.runtime(), ghost), numNodes=2)


@pytest.fixture
def pod_spec_gpus(build) -> dict:
    return build.pod_spec(gpus=4)


def test_zero_replicas_is_no_pods(build, pod_spec_gpus):
    job = _job(build, _with_jobs(build.runtime(), {"name": "idle", "replicas": 0,
                                                   "template": {"spec": {"template": {"spec": pod_spec_gpus}}}}), numNodes=2)
    assert next(p for p in job.pod_sets if p.name == "idle").count == 0


def test_many_replicated_jobs_are_refused_before_any_work(build, pod_spec_gpus):
    """A runtime of 1000 jobs (every list under the input limit) must not cost a copy of each."""
    jobs = [{"name": f"j{i}", "template": {"spec": {"template": {"spec": pod_spec_gpus}}}} for i in range(40)]
    with pytest.raises(JobModelError, match="42 replicated jobs, more than 32"):  # the runtime's 2 and 40
        _job(build, _with_jobs(build.runtime(), *jobs), numNodes=2)


@pytest.mark.parametrize("field, value", [("replicas", "5"), ("replicas", -1), ("replicas", True)])
def test_mpijob_counts_are_integers_too(example_job, example_state, field, value):
    obj = example_job("legacy-mpijob")
    obj["spec"]["mpiReplicaSpecs"]["Worker"][field] = value
    with pytest.raises(JobModelError, match=rf"^spec\.mpiReplicaSpecs\.Worker\.{field} must be an integer"):
        effective(obj, example_state)
    obj["spec"]["mpiReplicaSpecs"]["Worker"][field] = 0  # zero workers is a valid MPIJob
    assert effective(obj, example_state).workers.count == 0


def test_unsupported_object_is_an_error(build):
    with pytest.raises(JobModelError, match="unsupported object batch/v1/Job"):
        effective({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}}, build.state())


# --- properties -------------------------------------------------------------------------------

_cpu = st.integers(min_value=1, max_value=64_000).map(lambda m: f"{m}m")
_memory = st.integers(min_value=1, max_value=1 << 12).map(lambda m: f"{m}Mi")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(num_nodes=st.integers(min_value=1, max_value=200), launcher_as_node=st.booleans(),
       cpu=_cpu, memory=_memory, gpus=st.integers(min_value=0, max_value=16),
       launcher_cpu=_cpu)
def test_totals_equal_sum_over_pod_sets(build, num_nodes, launcher_as_node, cpu, memory, gpus, launcher_cpu):
    runtime = build.runtime(launcher_as_node=launcher_as_node, launcher=build.pod_spec(cpu=launcher_cpu))
    per_node: dict = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        per_node["limits"] = {"nvidia.com/gpu": gpus}
    job = _job(build, runtime, numNodes=num_nodes, resourcesPerNode=per_node)
    totals = job.totals
    assert totals["pods"] == sum(ps.count for ps in job.pod_sets)
    for key in ("cpu", "memory"):
        assert totals[key] == sum(ps.count * ps.requests.get(key, 0) for ps in job.pod_sets)
    assert totals["gpus"] == sum(ps.count * ps.gpu_count for ps in job.pod_sets)
    # And the closed form from the Trainer rules: the launcher is the trainer ancestor here, so it
    # always gets resourcesPerNode; the node job gets it only when the launcher is a node.
    workers = max(num_nodes - 1, 1) if launcher_as_node else num_nodes
    worker_cpu, worker_gpus = (to_number("cpu", cpu), gpus) if launcher_as_node else (1000, 0)
    assert job.workers.count == workers and job.launcher.count == 1
    assert totals["gpus"] == workers * worker_gpus + gpus
    assert totals["cpu"] == workers * worker_cpu + to_number("cpu", cpu)


_json_leaf = st.one_of(st.integers(), st.text(max_size=5), st.booleans())
_keys = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
_tree = st.recursive(_json_leaf, lambda children: st.dictionaries(_keys, children, max_size=4), max_leaves=8)


def _paths(tree, prefix=()):
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from _paths(value, prefix + (key,))
    elif not isinstance(tree, dict):  # an empty map in a patch changes nothing
        yield prefix, tree


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


@settings(max_examples=100, deadline=None)
@given(base=st.dictionaries(_keys, _tree, max_size=5), patch=st.dictionaries(_keys, _tree, max_size=5))
def test_smp_merge_never_drops_keys_the_patch_does_not_name(base, patch):
    before = copy.deepcopy(base), copy.deepcopy(patch)
    merged = smp.merge(base, patch)
    assert (base, patch) == before  # inputs untouched
    _check_kept(base, patch, merged)
    for path, value in _paths(patch):
        if path:
            assert _get(merged, path) == value  # patch leaves always land


def _check_kept(base, patch, merged):
    for key, value in base.items():
        if key not in patch:
            assert merged[key] == value
        elif isinstance(value, dict) and isinstance(patch[key], dict):
            _check_kept(value, patch[key], merged[key])


def _has_path(tree, path):
    try:
        _get(tree, path)
        return True
    except (KeyError, TypeError):
        return False


@settings(max_examples=120, deadline=None)
@given(base_env=st.lists(st.sampled_from("ABCDE"), unique=True, max_size=5),
       patch_env=st.lists(st.sampled_from("ABCDEFG"), unique=True, max_size=5))
def test_smp_merge_lists_by_key_keep_unpatched_items_in_order(base_env, patch_env):
    base = {"env": [{"name": n, "value": "base"} for n in base_env]}
    patch = {"env": [{"name": n, "value": "patch"} for n in patch_env]}
    merged = smp.merge(base, patch)["env"]
    names = [e["name"] for e in merged]
    assert names == base_env + [n for n in patch_env if n not in base_env]
    for entry in merged:
        assert entry["value"] == ("patch" if entry["name"] in patch_env else "base")


_SUFFIXES = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


@settings(max_examples=200, deadline=None)
@given(value=st.integers(min_value=0, max_value=10**6), suffix=st.sampled_from(sorted(_SUFFIXES)),
       resource=st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "requests.cpu", "limits.memory"]))
def test_quantities_parse_like_the_api(value, suffix, resource):
    exact = Decimal(value) * Decimal(_SUFFIXES[suffix])
    if resource.endswith("cpu"):
        exact *= 1000  # millicores
    assert to_number(resource, f"{value}{suffix}") == math.ceil(exact)  # the API rounds up


@pytest.mark.parametrize("bad", ["", "1.2.3", "ten", "1Gb", None, [1]])
def test_quantities_reject_what_the_api_rejects(bad):
    with pytest.raises(QuantityError):
        numbers({"memory": bad})


def test_quantity_decimal_and_exponent_forms():
    assert to_number("cpu", "0.5") == 500
    assert to_number("cpu", "1e3") == 1_000_000
    assert to_number("cpu", "1u") == 1  # a microcore rounds up to a millicore
    assert to_number("memory", "1.5Gi") == 3 * (1 << 29)


# --- values of the wrong type (/mutate sees objects before the API server's schema check) ------
def _every_path(node, path=()):
    yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _every_path(child, (*path, key))


def _replaced(obj: dict, path: tuple, value) -> dict:
    obj = copy.deepcopy(obj)
    holder = obj
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return obj


@pytest.mark.parametrize("name", ["allowed", "legacy-mpijob"])
def test_a_value_of_the_wrong_type_anywhere_is_a_job_model_denial_never_a_crash(name, example_job, example_state):
    job = example_job(name)
    paths = [p for p in _every_path(job) if p and p[0] == "spec"]
    assert len(paths) > 10
    for path in paths:
        for value in ("junk", 7, ["x"], None, {"x": 1}):
            try:
                effective(_replaced(job, path, value), example_state)
            except JobModelError:
                pass
            # any other exception fails the test, naming the path
