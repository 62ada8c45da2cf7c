"""The Kueue pre-check: queues that exist, capacity that can be had (Kueue v0.19.0's arithmetic
on cohorts, borrowing and lending limits), flavors the pods can use, gang admission by policy,
and the default queue added only where that LocalQueue exists."""
from __future__ import annotations

import pytest

from trainjob_admission.policies.capacity import clusterqueues

KUEUE = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
TOLERATE_GPU = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]


def flavor_quota(name, **resources):
    """One flavor of a resource group: resource -> nominal, or (nominal, borrowingLimit, lendingLimit)."""
    out = []
    for resource, value in resources.items():
        nominal, borrowing, lending = value if isinstance(value, tuple) else (value, None, None)
        quota = {"name": resource.replace("_", "/").replace("nvidia/gpu", GPU), "nominalQuota": str(nominal)}
        if borrowing is not None:
            quota["borrowingLimit"] = str(borrowing)
        if lending is not None:
            quota["lendingLimit"] = str(lending)
        out.append(quota)
    return {"name": name, "resources": out}


ABSENT = object()  # a ClusterQueue without namespaceSelector (Kueue: no namespace)


def cluster_queue(name, *groups, cohort=None, reserved=None, pending=0, selector=None, stop=None):
    """``selector``: its namespaceSelector; None gives {} (every namespace), ABSENT leaves it out."""
    spec = {"resourceGroups": [{"coveredResources": [r["name"] for r in flavors[0]["resources"]],
                                "flavors": list(flavors)} for flavors in groups]}
    if cohort:
        spec["cohortName"] = cohort
    if selector is not ABSENT:
        spec["namespaceSelector"] = {} if selector is None else selector
    if stop:
        spec["stopPolicy"] = stop
    status = {"pendingWorkloads": pending}
    if reserved:
        status["flavorsReservation"] = [{"name": f, "resources": [{"name": r, "total": str(n)} for r, n in res.items()]}
                                        for f, res in reserved.items()]
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec, "status": status}


def cohort(name, *groups, parent=None):
    spec = {"resourceGroups": [{"coveredResources": [r["name"] for r in flavors[0]["resources"]],
                                "flavors": list(flavors)} for flavors in groups]}
    if parent:
        spec["parentName"] = parent
    return {"apiVersion": KUEUE, "kind": "Cohort", "metadata": {"name": name}, "spec": spec}


def local_queue(name, cq, namespace="team-a", pending=0):
    return {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cq}, "status": {"pendingWorkloads": pending}}


def resource_flavor(name, labels=None, taints=None, tolerations=None):
    spec = {}
    if labels:
        spec["nodeLabels"] = labels
    if taints:
        spec["nodeTaints"] = taints
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def priority_class(name, value=100):
    return {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}


def forest(*objects):
    cqs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterQueue"}
    cohorts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Cohort"}
    return clusterqueues.Forest(cqs, cohorts)


# -- Kueue's arithmetic (pkg/cache/scheduler/resource_node.go), worked by hand -----------------

def test_a_queue_without_a_cohort_can_use_its_nominal_quota_and_no_more():
    tree = forest(cluster_queue("a", [flavor_quota("gpu", nvidia_gpu=16)], reserved={"gpu": {GPU: 10}}))
    assert tree.potential("a", ("gpu", GPU)) == 16
    assert tree.available("a", ("gpu", GPU)) == 6


def test_a_cohort_lends_what_its_members_do_not_keep_and_borrowing_limits_cap_it():
    tree = forest(cluster_queue("a", [flavor_quota("gpu", nvidia_gpu=(16, 8, None))], cohort="c"),
                  cluster_queue("b", [flavor_quota("gpu", nvidia_gpu=(32, None, 24))], cohort="c",
                                reserved={"gpu": {GPU: 20}}))
    # b keeps 32 - 24 = 8 local; the cohort holds 16 + 24 = 40.
    assert tree.subtree(("cohort", "c"), ("gpu", GPU)) == 40
    assert tree.potential("a", ("gpu", GPU)) == 24  # 0 local + 40, capped at 16 + borrowingLimit 8
    assert tree.potential("b", ("gpu", GPU)) == 48  # 8 local + 40
    # b uses 20: 8 from its local quota, 12 in the cohort; a may take 16 + 8 but only 28 are free there.
    assert tree.available("a", ("gpu", GPU)) == 24
    assert tree.available("b", ("gpu", GPU)) == 28


