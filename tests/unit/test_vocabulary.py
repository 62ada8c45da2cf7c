"""One vocabulary for a job's shape (policies/job/vocabulary.py) in every message, fix and summary,
and fixes that agree (issue 31): numNodes 65 gave "job has 65 workers" beside "65 pods (64 node
+ 1 launcher)"; a 500-node job got "reduce spec.trainer.numNodes to 88 / 26 / 13 / 2"; the
service's own Istio patch was cited as "spec.runtimePatches[0]"; a negative GPU count hid every
other problem.

The jobs below are decided with the default bundle against the examples' cluster state (quota
"compute" with 8 GPUs free, four 8-GPU cluster nodes); each decision's words are checked."""
from __future__ import annotations

import copy
import re

import pytest

from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.k8s.clusterstate import ClusterState
from trainjob_admission.policies.offline import render
from tests.support.objects import mpi_runtime, pod_spec

WORKER = re.compile(r"\bworkers?\b")  # the word, not Worker (mpi-operator's replica name) nor maxWorkers
BREAKDOWN = re.compile(r"\((\d+) nodes? x [^;)]*?(\+ the launcher node x)?[^;)]*\)")
FIXED_COUNT = re.compile(r"set (spec\.trainer\.numNodes|spec\.mpiReplicaSpecs\.Worker\.replicas) to (\d+)")


def sized(job: dict, nodes: int, gpus: int | None = None) -> dict:
    job = copy.deepcopy(job)
    job["spec"]["trainer"]["numNodes"] = nodes
    if gpus is not None:
        job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = gpus
    return job


def words(decision) -> list[str]:
    """Everything a submitter reads of a decision: messages, fixes, warnings, the summary, the status."""
    found = [text for r in decision.results for text in (*r.messages, *r.remediations)]
    return found + decision.warnings + [render.job_summary(decision), decision.status_message]


@pytest.fixture
def separate_launcher(_example_objects):
    """A runtime whose launcher is not a node: numNodes 4 is 4 nodes and the launcher."""
    runtime = mpi_runtime("separate", launcher_as_node=False, ancestor="node", node=pod_spec(cpu="4", memory="32Gi"),
                          launcher=pod_spec(cpu="1", memory="1Gi"))
    return ClusterState.from_objects(copy.deepcopy([*_example_objects, runtime]))


CASES = {  # name -> (example job, numNodes, GPUs per node)
    "65 nodes": ("over-quota", 65, None),
    "500 nodes": ("over-quota", 500, None),
    "500 nodes, a negative GPU count": ("over-quota", 500, -4),
    "9 GPUs per node": ("too-many-gpus", 2, None),
    "fits": ("allowed", 4, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_messages_speak_of_nodes_and_fixes_agree(case, example_job, example_state, default):
    name, nodes, gpus = CASES[case]
    job = sized(example_job(name), nodes, gpus)
    decision = evaluate(AdmissionInput(job, username="alice"), default, example_state)
    texts = words(decision)
    assert not [t for t in texts if WORKER.search(t)], texts
    assert not [t for t in texts if re.search(r"\bthe \d+ nodes\b|\bno node\b", t)], texts  # cluster nodes say so
    for text in texts:  # every breakdown counts numNodes, the launcher node among them
        for count, launcher in BREAKDOWN.findall(text):
            assert int(count) + (1 if launcher else 0) == nodes, text
    assert f"({nodes} node{'s' if nodes > 1 else ''}, the launcher among them)" in render.job_summary(decision)
    counts = {int(n) for t in texts for _, n in FIXED_COUNT.findall(t)}
    assert len(counts) <= 1, texts  # one count of nodes in every fix
    if counts:
        (fixed,) = counts
        assert fixed < nodes
        again = evaluate(AdmissionInput(sized(job, fixed), username="alice"), default, example_state)
        assert not [r for r in again.results if r.rule in ("quota", "job-shape", "schedulability")
                    and r.effect == "deny"], again.messages  # that count satisfies every limit at once


def test_the_500_node_job_gets_one_count_the_quota_allows(example_job, example_state, default):
    decision = evaluate(AdmissionInput(sized(example_job("over-quota"), 500), username="alice"), default, example_state)
    fixes = [m["remediation"] for m in decision.messages if "numNodes" in m["remediation"]]
    assert len(fixes) >= 5 and set(fixes) >= {"set spec.trainer.numNodes to 2, or ask your admin to raise the quota"}
    assert "job has 500 nodes (spec.trainer.numNodes); the limit is 64" in [m["message"] for m in decision.messages]
    assert len(decision.status_message) < 900 and decision.status_message.count("ask your admin to raise the quota") == 1


def test_a_launcher_that_is_not_a_node_is_named_beside_the_nodes(example_job, separate_launcher, default):
    job = sized(example_job("over-quota"), 40)
    job["spec"]["runtimeRef"]["name"] = "separate"
    decision = evaluate(AdmissionInput(job, username="alice"), default, separate_launcher)
    assert "40 nodes + the launcher" in render.job_summary(decision)
    quota = [m["message"] for m in decision.messages if m["rule"] == "default/quota"]
    assert any("(40 nodes x 4 + the launcher x 1)" in m for m in quota), quota
    assert not [t for t in words(decision) if WORKER.search(t)]


def test_an_invalid_value_does_not_hide_the_other_problems(example_job, example_state, default):
    """Issue 31: a negative GPU count was the only problem reported; fixed, seven more appeared."""
    decision = evaluate(AdmissionInput(sized(example_job("over-quota"), 500, -4), username="alice"), default,
                        example_state)
    rules = [m["rule"] for m in decision.messages]
    assert rules[0] == "default/job-model" and "-4 is negative" in decision.messages[0]["message"]
    assert {"default/quota", "default/job-shape", "default/schedulability"} <= set(rules), rules
    assert decision.messages[0]["message"].startswith("node and launcher pods would be refused")  # said once


def test_the_services_own_patch_is_never_cited_as_the_submitters(example_job, example_state, default):
    """The job is judged with the service's runtimePatch (Istio off) in it, on /mutate, in `review`
    and on an UPDATE of a stored job: the runtime's privileged pods were reported as set "with
    spec.runtimePatches[0]", a patch the submitter never wrote."""
    from trainjob_admission.policies.decide.mutations import MANAGER

    texts = words(evaluate(AdmissionInput(example_job("privileged"), username="alice"), default, example_state))
    assert any("mpi-privileged" in t for t in texts) and not [t for t in texts if "runtimePatches[" in t], texts
    stored = evaluate(AdmissionInput(example_job("allowed"), username="alice"), default, example_state).mutated
    assert [p["manager"] for p in stored["spec"]["runtimePatches"]] == [MANAGER]
    stored["spec"]["runtimeRef"]["name"] = "mpi-privileged"
    stored["spec"]["runtimePatches"].append({"manager": "example.com/alice", "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": "launcher", "template": {"spec": {"template": {"metadata": {"labels": {"a": "b"}}}}}}]}}}})
    cited = words(evaluate(AdmissionInput(stored, operation="UPDATE", old_object=copy.deepcopy(stored), username="alice"),
                           default, example_state, mutate=False))
    assert any("spec.runtimePatches[1]" in t for t in cited) and not [t for t in cited if "runtimePatches[0]" in t], cited
