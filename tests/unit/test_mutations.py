"""Mutations as JSONPatch (Istio off, Kueue labels, security defaults, cost labels) and injection plans."""
from __future__ import annotations

import copy
import json

import jsonpatch
import pytest

from trainjob_admission.policies.bundle.schema import NetworkPolicyInjection
from tests.support import upstream
from trainjob_admission.policies.decide import injections
from trainjob_admission.policies.decide.injections import network_policy
from trainjob_admission.policies.decide.mutations import ISTIO_INJECT, MANAGER
from trainjob_admission.policies.job.effective_job import build as effective

QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"


def ours(obj: dict) -> list[dict]:
    return [p for p in obj["spec"].get("runtimePatches") or [] if p.get("manager") == MANAGER]


def pod_patches(obj: dict) -> dict[str, dict]:
    (patch,) = ours(obj)
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return {j["name"]: j["template"]["spec"]["template"] for j in jobs}


def test_allowed_example_turns_istio_off_and_adds_the_queue(example_job, example_state, default, review):
    obj = example_job("allowed")
    decision = review(obj, default, example_state)
    assert decision.allowed and decision.decision == "allow"
    patched = jsonpatch.apply_patch(obj, decision.patch)
    assert patched == decision.mutated
    templates = pod_patches(patched)
    assert set(templates) == {"launcher", "node"}
    for template in templates.values():
        assert template["metadata"]["labels"][ISTIO_INJECT] == "false"
        assert template["metadata"]["annotations"][ISTIO_INJECT] == "false"
    assert patched["metadata"]["labels"][QUEUE] == "default"
    assert obj == example_job("allowed")  # the input is not modified
    # The mutated job is what gets validated: its pods carry the label.
    assert decision.job.launcher.pod["metadata"]["labels"][ISTIO_INJECT] == "false"


def test_patch_is_valid_json_patch_text(example_job, example_state, default, review):
    obj = example_job("allowed")
    decision = review(obj, default, example_state)
    patch = jsonpatch.JsonPatch.from_string(json.dumps(decision.patch))
    assert patch.apply(obj) == decision.mutated
    assert {op["op"] for op in decision.patch} <= {"add", "replace", "remove"}


def test_mutation_is_idempotent(example_job, example_state, default, review):
    first = review(example_job("allowed"), default, example_state)
    again = review(first.mutated, default, example_state)
    assert again.allowed and again.patch == []


def test_existing_runtime_patch_of_ours_is_replaced_not_duplicated(example_job, example_state, default, review):
    obj = example_job("allowed")
    foreign = {"manager": "example.com/other", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}}}]}}}}
    stale = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"metadata": {"labels": {"stale": "yes"}}}}}}]}}}}
    obj["spec"]["runtimePatches"] = [stale, foreign]
    decision = review(obj, default, example_state)
    patched = jsonpatch.apply_patch(obj, decision.patch)
    managers = [p["manager"] for p in patched["spec"]["runtimePatches"]]
    assert sorted(managers) == sorted(["example.com/other", MANAGER])
    assert foreign in patched["spec"]["runtimePatches"]
    assert "stale" not in json.dumps(ours(patched))
    assert decision.job.workers.pod["metadata"]["labels"]["x"] == "y"


def test_queue_per_namespace_beats_default_and_existing_label_is_kept(build, make_bundle, review):
    runtime = build.runtime()
    bundle = make_bundle({"mutations": {"scheduling": {"defaultQueue": "shared", "queues": {"team-a": "team-a-q"},
                                                       "priorityClass": "high"}}})
    state = build.state(runtime, build.namespace("team-a"), build.namespace("team-b"))
    a = review(build.trainjob(namespace="team-a", numNodes=2), [bundle], state).mutated
    b = review(build.trainjob(namespace="team-b", numNodes=2), [bundle], state).mutated
    assert a["metadata"]["labels"] == {QUEUE: "team-a-q", PRIORITY: "high"}
    assert b["metadata"]["labels"] == {QUEUE: "shared", PRIORITY: "high"}
    mine = review(build.trainjob(labels={QUEUE: "mine"}, numNodes=2), [bundle], state)
    assert mine.mutated["metadata"]["labels"][QUEUE] == "mine"
    assert not any(op["path"].endswith("queue-name") and op["op"] == "replace" for op in mine.patch)


