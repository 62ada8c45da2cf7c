"""GPU node targeting (spec.mutations.nodeTargeting): tolerations and required node affinity for
the pods that request accelerators only, merged as Trainer merges runtimePatches (tolerations
and nodeSelectorTerms are replaced whole, so the patch keeps what the pods had)."""
from __future__ import annotations

import copy
import dataclasses

import jsonpatch
import pytest

from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.decide import mutations
from trainjob_admission.policies.decide.mutations import MANAGER
from trainjob_admission.policies.job import effective_job
from tests.support.objects import bare_trainjob, mpi_runtime, pod_spec

PRODUCT = "trainjob-admission.io/gpu-product"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
PRESENT = {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
TARGETING = {"accelerators": [
    {"resources": ["nvidia.com/gpu"], "tolerations": [GPU_TOLERATION], "matchExpressions": [PRESENT],
     "productLabel": "nvidia.com/gpu.product", "products": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]},
    {"resources": ["amd.com/gpu"], "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
     "matchExpressions": [{"key": "amd.com/gpu.present", "operator": "Exists"}]},
]}
DEDICATED = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}


@pytest.fixture
def bundles(make_bundle):
    return [make_bundle({"mutations": {"nodeTargeting": TARGETING}})]


def gpu_runtime(node: dict | None = None, initializer: bool = False) -> dict:
    """Workers ("node") with 8 GPUs, a launcher without; optionally a dataset initializer without."""
    runtime = mpi_runtime(node=node or pod_spec(gpus=8), launcher=pod_spec(), ancestor="node", launcher_as_node=False)
    if initializer:
        runtime["spec"]["template"]["spec"]["replicatedJobs"].insert(0, {"name": "dataset-initializer", "template": {
            "metadata": {"labels": {effective_job.ANCESTOR_LABEL: "dataset-initializer"}},
            "spec": {"template": {"spec": pod_spec(name="dataset-initializer")}}}})
    return runtime


def spec_of(decision, name: str) -> dict:
    return next(ps for ps in decision.job.pod_sets if ps.name == name).pod["spec"]


def terms_of(pod_spec_: dict) -> list[dict]:
    return pod_spec_["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def test_only_the_pods_that_request_gpus_get_tolerations_and_affinity(build, bundles, review):
    state = build.state(gpu_runtime(initializer=True), build.namespace())
    obj = bare_trainjob(numNodes=2)
    decision = review(obj, bundles, state)
    assert decision.allowed
    patched = jsonpatch.apply_patch(obj, decision.patch)
    (own,) = [p for p in patched["spec"]["runtimePatches"] if p["manager"] == MANAGER]
    assert [j["name"] for j in own["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]] == ["node"]
    workers = spec_of(decision, "node")
    assert workers["tolerations"] == [GPU_TOLERATION]
    assert terms_of(workers) == [{"matchExpressions": [PRESENT]}]
    for name in ("launcher", "dataset-initializer"):  # no GPUs: kept off the GPU nodes' requirements
        assert "tolerations" not in spec_of(decision, name) and "affinity" not in spec_of(decision, name)


def test_existing_tolerations_and_every_term_are_kept(build, bundles, review):
    """The runtime's toleration and the user's patch's affinity survive the replacing merge; our
    requirement joins each term; an empty term (it matches no node) and a term on the same key stay."""
    runtime_spec = pod_spec(gpus=8, tolerations=[DEDICATED])
    state = build.state(gpu_runtime(runtime_spec), build.namespace())
    own_key = {"key": "nvidia.com/gpu.present", "operator": "Exists"}
    terms = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
             {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
             {"matchExpressions": [own_key]},
             {}]
    user = {"manager": "example.com/user", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}}}}}]}}}}
    decision = review(bare_trainjob(numNodes=2, runtime_patches=[user]), bundles, state)
    assert decision.allowed
    workers = spec_of(decision, "node")
    assert workers["tolerations"] == [DEDICATED, GPU_TOLERATION]
    assert terms_of(workers) == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, PRESENT]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}], "matchExpressions": [PRESENT]},
        {"matchExpressions": [own_key]},
        {},
    ]
    assert "podAntiAffinity" in workers["affinity"]  # the affinity map merges; only the terms list is replaced