def test_a_parent_cohort_with_its_own_quota_lends_down_the_tree():
    tree = forest(cluster_queue("a", [flavor_quota("gpu", nvidia_gpu=8)], cohort="child"),
                  cohort("child", parent="root"),
                  cohort("root", [flavor_quota("gpu", nvidia_gpu=(16, None, None))]))
    assert tree.potential("a", ("gpu", GPU)) == 24


def test_a_cohort_cycle_is_found_and_nothing_is_lent_through_it():
    tree = forest(cluster_queue("a", [flavor_quota("gpu", nvidia_gpu=8)], cohort="x"),
                  cohort("x", parent="y"), cohort("y", parent="x"))
    assert tree.in_cycle("a")
    assert tree.potential("a", ("gpu", GPU)) == 8


def test_the_forest_is_built_once_per_version_of_the_watched_dicts():
    cqs, cohorts = {"a": cluster_queue("a", [flavor_quota("gpu", nvidia_gpu=8)])}, {}
    assert clusterqueues.forest(cqs, cohorts) is clusterqueues.forest(cqs, cohorts)
    assert clusterqueues.forest(dict(cqs), cohorts) is not clusterqueues.forest(cqs, cohorts)


# -- the check through the engine ----------------------------------------------------------

QUEUED = {clusterqueues.QUEUE_LABEL: "team-queue"}
DEFAULT_OBJECTS = (
    resource_flavor("default-flavor"),
    resource_flavor("a100", labels={"nvidia.com/gpu.product": "A100"},
                    taints=[{"key": GPU, "value": "present", "effect": "NoSchedule"}]),
    local_queue("team-queue", "team-cq"),
)


@pytest.fixture
def setup(build, make_bundle, review):
    """review a job (workers ask ``gpus`` each, tolerate the GPU taint) against Kueue objects."""

    def run(*objects, num_nodes=2, gpus=8, labels=QUEUED, settings=None, mutations=None, tolerate=True,
            runtime_extra=None, namespace_labels=None, launcher=None):
        worker = build.pod_spec(cpu="8", memory="32Gi", gpus=gpus, **({"tolerations": TOLERATE_GPU} if tolerate else {}))
        runtime = build.runtime(launcher_as_node=False, node=worker,
                                launcher=launcher or build.pod_spec(cpu="1", memory="2Gi"))
        runtime["spec"].update(runtime_extra or {})
        job = build.trainjob(numNodes=num_nodes, labels=labels)
        state = build.state(runtime, build.namespace(labels=namespace_labels), *objects)
        spec = {"checks": {"kueue": settings or {}}}
        if mutations:
            spec["mutations"] = mutations
        return review(job, [make_bundle(spec)], state)

    return run


def gpu_queue(gpus=16, cpu=100, **kwargs):
    return cluster_queue("team-cq", [flavor_quota("default-flavor", cpu=cpu, memory="1Ti")],
                         [flavor_quota("a100", nvidia_gpu=gpus)], **kwargs)


def finding(decision, effect="deny"):
    found = [r for r in decision.results if r.rule == "kueue" and r.effect.value == effect and r.result.value == "fail"]
    return (found[0].messages[0], found[0].remediations[0]) if found else None


def test_a_job_that_fits_now_is_admitted_and_the_record_names_queue_and_flavors(setup):
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS)
    assert decision.allowed and not decision.warnings
    facts = decision.facts["kueue"]
    assert facts["queue"] == "team-queue" and facts["clusterQueue"] == "team-cq" and facts["verdict"] == "fits now"
    assert facts["flavors"]["node"] == {"cpu": "default-flavor", "memory": "default-flavor", GPU: "a100"}


def test_a_missing_local_queue_is_refused_with_the_queues_that_exist(setup):
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS, local_queue("other", "team-cq"),
                     labels={clusterqueues.QUEUE_LABEL: "typo"})
    message, fix = finding(decision)
    assert message == ("label kueue.x-k8s.io/queue-name names the LocalQueue typo, which does not exist in team-a "
                       "(the LocalQueues there are other, team-queue); Kueue would keep the job suspended for ever")
    assert fix == "set the label kueue.x-k8s.io/queue-name to other or team-queue (the LocalQueues in team-a)"


def test_a_local_queue_of_a_missing_cluster_queue_is_refused(setup):
    decision = setup(cluster_queue("other-cq", [flavor_quota("default-flavor", cpu=1)]), *DEFAULT_OBJECTS)
    assert "points to the ClusterQueue team-cq, which does not exist" in finding(decision)[0]
    assert setup(*DEFAULT_OBJECTS).allowed  # no ClusterQueues in the state: not known, not judged


