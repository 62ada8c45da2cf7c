"""The schedulability pre-check through the engine: Nodes in the cluster state refuse a job that
can never be placed, warn about one that cannot start now, and say nothing without Nodes."""
from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest

from trainjob_admission.policies.checks import schedulability
from trainjob_admission.policies.checks.base import CheckContext
from trainjob_admission.policies.checks.schedulability import SchedulabilityCheck
from trainjob_admission.policies.job.effective_job import EffectiveJob, PodSet
from trainjob_admission.policies.k8s.clusterstate import ClusterState, load_objects

ROOT = Path(__file__).resolve().parents[2]
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def node(name, cpu="64", memory="256Gi", gpus=0, taints=(), labels=None, unschedulable=False):
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": list(taints), **({"unschedulable": True} if unschedulable else {})},
            "status": {"allocatable": allocatable}}


def gpu_nodes(count, gpus=8, **kwargs):
    return [node(f"gpu-{i}", gpus=gpus, taints=[GPU_TAINT], **kwargs) for i in range(count)]


def bound_pod(name, node_name, gpus, phase="Running"):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "other"},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": phase}}


@pytest.fixture
def setup(build, make_bundle, review):
    """review(job objects..., nodes, **settings) with a bundle holding only this check; a runtime
    whose workers ask ``gpus`` and tolerate the GPU taint, a 1-cpu launcher without GPUs, and a
    small node only that launcher fits."""

    def run(nodes, *, num_nodes=2, gpus=8, tolerate=True, extra=(), settings=None, labels=None, operation="CREATE",
            suspend=None, node_spec=None, resumed=False):
        worker = node_spec or build.pod_spec(cpu="8", memory="32Gi", gpus=gpus,
                                             **({"tolerations": TOLERATE_GPU} if tolerate else {}))
        runtime = build.runtime(launcher_as_node=False, node=worker, launcher=build.pod_spec(cpu="1", memory="2Gi"))
        job = build.trainjob(numNodes=num_nodes, labels=labels)
        if suspend is not None:
            job["spec"]["suspend"] = suspend
        host = [node("launcher-host", cpu="2", memory="4Gi")] if nodes else []  # for the launcher alone
        state = build.state(runtime, build.namespace(), *nodes, *host, *extra)
        bundle = make_bundle({"checks": {"schedulability": settings or {}}})
        old = None
        if operation == "UPDATE":
            old = copy.deepcopy(job)
            if resumed:
                old["spec"]["suspend"] = True
        return review(job, [bundle], state, operation=operation, old=old)

    return run


def result(decision, effect="deny"):
    found = [r for r in decision.results if r.rule == "schedulability" and r.effect.value == effect
             and r.result.value == "fail"]
    return found[0] if found else None


def test_a_worker_larger_than_every_node_is_refused_with_the_numbers_and_the_fix(setup):
    decision = setup(gpu_nodes(2) + [node("cpu-1")], gpus=9)
    assert not decision.allowed
    (message,), (fix,) = result(decision).messages, result(decision).remediations
    assert message == ("each node asks 9 nvidia.com/gpu and fits on none of the 4 cluster nodes: 2 cluster nodes have 8 "
                       "nvidia.com/gpu; 2 cluster nodes have no nvidia.com/gpu")
    assert fix.startswith("ask for at most 8 nvidia.com/gpu per pod (")
    assert "more nodes" not in fix  # fewer GPUs per node only: the count of nodes is the quota's to say


def test_one_node_takes_the_singular(setup):
    decision = setup(gpu_nodes(1, gpus=4) + gpu_nodes(2)[1:], gpus=9)
    assert result(decision).messages[0].endswith(
        "1 cluster node has 4 nvidia.com/gpu; 1 cluster node has 8 nvidia.com/gpu; 1 cluster node has no nvidia.com/gpu")


def test_a_job_larger_than_the_cluster_is_refused_with_the_total(setup):
    decision = setup(gpu_nodes(4), num_nodes=5)
    (message,), (fix,) = result(decision).messages, result(decision).remediations
    assert message == ("the job needs 40 nvidia.com/gpu at once (5 nodes x 8); the 4 cluster nodes that can take its pods "
                       "have 32 in all")
    assert fix == "set spec.trainer.numNodes to 4, or ask your admin for more cluster nodes"
    assert setup(gpu_nodes(4), num_nodes=4).allowed


def test_more_workers_than_nodes_that_hold_one_is_refused(setup):
    decision = setup([node(f"c{i}", cpu="12") for i in range(2)], gpus=0, num_nodes=3)
    (message,) = result(decision).messages
    assert message == ("the job runs 3 nodes at once, but the 2 cluster nodes that can take one hold 2 of them in all "
                       "(2 cluster nodes x 1)")
    assert result(decision).remediations == [
        "set spec.trainer.numNodes to 2, or ask for less per pod so that more fit on a cluster node"]


