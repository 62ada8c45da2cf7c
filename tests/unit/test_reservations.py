"""Reservations (policies/capacity/reservations.py): what admitted TrainJobs will take of a ResourceQuota
before their pods exist, and the quota pre-check that subtracts it."""
from __future__ import annotations

import copy
import json

import pytest

from trainjob_admission.policies.capacity.reservations import (
    JOBSET_NAME, PENDING_SECONDS, REPLICATED_JOB, Entry, Reservations, Shortfall, state_of,
)
from trainjob_admission.policies.checks import quota
from trainjob_admission.policies.checks.base import CheckContext
from trainjob_admission.policies.checks.quota import QuotaCheck
from trainjob_admission.policies.job.effective_job import build as effective
from trainjob_admission.policies.job.queueing import MULTIKUEUE

from tests.support.objects import NODE_LABEL as ANCESTOR

GPU = "nvidia.com/gpu"
PER_NODE = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU: "4"}}  # launcher runs as a node: 4 x nodes


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def job(build, name="train-a", nodes=2, uid=None, **spec):
    obj = build.trainjob(name, numNodes=nodes, resourcesPerNode=PER_NODE)
    obj["metadata"].update(uid=uid or f"uid-{name}", generation=1)
    obj["spec"].update(spec)
    return obj


def pod(name, job_name="train-a", rjob="node", gpus=4, namespace="team-a", phase="Pending"):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {JOBSET_NAME: job_name, REPLICATED_JOB: rjob}},
            "spec": {"containers": [{"name": "node", "resources": {"limits": {GPU: str(gpus)}}}]},
            "status": {"phase": phase}}


def gpu_quota(build, hard=32, used=0, **extra):
    return build.quota({f"requests.{GPU}": str(hard)}, {f"requests.{GPU}": str(used)}, **extra)


def model(build, *objects, clock=None):
    state = build.state(build.runtime(), *objects)
    reservations = Reservations(state, clock=clock or Clock())
    state.reservations = reservations
    return state, reservations


def held(reservations, quotas, exclude=""):
    return {key: r.jobs for key, r in reservations.of("team-a", quotas, exclude).items()}


def test_a_running_job_reserves_its_peak_until_its_pods_show_up(build):
    quotas = [gpu_quota(build)]
    _, reservations = model(build, *quotas)
    reservations.jobs_listed([job(build, nodes=2)])  # launcher + 1 worker, 4 GPUs each
    assert held(reservations, quotas) == {("compute", f"requests.{GPU}"): (("train-a", 8),)}
    reservations.pod_seen(pod("train-a-launcher-0-0", rjob="launcher"))
    assert held(reservations, quotas) == {("compute", f"requests.{GPU}"): (("train-a", 4),)}
    reservations.pod_seen(pod("train-a-node-0-0"))
    assert held(reservations, quotas) == {}
    reservations.pod_seen(pod("train-a-node-0-0", phase="Succeeded"))  # a pod that ran has shown up
    assert held(reservations, quotas) == {}
    reservations.pod_seen(pod("train-a-node-0-0"), keep=False)  # deleted (a JobSet restart): it comes back
    assert held(reservations, quotas) == {("compute", f"requests.{GPU}"): (("train-a", 4),)}