def test_a_cluster_queue_that_does_not_select_the_namespace_is_refused(setup):
    decision = setup(gpu_queue(selector={"matchLabels": {"team": "research"}}), *DEFAULT_OBJECTS,
                     namespace_labels={"team": "ops"})
    assert "does not admit jobs from namespace team-a" in finding(decision)[0]
    assert setup(gpu_queue(selector={"matchLabels": {"team": "research"}}), *DEFAULT_OBJECTS,
                 namespace_labels={"team": "research"}).allowed


def test_a_cluster_queue_without_a_namespace_selector_admits_from_no_namespace(setup):
    """Kueue reads an absent namespaceSelector as labels.Nothing(): the job would wait for ever."""
    decision = setup(gpu_queue(selector=ABSENT), *DEFAULT_OBJECTS)
    message, fix = finding(decision)
    assert message == ("ClusterQueue team-cq does not admit jobs from namespace team-a (it has no namespaceSelector, "
                       "which Kueue reads as no namespace); Kueue would keep the job suspended for ever")
    assert fix == "ask your admin to set namespaceSelector on ClusterQueue team-cq ({} selects every namespace)"


def test_a_job_larger_than_its_cluster_queue_can_ever_give_is_refused_with_the_numbers(setup):
    decision = setup(gpu_queue(gpus=16), *DEFAULT_OBJECTS, num_nodes=3)
    message, fix = finding(decision)
    assert message == ("pod set node needs 24 nvidia.com/gpu (3 x 8) in one flavor; ClusterQueue team-cq "
                       "(LocalQueue team-queue) can ever provide at most 16 in flavor a100 (its nominal quota), "
                       "so Kueue never admits the job")
    assert fix == "set spec.trainer.numNodes to 2, or ask your admin to raise the quota"
    assert decision.facts["kueue"]["verdict"] == "never"


def test_what_the_cohort_may_lend_counts_toward_ever(setup):
    objects = (gpu_queue(gpus=16, cohort="research"),
               cluster_queue("lender", [flavor_quota("a100", nvidia_gpu=8)], cohort="research"), *DEFAULT_OBJECTS)
    assert setup(*objects, num_nodes=3).allowed
    message, _ = finding(setup(*objects, num_nodes=4))
    assert "at most 24 in flavor a100 (nominal 16 + 8 it may borrow from cohort research)" in message


def test_a_job_that_fits_but_not_now_is_admitted_with_what_is_reserved_and_pending(setup):
    decision = setup(gpu_queue(gpus=16, reserved={"a100": {GPU: 12}}, pending=3), *DEFAULT_OBJECTS)
    assert decision.allowed
    message, fix = finding(decision, "warn")
    assert message == ("the job waits in ClusterQueue team-cq: it needs 16 nvidia.com/gpu in flavor a100, where its "
                       "admitted workloads hold 12 (nominal quota 16, at most 16 with borrowing) and 4 is free now; "
                       "3 workloads pending in team-cq")
    assert fix.startswith("none needed: Kueue keeps it suspended")
    assert decision.facts["kueue"]["verdict"] == "waits for quota"


def test_a_resource_the_cluster_queue_does_not_cover_is_refused(setup):
    only_cpu = cluster_queue("team-cq", [flavor_quota("default-flavor", cpu=100, memory="1Ti")])
    message, _ = finding(setup(only_cpu, *DEFAULT_OBJECTS))
    assert message.startswith("pod set node requests nvidia.com/gpu, which ClusterQueue team-cq (LocalQueue team-queue) "
                              "does not cover (it covers cpu, memory)")


def test_a_tainted_flavor_the_pods_do_not_tolerate_is_no_flavor_for_them(setup):
    message, _ = finding(setup(gpu_queue(), *DEFAULT_OBJECTS, tolerate=False))
    assert message == ("no ResourceFlavor of ClusterQueue team-cq (LocalQueue team-queue) can take pod set node: flavor "
                       "a100 has the taint nvidia.com/gpu=present:NoSchedule, which the pods do not tolerate")