def test_no_queue_without_a_default(build, make_bundle, review):
    bundle = make_bundle({"mutations": {"scheduling": {"queues": {"team-z": "z"}}}})
    decision = review(build.trainjob(numNodes=2), [bundle], build.state(build.runtime()))
    assert decision.patch == []


def test_security_defaults_make_a_silent_runtime_pass_restricted(build, make_bundle, review):
    silent = build.pod_spec(secure=False)
    state = build.state(build.runtime(node=silent, launcher=copy.deepcopy(silent)))
    checks = {"podSecurity": {"defaultLevel": "restricted", "openshiftSCC": "never"}}
    denied = review(build.trainjob(numNodes=2), [make_bundle({"checks": checks})], state)
    assert not denied.allowed and denied.patch == []
    bundle = make_bundle({"checks": checks, "mutations": {"securityDefaults": {"enabled": True}}})
    decision = review(build.trainjob(numNodes=2), [bundle], state)
    assert decision.allowed, decision.messages
    templates = pod_patches(decision.mutated)
    for template in templates.values():
        assert template["spec"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        assert template["spec"]["containers"] == [{"name": "node", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]
    # Planned again on the mutated object (as /validate does): nothing to change, still allowed.
    # (It once found nothing missing, dropped its own runtimePatch and denied the job.)
    again = review(decision.mutated, [bundle], state)
    assert again.allowed and again.patch == [], again.messages


def test_security_defaults_cover_initializer_pods(build, make_bundle, review):
    """Every pod the job creates is patched, the dataset initializer too: without it a restricted
    namespace refuses a stock runtime at its first pod, whatever the mutation did to the others."""
    silent = build.pod_spec(secure=False)
    runtime = build.runtime(node=silent, launcher=copy.deepcopy(silent))
    initializer = build.pod_spec(secure=False, name="dataset-initializer")
    runtime["spec"]["template"]["spec"]["replicatedJobs"].insert(0, {"name": "dataset-initializer", "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}},
        "spec": {"template": {"spec": initializer}}}})
    state = build.state(runtime)
    checks = {"podSecurity": {"defaultLevel": "restricted", "openshiftSCC": "never"}}
    denied = review(build.trainjob(numNodes=2), [make_bundle({"checks": checks})], state)
    assert "dataset-initializer pod violates" in " ".join(m["message"] for m in denied.messages)
    bundle = make_bundle({"checks": checks, "mutations": {"securityDefaults": {"enabled": True}}})
    decision = review(build.trainjob(numNodes=2), [bundle], state)
    assert decision.allowed, decision.messages
    template = pod_patches(decision.mutated)["dataset-initializer"]
    assert template["spec"]["containers"] == [{"name": "dataset-initializer", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]


def test_security_defaults_only_fill_missing_fields(build, make_bundle, review):
    node = build.pod_spec(secure=False)
    node["securityContext"] = {"runAsNonRoot": False}
    node["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": True, "capabilities": {"drop": ["NET_RAW"]}}
    state = build.state(build.runtime(node=node))
    bundle = make_bundle({"checks": {"podSecurity": {"defaultLevel": "restricted", "openshiftSCC": "never"}},
                          "mutations": {"securityDefaults": {"enabled": True}}})
    decision = review(build.trainjob(numNodes=2), [bundle], state)
    assert not decision.allowed  # explicit choices are not overridden, so restricted still refuses
    text = decision.messages[0]["message"]
    assert "allowPrivilegeEscalation" in text and "runAsNonRoot" in text
    # What it would have patched for the node pod: only seccompProfile at pod level.
    from trainjob_admission.policies.decide.mutations import security_defaults
    assert security_defaults(node) == {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}


def test_production_bundle_enables_security_defaults_and_cost_labels(build, production, review):
    silent = build.pod_spec(secure=False, cpu="4", memory="16Gi", image="quay.io/acme-ml/openmpi-runtime:4.1")
    runtime = build.runtime("mpi-openmpi", node=silent, launcher=copy.deepcopy(silent))
    ns = build.namespace("ml-prod", labels={"environment": "production", "cost-center": "cc-9"})
    state = build.state(runtime, ns)
    job = build.trainjob(namespace="ml-prod", runtime="mpi-openmpi", labels={"team": "vision", "cost-center": "cc-9"},
                         numNodes=2, image="quay.io/acme-ml/train:1")
    job["spec"]["activeDeadlineSeconds"] = 3600
    decision = review(job, production, state)
    assert decision.allowed and decision.decision == "allow", decision.messages + decision.warnings
    templates = pod_patches(decision.mutated)
    assert templates["node"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert decision.mutated["metadata"]["labels"][QUEUE] == "production"
    assert decision.mutated["metadata"]["labels"][PRIORITY] == "high"
    assert {"kind": "Secret", "name": "job-mpi-ssh-auth", "keyType": "rsa-4096", "by": "admission"} in decision.injections
    assert {"kind": "NetworkPolicy", "name": "job-mpi-isolation", "template": "restricted",
            "by": "reconciler"} in decision.injections


def test_cost_labels_from_namespace_labels(build, make_bundle, review):
    bundle = make_bundle({"mutations": {"costLabels": {"fromNamespaceLabels": ["cost-center", "missing"]}}})
    state = build.state(build.runtime(), build.namespace("team-a", labels={"cost-center": "cc-1", "other": "x"}))
    decision = review(build.trainjob(numNodes=2), [bundle], state)
    assert decision.mutated["metadata"]["labels"] == {"cost-center": "cc-1"}
    for template in pod_patches(decision.mutated).values():
        assert template["metadata"]["labels"] == {"cost-center": "cc-1"}
    assert decision.job.workers.pod["metadata"]["labels"]["cost-center"] == "cc-1"


def test_mpijob_templates_are_patched_directly(example_job, example_state, default, review):
    obj = example_job("legacy-mpijob")
    decision = review(obj, default, example_state)
    patched = jsonpatch.apply_patch(obj, decision.patch)
    assert "runtimePatches" not in patched["spec"]
    for key in ("Launcher", "Worker"):
        meta = patched["spec"]["mpiReplicaSpecs"][key]["template"]["metadata"]
        assert meta["labels"][ISTIO_INJECT] == "false" and meta["annotations"][ISTIO_INJECT] == "false"
    assert patched["metadata"]["labels"][QUEUE] == "default"


def test_no_mutations_on_update_or_when_denied(example_job, example_state, default, review):
    obj = example_job("allowed")
    update = review(obj, default, example_state, operation="UPDATE", old=example_job("allowed"))
    assert update.allowed and update.patch == [] and update.injections == []
    denied = review(example_job("too-many-nodes"), default, example_state)
    assert not denied.allowed and denied.patch == [] and denied.injections == []


def test_audit_bundles_do_not_mutate(build, make_bundle, review):
    bundle = make_bundle({"mode": "audit", "mutations": {"istio": {}}, "injections": {"sshKey": {}}})
    decision = review(build.trainjob(numNodes=2), [bundle], build.state(build.runtime()))
    assert decision.patch == [] and decision.injections == []


def test_first_bundle_by_priority_wins_each_setting(build, make_bundle, review):
    admin = make_bundle({"priority": 10, "mutations": {"scheduling": {"defaultQueue": "admin-q"}},
                         "injections": {"sshKey": {"type": "ecdsa-p384"}}}, "admin")
    fallback = make_bundle({"priority": 500, "mutations": {"scheduling": {"defaultQueue": "fallback"},
                                                           "istio": {}},
                            "injections": {"sshKey": {"type": "rsa-4096"}}}, "fallback")
    decision = review(build.trainjob(numNodes=2), [admin, fallback], build.state(build.runtime()))
    assert decision.mutated["metadata"]["labels"][QUEUE] == "admin-q"
    assert {"kind": "Secret", "name": "job-mpi-ssh-auth", "keyType": "ecdsa-p384", "by": "admission"} \
        in decision.injections
    assert ISTIO_INJECT in json.dumps(ours(decision.mutated))  # the admin bundle did not set istio


# --- injections -------------------------------------------------------------------------------

def test_injection_plan_for_allowed_trainjob(example_job, example_state, default, review):
    decision = review(example_job("allowed"), default, example_state)
    assert decision.injections == [  # Trainer makes its own kind of key; the job's NetworkPolicy once it is stored
        {"kind": "Secret", "name": "resnet-allreduce-mpi-ssh-auth", "keyType": "ecdsa-p521", "by": "trainer"},
        {"kind": "NetworkPolicy", "name": "resnet-allreduce-mpi-isolation", "template": "default", "by": "reconciler"},
    ]


def test_no_ssh_secret_for_mpijob_and_none_when_disabled(example_job, example_state, default, build, make_bundle,
                                                        review):
    decision = review(example_job("legacy-mpijob"), default, example_state)
    assert [i["kind"] for i in decision.injections] == ["NetworkPolicy"]  # mpi-operator makes its own keys
    bundle = make_bundle({"injections": {"sshKey": {"enabled": False}, "networkPolicy": {"template": "none"}}})
    assert review(build.trainjob(numNodes=2), [bundle], build.state(build.runtime())).injections == []


def test_network_policy_default_and_restricted(example_job, example_state):
    job = effective(example_job("allowed"), example_state)
    default = network_policy(job, NetworkPolicyInjection())
    selector = {"jobset.sigs.k8s.io/jobset-name": "resnet-allreduce"}
    assert default["metadata"]["name"] == "resnet-allreduce-mpi-isolation"
    assert default["metadata"]["namespace"] == "team-a"
    assert default["spec"]["podSelector"] == {"matchLabels": selector}
    assert default["spec"]["policyTypes"] == ["Ingress"]
    assert default["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    restricted = network_policy(job, NetworkPolicyInjection(template="restricted", sshPort=2022,
                                                            mpiPorts={"start": 31000, "end": 31050}))
    (rule,) = restricted["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 2022},
                             {"protocol": "TCP", "port": 31000, "endPort": 31050}]
    assert rule["from"] == [{"podSelector": {"matchLabels": selector}}]


@pytest.mark.parametrize("key_type,by", [("rsa-4096", "admission"), ("ecdsa-p384", "admission"),
                                         ("ecdsa-p521", "trainer"), ("ed25519", "admission")])
def test_ssh_key_type_is_carried_in_the_plan(build, make_bundle, review, key_type, by):
    """The service makes the key where Trainer would make another kind (v2.3.0 mpi.go: P-521)."""
    bundle = make_bundle({"injections": {"sshKey": {"type": key_type}}})
    decision = review(build.trainjob(name="bert", numNodes=2), [bundle], build.state(build.runtime()))
    assert decision.injections == [{"kind": "Secret", "name": "bert-mpi-ssh-auth", "keyType": key_type, "by": by}]


def test_create_always_makes_the_service_create_trainers_kind_of_key_too(build, make_bundle, review):
    bundle = make_bundle({"injections": {"sshKey": {"type": "ecdsa-p521", "createAlways": True}}})
    decision = review(build.trainjob(name="bert", numNodes=2), [bundle], build.state(build.runtime()))
    assert decision.injections == [{"kind": "Secret", "name": "bert-mpi-ssh-auth", "keyType": "ecdsa-p521",
                                    "by": "admission"}]


def test_trainers_key_type_is_the_one_its_mpi_plugin_generates():
    """policies/decide/injections.py TRAINER_KEY_TYPE against Trainer's source in the module cache."""
    try:
        source = (upstream.module_dir("trainer") / "pkg/runtime/framework/plugins/mpi/mpi.go").read_text()
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))
    assert "ecdsa.GenerateKey(elliptic.P521(), rand.Reader)" in source
    assert injections.TRAINER_KEY_TYPE == "ecdsa-p521"