def test_finished_deleted_suspended_and_multikueue_jobs_reserve_nothing(build):
    quotas = [gpu_quota(build)]
    _, reservations = model(build, *quotas)
    running = job(build)
    reservations.job_seen(running)
    assert held(reservations, quotas)
    done = copy.deepcopy(running)
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    reservations.job_seen(done)
    assert held(reservations, quotas) == {}
    reservations.job_seen(running)
    reservations.job_seen({**running, "metadata": {**running["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert held(reservations, quotas) == {}
    reservations.job_seen(running)
    reservations.job_gone(running)
    assert held(reservations, quotas) == {}
    reservations.job_seen(job(build, suspend=True))
    reservations.job_seen(job(build, "remote", managedBy=MULTIKUEUE))
    assert held(reservations, quotas) == {}


def test_phases_reserve_their_peak_and_a_finished_phase_counts_as_shown_up(build):
    quotas = [build.quota({"requests.cpu": "100"})]
    state, reservations = model(build, *quotas)
    obj = build.trainjob("phased", runtime="torch", numNodes=2)  # initializer 16 cpu, then 2 nodes x 4 cpu
    obj["metadata"].update(uid="u", generation=1)
    reservations.job_seen(obj)
    assert held(reservations, quotas) == {}  # no runtime "torch" yet: Trainer cannot run it either
    state.upsert(_torch_runtime(build))
    assert held(reservations, quotas) == {("compute", "requests.cpu"): (("phased", 16000),)}  # built once it exists
    init = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "phased-init-0", "namespace": "team-a",
        "labels": {JOBSET_NAME: "phased", REPLICATED_JOB: "dataset-initializer"}},
        "spec": {"containers": [{"name": "i", "resources": {"requests": {"cpu": "16"}}}]}, "status": {"phase": "Succeeded"}}
    reservations.pod_seen(init)
    assert held(reservations, quotas) == {}


def test_a_finished_phase_below_the_peak_leaves_the_peak_reserved(build):
    """The quota stops counting a finished pod: an initializer that is done must not lower what
    the larger phase after it still needs (4 nodes x 4 cpu after a 16-cpu initializer... here 8)."""
    quotas = [build.quota({"requests.cpu": "100"})]
    state, reservations = model(build, *quotas, _torch_runtime(build, init_cpu="8"))
    obj = build.trainjob("phased", runtime="torch", numNodes=4)  # initializer 8 cpu, then 4 nodes x 4 cpu
    obj["metadata"].update(uid="u", generation=1)
    reservations.job_seen(obj)
    init = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "phased-init-0", "namespace": "team-a",
        "labels": {JOBSET_NAME: "phased", REPLICATED_JOB: "dataset-initializer"}},
        "spec": {"containers": [{"name": "i", "resources": {"requests": {"cpu": "8"}}}]}, "status": {"phase": "Succeeded"}}
    reservations.pod_seen(init)
    assert held(reservations, quotas) == {("compute", "requests.cpu"): (("phased", 16000),)}


def _torch_runtime(build, init_cpu="16"):
    """A dataset initializer that must finish before the nodes start (test_quota_counts.phased_job's)."""
    def rjob(name, ancestor, cpu, **extra):
        return {"name": name, **extra, "template": {"metadata": {"labels": {ANCESTOR: ancestor}},
                                                    "spec": {"template": {"spec": build.pod_spec(cpu=cpu, name=name)}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime", "metadata": {"name": "torch"},
            "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [
                rjob("dataset-initializer", "dataset-initializer", init_cpu),
                rjob("node", "trainer", "4", dependsOn=[{"name": "dataset-initializer", "status": "Complete"}])]}}}}


def test_a_scoped_quota_reserves_only_what_it_counts(build):
    scoped = gpu_quota(build, scopes=["Terminating"])  # no pod of the job sets activeDeadlineSeconds
    plain = build.quota({"pods": "10"}, name="pods")
    _, reservations = model(build, scoped, plain)
    reservations.job_seen(job(build, nodes=3))
    assert held(reservations, [scoped, plain]) == {("pods", "pods"): (("train-a", 3),)}


def test_a_restart_replays_the_same_reservations(build):
    quotas = [gpu_quota(build)]
    events = [job(build, "a", nodes=2), job(build, "b", nodes=3)]
    pods = [pod("a-node-0-0", "a"), pod("b-node-0-0", "b")]
    _, live = model(build, *quotas)
    for obj in events:
        live.job_seen(obj)
    for p in pods:
        live.pod_seen(p)
    _, restarted = model(build, *quotas)
    restarted.pods_listed(pods)  # the pods may be listed before the jobs
    restarted.jobs_listed(events)
    assert held(live, quotas) == held(restarted, quotas) == {
        ("compute", f"requests.{GPU}"): (("a", 4), ("b", 8))}
    restarted.jobs_listed(events[1:])  # a relist after "a" was deleted unseen
    assert held(restarted, quotas) == {("compute", f"requests.{GPU}"): (("b", 8),)}


def admit(reservations, state, obj, quotas, replica="replica-a"):
    """The entry ``obj`` takes when admitted, held."""
    entry = reservations.entry(effective(obj, state), obj, quotas, replica)
    reservations.hold("team-a", entry)
    return entry