def test_without_nodes_the_check_says_nothing(setup):
    decision = setup([], gpus=9)
    assert result(decision) is None and result(decision, "warn") is None


def test_an_untolerated_taint_refuses_unless_a_queue_may_add_the_toleration(setup):
    nodes = gpu_nodes(2)
    denied = setup(nodes, tolerate=False)
    assert "2 cluster nodes have the taint nvidia.com/gpu=present:NoSchedule that it does not tolerate" in result(denied).messages[0]
    assert "tolerations of replicatedJobs[node] through spec.runtimePatches" in result(denied).remediations[0]
    queued = setup(nodes, tolerate=False, labels={"kueue.x-k8s.io/queue-name": "gpu"})
    assert queued.allowed and "ResourceFlavor adds the tolerations" in result(queued, "warn").messages[0]
    strict = setup(nodes, tolerate=False, labels={"kueue.x-k8s.io/queue-name": "gpu"},
                   settings={"queueAddsTolerations": False})
    assert not strict.allowed


def test_label_mismatch_is_named(setup, build):
    worker = build.pod_spec(cpu="8", memory="32Gi", gpus=4, tolerations=TOLERATE_GPU,
                            nodeSelector={"nvidia.com/gpu.product": "A100"})
    decision = setup(gpu_nodes(3, labels={"nvidia.com/gpu.product": "H100"}), node_spec=worker)
    assert result(decision).messages[0] == ("each node fits on none of the 4 cluster nodes: 4 cluster nodes lack label "
                                            "nvidia.com/gpu.product=A100")