@pytest.mark.parametrize("existing", [
    {"key": "nvidia.com/gpu", "operator": "Exists"},  # any effect
    {"operator": "Exists"},  # every taint
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
])
def test_a_toleration_that_already_covers_ours_is_not_doubled(build, bundles, review, existing):
    state = build.state(gpu_runtime(pod_spec(gpus=8, tolerations=[existing])), build.namespace())
    decision = review(bare_trainjob(numNodes=1), bundles, state)
    assert spec_of(decision, "node")["tolerations"] == [existing]


def test_a_toleration_for_another_effect_or_value_does_not_cover_ours(build, bundles, review):
    existing = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
                {"key": "nvidia.com/gpu", "operator": "Equal", "value": "x", "effect": "NoSchedule"}]
    state = build.state(gpu_runtime(pod_spec(gpus=8, tolerations=existing)), build.namespace())
    decision = review(bare_trainjob(numNodes=1), bundles, state)
    assert spec_of(decision, "node")["tolerations"] == [*existing, GPU_TOLERATION]


@pytest.mark.parametrize("existing, covered", [
    ({"key": "dedicated", "operator": "Equal", "value": "5", "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "value": "5"}, True),  # Equal by default, every effect
    ({"key": "dedicated", "operator": "Lt", "value": "5", "effect": "NoSchedule"}, False),  # 5 < 5 is false
    ({"key": "dedicated", "operator": "Equal", "value": "5", "effect": "NoExecute"}, False),
])
def test_an_equal_toleration_is_covered_only_as_the_scheduler_would_tolerate_its_taint(
        make_bundle, build, review, existing, covered):
    wanted = {"key": "dedicated", "operator": "Equal", "value": "5", "effect": "NoSchedule"}
    bundle = make_bundle({"mutations": {"nodeTargeting": {"accelerators": [
        {"resources": ["nvidia.com/gpu"], "tolerations": [wanted]}]}}})
    state = build.state(gpu_runtime(pod_spec(gpus=8, tolerations=[existing])), build.namespace())
    decision = review(bare_trainjob(numNodes=1), [bundle], state)
    assert spec_of(decision, "node")["tolerations"] == ([existing] if covered else [existing, wanted])


def test_a_node_selector_on_the_key_is_left_to_the_user(build, bundles, review):
    state = build.state(gpu_runtime(pod_spec(gpus=8, nodeSelector={"nvidia.com/gpu.present": "true"})),
                        build.namespace())
    decision = review(bare_trainjob(numNodes=1), bundles, state)
    workers = spec_of(decision, "node")
    assert "affinity" not in workers and workers["tolerations"] == [GPU_TOLERATION]


def test_replanning_the_mutated_job_changes_nothing(build, bundles, review):
    """/validate plans again on the stored object (mutations.without_own_patch): same patch, no drift."""
    state = build.state(gpu_runtime(pod_spec(gpus=8, tolerations=[DEDICATED])), build.namespace())
    obj = bare_trainjob(numNodes=2)
    obj["metadata"]["annotations"] = {PRODUCT: "NVIDIA-H100-80GB-HBM3"}
    first = review(obj, bundles, state)
    again = review(first.mutated, bundles, state)
    assert again.allowed and again.patch == []
    assert spec_of(again, "node")["tolerations"] == [DEDICATED, GPU_TOLERATION]


def test_the_product_annotation_becomes_affinity_on_the_product_label(build, bundles, review):
    state = build.state(gpu_runtime(), build.namespace())
    obj = bare_trainjob(numNodes=2)
    obj["metadata"]["annotations"] = {PRODUCT: "NVIDIA-A100-SXM4-80GB"}
    decision = review(obj, bundles, state)
    assert decision.allowed
    assert terms_of(spec_of(decision, "node")) == [{"matchExpressions": [
        PRESENT, {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]}]
    assert "affinity" not in spec_of(decision, "launcher")


@pytest.mark.parametrize("product, offered, fix", [
    ("Tesla-T4", "offered: NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3",
     "set the annotation to one of those, or remove it to run on any nvidia.com/gpu node"),
    ("no spaces allowed", "not a node label value", "set the product as the nodes' label names it, or remove the annotation"),
])
def test_a_product_the_bundle_does_not_list_is_refused_with_the_list(build, bundles, default, review, product, offered,
                                                                     fix):
    state = build.state(gpu_runtime(), build.namespace())
    obj = bare_trainjob(numNodes=2)
    obj["metadata"]["annotations"] = {PRODUCT: product}
    decision = review(obj, [*bundles, *default], state)
    assert not decision.allowed and decision.patch == []
    (message,) = decision.messages  # from the bundle whose targeting refused it, not from every bundle
    assert message["rule"] == "test/gpu-node-targeting"
    assert offered in message["message"] and f"metadata.annotations[{PRODUCT}]" in message["message"]
    assert message["remediation"] == fix


def user_patch(spec: dict) -> dict:
    """The submitter's own runtimePatch of the workers' pod spec."""
    return {"manager": "acme.io/me", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": spec}}}}]}}}}


def product_term(operator: str, *values: str) -> dict:
    expression = {"key": "nvidia.com/gpu.product", "operator": operator, **({"values": list(values)} if values else {})}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [PRESENT]}, {"matchExpressions": [expression]}]}}}}