def test_an_entry_counts_until_the_watch_shows_its_job_or_its_time_is_up(build):
    quotas = [gpu_quota(build)]
    clock = Clock()
    state, reservations = model(build, *quotas, clock=clock)
    obj = job(build)
    entry = admit(reservations, state, obj, quotas)
    assert entry == Entry("train-a", "uid-train-a", 1, (("compute", f"requests.{GPU}", 8),),
                          clock.now + PENDING_SECONDS, "replica-a")
    assert held(reservations, quotas) == {("compute", f"requests.{GPU}"): (("train-a", 8),)}
    clock.now += PENDING_SECONDS
    assert held(reservations, quotas) == {}  # never shown (another webhook refused it): gone after its time
    admit(reservations, state, obj, quotas)
    reservations.job_seen(obj)  # the watch shows it: the watched job takes over, pods end it
    clock.now += 2 * PENDING_SECONDS
    assert held(reservations, quotas) == {("compute", f"requests.{GPU}"): (("train-a", 8),)}
    reservations.pods_listed([pod("train-a-launcher-0-0", rjob="launcher"), pod("train-a-node-0-0")])
    assert held(reservations, quotas) == {}
    queued = job(build, "queued", suspend=True)
    assert reservations.entry(effective(queued, state), queued, quotas) is None  # a suspended job runs no pod


def test_a_resumed_job_counts_until_the_watch_shows_the_resumed_generation(build):
    quotas = [gpu_quota(build)]
    state, reservations = model(build, *quotas)
    suspended = job(build, suspend=True)
    reservations.job_seen(suspended)  # generation 1, suspended: nothing held
    resumed = job(build)
    resumed["metadata"]["generation"] = 2
    admit(reservations, state, resumed, quotas)
    assert held(reservations, quotas) == {("compute", f"requests.{GPU}"): (("train-a", 8),)}
    reservations.job_seen(suspended)  # an older version: the entry stays
    assert held(reservations, quotas) == {("compute", f"requests.{GPU}"): (("train-a", 8),)}
    reservations.job_seen(resumed)
    assert held(reservations, quotas) == {("compute", f"requests.{GPU}"): (("train-a", 8),)}  # now the job's own
    assert reservations.kept("team-a", quotas, reservations.entries("team-a"))  # its pods do not exist yet


def test_an_entry_ends_when_its_job_is_known_gone_or_withdrawn(build):
    quotas = [gpu_quota(build)]
    state, reservations = model(build, *quotas)
    first = admit(reservations, state, job(build, "a", uid="uid-a"), quotas)
    reservations.job_seen(job(build, "a", uid="uid-a"))
    reservations.job_gone(job(build, "a", uid="uid-a"))  # deleted before its pods came
    admit(reservations, state, job(build, "b", uid="uid-b"), quotas)
    reservations.job_seen(job(build, "b", uid="uid-other", suspend=True))  # its name is another job's
    withdrawn = admit(reservations, state, job(build, "c", uid="uid-c"), quotas)
    reservations.release("team-a", withdrawn)  # the answer was not an admission after all
    assert held(reservations, quotas) == {}
    reservations.entries_read("team-a", [first, withdrawn])  # a ledger still naming them
    assert held(reservations, quotas) == {}
    assert reservations.kept("team-a", quotas, [first, withdrawn]) == []


def test_a_ledger_keeps_an_entry_until_its_pods_exist(build):
    """Another replica's watch may not show the job yet: an entry the watch here took over stays
    in the ledger while the job still reserves, and goes once its pods exist or its time is up."""
    quotas = [gpu_quota(build)]
    clock = Clock()
    state, reservations = model(build, *quotas, clock=clock)
    entry = admit(reservations, state, job(build), quotas)
    forged = Entry("x", "uid-x", 1, (("compute", f"requests.{GPU}", 32),), clock.now + 10 * PENDING_SECONDS)
    assert reservations.kept("team-a", quotas, [entry, forged]) == [entry]  # lasting longer than an entry can: not ours
    reservations.job_seen(job(build))
    assert reservations.kept("team-a", quotas, [entry]) == [entry]
    reservations.pods_listed([pod("train-a-launcher-0-0", rjob="launcher"), pod("train-a-node-0-0")])
    assert reservations.kept("team-a", quotas, [entry]) == []
    clock.now += PENDING_SECONDS
    assert reservations.kept("team-a", quotas, [admit(reservations, state, job(build, "b"), quotas)]) != []