def test_cordoned_and_not_ready_nodes_still_count_for_ever_but_warn_now(setup):
    nodes = gpu_nodes(1, unschedulable=True) + [node("gpu-nr", gpus=8, taints=[
        GPU_TAINT, {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])]
    decision = setup(nodes, extra=[], num_nodes=2)
    assert decision.allowed and result(decision) is None
    assert result(decision, "warn") is None  # nothing is known of the pods: no "now" verdict
    busy = setup(nodes, extra=[bound_pod("p", "elsewhere", 1)], num_nodes=2)
    (message,) = result(busy, "warn").messages
    assert message.startswith("the job fits the cluster nodes but not their free capacity: no cluster node has room "
                              "for one node now (1 cluster node is cordoned (spec.unschedulable); 1 cluster node has the "
                              "taint node.kubernetes.io/not-ready:NoSchedule")


def test_busy_nodes_warn_with_what_is_free(setup):
    nodes = gpu_nodes(4)
    pods = [bound_pod("a", "gpu-0", 8), bound_pod("b", "gpu-1", 4), bound_pod("done", "gpu-2", 8, phase="Succeeded")]
    decision = setup(nodes, num_nodes=3, extra=pods)
    assert decision.allowed
    (message,) = result(decision, "warn").messages
    # gpu-0 is full, gpu-1 has 4 of 8 left (less than a worker), a finished pod holds nothing
    assert message == ("the job fits the cluster nodes but not their free capacity: it needs 24 nvidia.com/gpu at "
                       "once and the cluster nodes with room for one of its pods have 16 free now (2 cluster nodes); its "
                       "pods wait in Pending until enough is free")
    assert result(setup(nodes, num_nodes=2, extra=pods), "warn") is None
    assert result(setup(nodes, num_nodes=3, extra=pods, settings={"warnWhenBusy": False}), "warn") is None
    assert result(setup(nodes, num_nodes=3, extra=pods, suspend=True), "warn") is None  # waits in its queue
    # a running job's own pods hold its room: an UPDATE does not warn
    assert result(setup(nodes, num_nodes=3, extra=pods, operation="UPDATE"), "warn") is None
    assert result(setup(nodes, num_nodes=3, extra=pods, operation="UPDATE", resumed=True), "warn") is not None


def test_on_update_the_job_exists_so_a_refusal_becomes_advice(setup):
    decision = setup(gpu_nodes(4), num_nodes=5, operation="UPDATE")
    assert decision.allowed and "40 nvidia.com/gpu" in result(decision, "warn").messages[0]


def test_init_and_sidecar_containers_count_as_the_scheduler_counts_them(setup, build):
    """An init container's request is the pod's if larger; a sidecar adds to the containers."""
    init = build.pod_spec(cpu="8", memory="8Gi", initContainers=[
        {"name": "prep", "image": "busybox", "resources": {"requests": {"cpu": "20", "memory": "1Gi"}}}])
    assert "asks 20 cpu" in result(setup([node("c0", cpu="16")], node_spec=init, num_nodes=1)).messages[0]
    sidecar = build.pod_spec(cpu="10", memory="8Gi", initContainers=[
        {"name": "proxy", "image": "envoy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "8"}}}])
    assert "asks 18 cpu" in result(setup([node("c0", cpu="16")], node_spec=sidecar, num_nodes=1)).messages[0]
    assert setup([node("c0", cpu="18")], node_spec=sidecar, num_nodes=1).allowed


def phased_job(depends_on):
    """An initializer holding 8 GPUs, then 4 workers with 8 each."""
    init = PodSet("dataset-initializer", "initializer", 1, {"spec": {}}, "rt", requests={"nvidia.com/gpu": 8})
    workers = PodSet("node", "worker", 4, {"spec": {}}, "rt", requests={"nvidia.com/gpu": 8}, depends_on=depends_on)
    return EffectiveJob("TrainJob", "j", "team-a", {}, {}, {}, [init, workers], {})


@pytest.mark.parametrize("status, refused", [("Complete", False), ("Ready", True)])
def test_pod_sets_chained_by_depends_on_complete_never_run_together(status, refused):
    state = ClusterState.from_objects([node(f"g{i}", gpus=8) for i in range(4)])
    job = phased_job((("dataset-initializer", status),))
    findings = schedulability.check(CheckContext(job, state=state), SchedulabilityCheck())
    assert bool(findings) is refused
    if refused:
        assert findings[0].message.startswith("the job needs 40 nvidia.com/gpu at once")


def test_nodes_are_parsed_once_per_state_version():
    state = ClusterState.from_objects([node("a"), node("b")])
    first = schedulability.classes(state)
    assert schedulability.classes(state) is first and len(first) == 1 and first[0].count == 2
    state.upsert(node("c", cpu="8"))
    assert len(schedulability.classes(state)) == 2


def test_review_with_nodes_in_the_state_file_decides_the_same():
    files = ["runtimes/mpi-openmpi.yaml", "cluster-nodes.yaml"]
    args = [str(ROOT / ".venv/bin/trainjob-admission"), "review", "-f", "examples/jobs/too-many-gpus.yaml"]
    for name in files:
        args += ["--cluster-state", f"examples/{name}"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert ("x default/schedulability: each node asks 9 nvidia.com/gpu and fits on none of the 6 cluster nodes" in out.stdout)
    assert len(load_objects(ROOT / "examples/cluster-nodes.yaml")) == 6


def test_a_failed_packing_only_warns():
    """A 7-cpu launcher and three 4-cpu workers on two 10-cpu nodes: no placement, but the refusal
    rules are necessary conditions only, and a packing is not one."""
    launcher = PodSet("launcher", "launcher", 1, {"spec": {}}, "rt", requests={"cpu": 7000})
    workers = PodSet("node", "worker", 3, {"spec": {}}, "rt", requests={"cpu": 4000})
    job = EffectiveJob("TrainJob", "j", "team-a", {}, {}, {}, [launcher, workers], {})
    state = ClusterState.from_objects([node(f"c{i}", cpu="10") for i in range(2)])
    (finding,) = schedulability.check(CheckContext(job, state=state), SchedulabilityCheck())
    assert finding.severity == "warn"
    assert finding.message == "the job's 4 pods may not fit the cluster nodes all at once: a first-fit packing placed 3 of them"
    ignored = SchedulabilityCheck(ignoredResources=["c*"])  # nothing left to judge but the pod count
    assert schedulability.check(CheckContext(job, state=state), ignored) == []


def gpu_job(launcher_gpus, workers, gpus):
    launcher = PodSet("launcher", "launcher", 1, {"spec": {}}, "rt", requests={"nvidia.com/gpu": launcher_gpus})
    nodes = PodSet("node", "worker", workers, {"spec": {}}, "rt", requests={"nvidia.com/gpu": gpus})
    return EffectiveJob("TrainJob", "j", "team-a", {}, {}, {}, [launcher, nodes], {})


def test_pods_of_several_sets_that_no_node_holds_two_of_are_refused_and_the_fix_passes():
    """A 5-GPU launcher and two 5-GPU workers on two 8-GPU nodes: 15 of 16 GPUs, but a node
    holds one 5-GPU pod, so three cannot run; the suggested worker count can."""
    state = ClusterState.from_objects([node(f"g{i}", gpus=8) for i in range(2)])
    (finding,) = schedulability.check(CheckContext(gpu_job(5, 2, 5), state=state), SchedulabilityCheck())
    assert finding.severity is None and finding.message.startswith(
        "the job runs 3 pods that ask for nvidia.com/gpu at once (the launcher x 5 + 2 nodes x 5)")
    assert finding.nodes_at_most == 1 and finding.remediation.startswith("ask for less nvidia.com/gpu per pod")
    assert schedulability.check(CheckContext(gpu_job(5, 1, 5), state=state), SchedulabilityCheck()) == []


@pytest.mark.parametrize("workers", [4, 6, 9])
def test_the_suggested_worker_count_always_passes(workers):
    state = ClusterState.from_objects([node(f"g{i}", gpus=8) for i in range(3)])
    (finding,) = schedulability.check(CheckContext(gpu_job(3, workers, 5), state=state), SchedulabilityCheck())
    most = finding.nodes_at_most
    assert schedulability.check(CheckContext(gpu_job(3, most, 5), state=state), SchedulabilityCheck()) == []
    assert schedulability.check(CheckContext(gpu_job(3, most + 1, 5), state=state), SchedulabilityCheck())


def test_a_resource_no_node_offers_warns_instead_of_refusing():
    """GPU pools that scale from zero and DRA-served extended resources have no node listing them."""
    state = ClusterState.from_objects([node("cpu-1"), node("cpu-2")])
    (finding,) = schedulability.check(CheckContext(gpu_job(0, 2, 8), state=state), SchedulabilityCheck())
    assert finding.severity == "warn"
    assert finding.message == "no cluster node offers nvidia.com/gpu now (of the 2 cluster nodes), so the pre-check leaves it out"
    assert "DRA" in finding.remediation


def test_nodes_may_be_added_turns_never_into_a_warning():
    state = ClusterState.from_objects([node(f"g{i}", gpus=8) for i in range(2)])
    (finding,) = schedulability.check(CheckContext(gpu_job(0, 3, 8), state=state),
                                      SchedulabilityCheck(nodesMayBeAdded=True))
    assert finding.severity == "warn" and finding.message.endswith("it runs only if cluster nodes that take it are added")


def test_one_node_takes_the_singular_in_totals():
    state = ClusterState.from_objects([node("g0", gpus=8)])
    (finding,) = schedulability.check(CheckContext(gpu_job(0, 2, 8), state=state), SchedulabilityCheck())
    assert finding.message.endswith("the 1 cluster node that can take its pods has 8 in all")


def test_only_a_queue_the_user_named_may_add_tolerations():
    """A bundle that labels every job with a default queue does not make taint refusals advice."""
    worker = PodSet("node", "worker", 1, {"spec": {}}, "rt", requests={"cpu": 1000})
    job = EffectiveJob("TrainJob", "j", "team-a", {}, {}, {}, [worker], {})
    state = ClusterState.from_objects(gpu_nodes(2))
    labelled = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu"}}}
    (denied,) = schedulability.check(CheckContext(job, state=state, object=labelled, submitted={}), SchedulabilityCheck())
    assert denied.severity is None
    (warned,) = schedulability.check(CheckContext(job, state=state, object=labelled, submitted=labelled),
                                     SchedulabilityCheck())
    assert warned.severity == "warn" and "it names the Kueue queue gpu (kueue.x-k8s.io/queue-name)" in warned.message


def test_writes_that_change_nothing_kept_keep_the_dicts_and_a_finished_pod_is_dropped():
    state = ClusterState.from_objects([node("a"), node("b")])
    state.replace("Pod", [bound_pod("p1", "a", 2), bound_pod("p2", "b", 1)])
    nodes, pods = state.nodes, state.pods
    heartbeat = {**node("a"), "status": {**node("a")["status"], "conditions": [{"type": "Ready"}]}}
    state.upsert(heartbeat)
    state.upsert({**bound_pod("p1", "a", 2), "status": {"phase": "Running", "podIP": "10.0.0.1"}})
    assert state.nodes is nodes and state.pods is pods  # the caches built on them stay
    state.upsert(bound_pod("p2", "b", 1, phase="Succeeded"))  # finished: it holds nothing any more
    assert set(state.pods) == {("other", "p1")} and set(pods) == {("other", "p1"), ("other", "p2")}


def test_node_usage_follows_each_pod_event_as_a_full_recount_would():
    """The per-node sums the state keeps on each Pod write equal a recount from the pods, through
    adds, changes, finishing, deletes and relists."""
    state = ClusterState()
    state.replace("Pod", [bound_pod("a", "n1", 2), bound_pod("b", "n1", 1), bound_pod("c", "n2", 4)])
    events = [("upsert", bound_pod("d", "n2", 3)), ("upsert", bound_pod("a", "n1", 5)),
              ("upsert", bound_pod("b", "n1", 1, phase="Succeeded")), ("delete", bound_pod("c", "n2", 4)),
              ("delete", bound_pod("zz", "n3", 1)), ("upsert", bound_pod("e", "n3", 0))]
    for verb, pod in events:
        getattr(state, verb)(pod)
        recount = ClusterState()
        recount.replace("Pod", list(state.pods.values()))
        assert state.node_usage == recount.node_usage, (verb, pod["metadata"]["name"])
    assert state.node_usage == {"n1": {"pods": 1, "nvidia.com/gpu": 5}, "n2": {"pods": 1, "nvidia.com/gpu": 3},
                                "n3": {"pods": 1}}