@pytest.mark.parametrize("spec", [
    {"nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"}},
    product_term("In", "NVIDIA-H100-80GB-HBM3", "Tesla-T4"),
])
def test_a_product_the_bundle_does_not_list_is_refused_however_it_is_selected(build, bundles, review, spec):
    """The allow-list means what it says: a nodeSelector or a required term naming an unlisted
    product is refused like the annotation, not merely left to the user."""
    state = build.state(gpu_runtime(), build.namespace())
    obj = bare_trainjob(numNodes=2)
    obj["spec"]["runtimePatches"] = [user_patch(spec)]
    decision = review(obj, bundles, state)
    assert not decision.allowed and decision.patch == []
    (message,) = decision.messages
    assert message["rule"] == "test/gpu-node-targeting"
    assert message["message"] == (
        "the job's nvidia.com/gpu pods select nvidia.com/gpu.product=Tesla-T4 (their nodeSelector or required node "
        "affinity), a GPU product this cluster does not offer for nvidia.com/gpu (offered: NVIDIA-A100-SXM4-80GB, "
        "NVIDIA-H100-80GB-HBM3)")
    assert message["remediation"].startswith("select one of those, or remove that selection from spec.runtimePatches")


@pytest.mark.parametrize("spec", [
    {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    product_term("In", "NVIDIA-H100-80GB-HBM3"), product_term("NotIn", "Tesla-T4"), product_term("Exists"),
])
def test_selecting_an_offered_product_or_excluding_one_is_admitted(build, bundles, review, spec):
    state = build.state(gpu_runtime(), build.namespace())
    obj = bare_trainjob(numNodes=2)
    obj["spec"]["runtimePatches"] = [user_patch(spec)]
    assert review(obj, bundles, state).allowed


@pytest.mark.parametrize("annotations", [["x"], "x"])
def test_annotations_that_are_not_a_mapping_do_not_crash_the_mutation(build, bundles, review, annotations):
    state = build.state(gpu_runtime(), build.namespace())
    obj = bare_trainjob(numNodes=1)
    obj["metadata"]["annotations"] = annotations
    decision = review(obj, bundles, state)  # the API server refuses such a job; /mutate plans without a product
    assert terms_of(spec_of(decision, "node")) == [{"matchExpressions": [PRESENT]}]


def test_a_product_for_a_family_without_product_label_is_refused(build, bundles, review):
    node = pod_spec()
    node["containers"][0]["resources"]["limits"] = {"amd.com/gpu": 4}
    state = build.state(gpu_runtime(node), build.namespace())
    obj = bare_trainjob(numNodes=1)
    obj["metadata"]["annotations"] = {PRODUCT: "MI300X"}
    decision = review(obj, bundles, state)
    assert not decision.allowed
    assert decision.messages[0]["message"].endswith("amd.com/gpu pods on any amd.com/gpu node, not by product")
    assert decision.messages[0]["remediation"] == "remove the annotation"
    del obj["metadata"]["annotations"]
    workers = spec_of(review(obj, bundles, state), "node")
    assert workers["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert terms_of(workers) == [{"matchExpressions": [{"key": "amd.com/gpu.present", "operator": "Exists"}]}]


def test_any_product_when_the_bundle_lists_none(build, make_bundle, review):
    open_products = {"accelerators": [{"resources": ["nvidia.com/*"], "productLabel": "nvidia.com/gpu.product"}]}
    state = build.state(gpu_runtime(), build.namespace())
    obj = bare_trainjob(numNodes=1)
    obj["metadata"]["annotations"] = {PRODUCT: "Tesla-T4"}
    decision = review(obj, [make_bundle({"mutations": {"nodeTargeting": open_products}})], state)
    assert decision.allowed
    assert terms_of(spec_of(decision, "node")) == [{"matchExpressions": [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}]}]


def test_mpijob_workers_get_it_in_their_template_and_the_launcher_does_not(example_job, example_state, bundles, review):
    obj = example_job("legacy-mpijob")
    worker = obj["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["tolerations"] = [DEDICATED]
    for container in worker["containers"]:
        container.setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = 2
    decision = review(obj, bundles, example_state)
    assert decision.allowed
    templates = jsonpatch.apply_patch(obj, decision.patch)["spec"]["mpiReplicaSpecs"]
    assert templates["Worker"]["template"]["spec"]["tolerations"] == [DEDICATED, GPU_TOLERATION]
    assert terms_of(templates["Worker"]["template"]["spec"]) == [{"matchExpressions": [PRESENT]}]
    assert "tolerations" not in templates["Launcher"]["template"]["spec"]
    assert spec_of(decision, "worker")["tolerations"] == [DEDICATED, GPU_TOLERATION]  # what the checks saw
    assert review(decision.mutated, bundles, example_state).patch == []


def test_the_mutated_job_is_the_rebuilt_one(build, bundles, review):
    """mutations.mutated_job merges our patch into the pods it had (no rebuild): equal to a build."""
    state = build.state(gpu_runtime(pod_spec(gpus=8, tolerations=[DEDICATED]), initializer=True), build.namespace())
    obj = bare_trainjob(numNodes=3)
    obj["metadata"]["annotations"] = {PRODUCT: "NVIDIA-A100-SXM4-80GB"}
    decision = review(obj, bundles, state)
    rebuilt = effective_job.build(copy.deepcopy(decision.mutated), state)
    assert [dataclasses.asdict(ps) for ps in decision.job.pod_sets] == [dataclasses.asdict(ps) for ps in rebuilt.pod_sets]


def test_without_own_patch_plans_on_the_pods_as_the_user_made_them(build, bundles, review):
    state = build.state(gpu_runtime(), build.namespace())
    first = review(bare_trainjob(numNodes=1), bundles, state)
    base = mutations.without_own_patch(first.mutated)
    assert base is not None and base["spec"]["runtimePatches"] == []


@pytest.mark.parametrize("accelerator, problem", [
    ({"resources": ["nvidia.com/gpu"], "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
     "operator Exists has no value"),
    ({"resources": ["nvidia.com/gpu"], "tolerations": [{"key": "k", "tolerationSeconds": 5}]}, "only to effect NoExecute"),
    ({"resources": ["nvidia.com/gpu"], "matchExpressions": [{"key": "k", "operator": "In"}]}, "needs values"),
    ({"resources": ["nvidia.com/gpu"], "matchExpressions": [{"key": "k", "operator": "Gt", "values": ["x"]}]},
     "one integer value"),
    ({"resources": ["nvidia.com/gpu"], "products": ["A100"]}, "need a productLabel"),
    ({"resources": ["nvidia.com/gpu"], "productLabel": "p", "products": ["not a label"]}, "pattern"),
    ({"resources": []}, "at least 1"),
])
def test_bundle_refuses_what_the_api_server_would(make_bundle, accelerator, problem):
    with pytest.raises(BundleError, match=problem):
        make_bundle({"mutations": {"nodeTargeting": {"accelerators": [accelerator]}}})


def test_the_schedulability_check_judges_the_targeted_pods(build, make_bundle, review):
    """Point 1 sees point 4's result: the product's affinity leaves only the A100 nodes, too few."""
    def gpu_node(name: str, product: str) -> dict:
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product}},
                "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
                "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "110"}}}
    cpu_node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu"},
                "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}}
    state = build.state(gpu_runtime(), build.namespace(), cpu_node, gpu_node("h100", "NVIDIA-H100-80GB-HBM3"),
                        gpu_node("a100", "NVIDIA-A100-SXM4-80GB"))
    bundles = [make_bundle({"checks": {"schedulability": {}}, "mutations": {"nodeTargeting": TARGETING}})]
    obj = bare_trainjob(numNodes=2)  # 2 workers x 8 GPUs: one per GPU node, or two on the A100 node alone
    assert review(obj, bundles, state).allowed
    obj["metadata"]["annotations"] = {PRODUCT: "NVIDIA-A100-SXM4-80GB"}
    decision = review(obj, bundles, state)
    assert not decision.allowed and {m["rule"] for m in decision.messages} == {"test/schedulability"}