def test_a_missing_workload_priority_class_is_refused_with_those_that_exist(setup):
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS, priority_class("high"),
                     labels={**QUEUED, clusterqueues.PRIORITY_LABEL: "urgent"})
    assert finding(decision)[0] == ("label kueue.x-k8s.io/priority-class names the WorkloadPriorityClass urgent, which "
                                    "does not exist (WorkloadPriorityClasses: high); Kueue would not queue the job")


def test_gang_admission_required_refuses_an_unqueued_multi_pod_job_unless_its_runtime_gangs_it(setup):
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS, labels=None, settings={"requireGang": True})
    message, fix = finding(decision)
    assert message.startswith("job runs 3 pods together and is not gang-admitted")
    assert fix == ("set the label kueue.x-k8s.io/queue-name to team-queue (the LocalQueues in team-a), or use a "
                   "runtime with spec.podGroupPolicy")
    assert setup(gpu_queue(), *DEFAULT_OBJECTS, labels=None, settings={"requireGang": True},
                 runtime_extra={"podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}}}).allowed


def test_gang_admission_required_is_met_by_the_default_queue_the_service_adds(setup):
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS, labels=None, settings={"requireGang": True},
                     mutations={"scheduling": {"defaultQueue": "team-queue"}})
    assert decision.allowed
    assert decision.mutated["metadata"]["labels"][clusterqueues.QUEUE_LABEL] == "team-queue"
    assert decision.mutated["spec"]["suspend"] is True  # Kueue's webhook ran before ours added the label


def test_the_default_queue_is_added_only_where_that_local_queue_exists(setup):
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS, labels=None, mutations={"scheduling": {"defaultQueue": "absent"}})
    assert decision.allowed
    assert clusterqueues.QUEUE_LABEL not in (decision.mutated["metadata"].get("labels") or {})
    assert "suspend" not in decision.mutated["spec"]


def test_a_namespace_label_names_its_default_queue(setup):
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS, labels=None, namespace_labels={"queues.example.com/default": "team-queue"},
                     mutations={"scheduling": {"namespaceQueueLabel": "queues.example.com/default", "defaultQueue": "x"}})
    assert decision.mutated["metadata"]["labels"][clusterqueues.QUEUE_LABEL] == "team-queue"


def test_without_kueue_objects_in_the_state_the_queue_is_added_as_configured_and_not_judged(build, make_bundle, review):
    runtime = build.runtime()
    state = build.state(runtime, build.namespace())
    bundle = make_bundle({"checks": {"kueue": {}}, "mutations": {"scheduling": {"defaultQueue": "default"}}})
    decision = review(build.trainjob(numNodes=2), [bundle], state)
    assert decision.allowed
    assert decision.mutated["metadata"]["labels"][clusterqueues.QUEUE_LABEL] == "default"
    assert "suspend" not in decision.mutated["spec"]  # not known to be Kueue's: nothing suspends it
    assert decision.facts["kueue"]["verdict"] == "unknown: LocalQueues not known"


def test_per_namespace_priority_class_default(setup):
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS, priority_class("batch"), priority_class("high"),
                     mutations={"scheduling": {"priorityClass": "batch", "priorityClasses": {"team-a": "high"}}})
    assert decision.allowed
    assert decision.mutated["metadata"]["labels"][clusterqueues.PRIORITY_LABEL] == "high"


def test_review_strict_names_the_kueue_objects_the_state_file_left_out(build, make_bundle):
    from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate

    state = build.state(build.runtime(), build.namespace())
    bundle = make_bundle({"checks": {"kueue": {}}})
    decision = evaluate(AdmissionInput(build.trainjob(numNodes=2, labels=QUEUED)), [bundle], state, report_unchecked=True)
    assert {"check": "kueue", "reason": "no LocalQueues (whether the job's queue exists and what its ClusterQueue "
                                        "can give)"} in decision.unchecked


def test_a_queue_label_in_a_cluster_without_any_queue_only_warns(build, make_bundle, review):
    state = build.state(build.runtime(), build.namespace())
    for kind in ("LocalQueue", "ClusterQueue", "ResourceFlavor"):  # what the watches find without Kueue's CRDs
        state.replace(kind, [])
    decision = review(build.trainjob(numNodes=2, labels=QUEUED), [make_bundle({"checks": {"kueue": {}}})], state)
    assert decision.allowed
    assert finding(decision, "warn")[0].startswith("label kueue.x-k8s.io/queue-name names the LocalQueue team-queue, "
                                                   "but the cluster has no Kueue queues")


# -- what an attack review found (policies/capacity/clusterqueues.py and the check) ---------------------------