def test_shortfalls_redo_the_quota_arithmetic_against_the_current_entries(build):
    quotas = [gpu_quota(build, 32, 8, name="team-quota")]
    state, reservations = model(build, *quotas)
    first = admit(reservations, state, job(build, "train-a", nodes=4), quotas)  # 16 GPUs: 8 left
    second = reservations.entry(effective(job(build, "train-b", nodes=2), state), job(build, "train-b", nodes=2), quotas)
    assert reservations.shortfalls("team-a", quotas, second) == []  # 8 fit
    third = reservations.entry(effective(job(build, "train-c", nodes=3), state), job(build, "train-c", nodes=3), quotas)
    assert reservations.shortfalls("team-a", quotas, third) == [
        Shortfall("team-quota", f"requests.{GPU}", 12, 32, 8, 16)]
    assert reservations.shortfalls("team-a", quotas, first) == []  # its own entry is not another job's


def test_an_entry_reads_back_as_written_and_nothing_else_reads(build):
    entry = Entry("train-a", "u", 1, (("compute", "pods", 2), ("compute", f"requests.{GPU}", 8)), 1000.5, "r")
    assert Entry.from_json(json.loads(json.dumps(entry.as_json()))) == entry
    for bad in ({}, [], {**entry.as_json(), "uid": ""}, {**entry.as_json(), "generation": "1"},
                {**entry.as_json(), "expires": "soon"}, {**entry.as_json(), "reserved": {"compute": {"pods": -1}}},
                {**entry.as_json(), "reserved": {"compute": {"pods": True}}}, {**entry.as_json(), "reserved": []}):
        with pytest.raises(ValueError):
            Entry.from_json(bad)


def judge(state, obj, old=None):
    context = CheckContext(effective(obj, state), quotas=state.namespace_quotas("team-a"), object=obj, old_object=old,
                           old_job=effective(old, state) if old is not None else None, state=state)
    return quota.check(context, QuotaCheck()), context.facts


def test_the_second_of_two_jobs_that_fit_alone_but_not_together_is_refused_with_the_first_named(build):
    state, reservations = model(build, gpu_quota(build, 32, 0, name="team-quota"))
    first = job(build, "train-a", nodes=6)  # 24 GPUs
    assert judge(state, first) == ([], {})
    admit(reservations, state, first, state.namespace_quotas("team-a"))
    (finding,), facts = judge(state, job(build, "train-b", nodes=4))  # 16 GPUs; 32 - 24 leaves 8
    assert finding.message == (
        'job needs 16 nvidia.com/gpu (4 nodes x 4); quota "team-quota" in team-a allows 32 '
        'nvidia.com/gpu; 0 in use and 24 reserved by jobs whose pods do not exist yet (train-a: 24)')
    assert finding.remediation == "wait for train-a to start or finish or ask your admin to raise the quota"
    assert finding.nodes_at_most == 2
    assert facts == {"reservations": [{"namespace": "team-a", "quota": "team-quota", "key": f"requests.{GPU}",
                                       "reserved": 24, "jobs": {"train-a": 24}}]}
    assert judge(state, job(build, "train-b", nodes=2))[0] == []  # 8 GPUs fit beside the reservation


def test_a_job_is_never_held_back_by_its_own_reservation_and_a_queued_job_by_none(build):
    state, reservations = model(build, gpu_quota(build, 32, 0))
    first = job(build, "train-a", nodes=6)
    reservations.job_seen(first)
    grown = job(build, "train-a", nodes=8)  # UPDATE: 32 GPUs, its own 24 reserved are not someone else's
    assert judge(state, grown, old=first)[0] == []
    queued = job(build, "train-b", nodes=8, suspend=True)  # can ever fit: 32 of 32
    findings, facts = judge(state, queued)
    assert [f.severity for f in findings] == [] and facts == {}


def test_a_state_file_with_trainjobs_and_pods_reserves_as_the_server_does(build):
    first = job(build, "train-a", nodes=6)
    with_pods = state_of([build.runtime(), gpu_quota(build, 32, 4), first, pod("train-a-launcher-0-0", rjob="launcher")])
    assert held(with_pods.reservations, with_pods.namespace_quotas("team-a")) == {
        ("compute", f"requests.{GPU}"): (("train-a", 20),)}
    without = state_of([build.runtime(), gpu_quota(build)])  # no TrainJobs: none known
    assert held(without.reservations, without.namespace_quotas("team-a")) == {}