def test_a_zero_request_of_a_covered_resource_still_needs_a_flavor(setup, build):
    """Kueue keeps a covered resource asked at 0 (flavorassigner.go skips zeros only for resources
    the queue does not cover): a launcher limited to 0 GPUs needs a GPU flavor it tolerates."""
    launcher = build.pod_spec(cpu="1", memory="2Gi")
    launcher["containers"][0]["resources"]["limits"] = {GPU: 0}
    decision = setup(gpu_queue(), *DEFAULT_OBJECTS, runtime_extra=None, launcher=launcher)
    assert finding(decision)[0].startswith("no ResourceFlavor of ClusterQueue team-cq (LocalQueue team-queue) can take "
                                           "pod set launcher: flavor a100 has the taint")


def test_a_cluster_queue_naming_a_missing_flavor_is_inactive_and_only_warns(setup):
    queue = cluster_queue("team-cq", [flavor_quota("default-flavor", cpu=100, memory="1Ti")],
                          [flavor_quota("a100", nvidia_gpu=16), flavor_quota("h100-typo", nvidia_gpu=16)])
    decision = setup(queue, *DEFAULT_OBJECTS)
    assert decision.allowed
    assert finding(decision, "warn")[0] == ("ClusterQueue team-cq names the ResourceFlavor h100-typo, which does not "
                                            "exist, so Kueue admits no job from it until it does")


def test_a_cohort_tree_deeper_than_the_cap_is_not_judged_and_never_raises(setup):
    chain = [cohort(f"c{i}", parent=f"c{i + 1}") for i in range(clusterqueues.MAX_DEPTH + 5)]
    decision = setup(gpu_queue(cohort="c0"), *chain, *DEFAULT_OBJECTS, num_nodes=30)
    assert decision.allowed
    assert decision.facts["kueue"]["verdict"].startswith("unknown: its cohort tree is more than")


def test_cycles_are_found_in_one_pass_over_a_long_chain():
    chain = [cohort(f"c{i}", parent=f"c{i + 1}") for i in range(3000)] + [cohort("c3000", parent="c1500")]
    tree = forest(cluster_queue("a", [flavor_quota("gpu", nvidia_gpu=8)], cohort="c0"), *chain)
    assert tree.in_cycle("a") and len(tree.cyclic) == 3001


@pytest.mark.parametrize("damage", ["coveredResources", "resources", "nodeLabels", "nominal", "reservation"])
def test_objects_the_api_server_would_refuse_never_raise(setup, damage):
    queue = gpu_queue(reserved={"a100": {GPU: 4}})
    flavors = list(DEFAULT_OBJECTS)
    if damage == "coveredResources":
        queue["spec"]["resourceGroups"][1]["coveredResources"] = 5
    elif damage == "resources":
        queue["spec"]["resourceGroups"][1]["flavors"][0]["resources"] = 5
    elif damage == "nodeLabels":
        flavors[1] = resource_flavor("a100", labels=["x"])
    elif damage == "nominal":
        queue["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0]["nominalQuota"] = "abc"
    else:
        queue["status"]["flavorsReservation"][0]["resources"] = {"name": GPU}
    decision = setup(queue, *flavors)
    assert decision.facts["kueue"]["verdict"]  # judged or said why not; nothing raised
    if damage == "nominal":  # a number Kueue never uses is not guessed
        assert decision.allowed and decision.facts["kueue"]["verdict"].startswith("unknown: ClusterQueue team-cq has a quota")


def test_the_suggested_worker_count_fits_every_resource_of_the_group(setup, build):
    """One flavor covering cpu, memory and GPUs: the fix must leave room for all three."""
    queue = cluster_queue("team-cq", [flavor_quota("default-flavor", cpu=100, memory="100Gi", nvidia_gpu=16)])
    flavors = (resource_flavor("default-flavor"), local_queue("team-queue", "team-cq"))
    message, fix = finding(setup(queue, *flavors, num_nodes=4))
    assert fix == "set spec.trainer.numNodes to 2, or ask your admin to raise the quota"
    assert setup(queue, *flavors, num_nodes=2).allowed
    assert message.startswith("pod set node needs 32 nvidia.com/gpu (4 x 8) in one flavor")


def test_breakdowns_show_quantities_as_kubectl_does():
    assert clusterqueues.QueuedSet("node", 4, {"memory": 32 * 2**30, "cpu": 1500}, {}).breakdown("memory") == "4 x 32Gi"
