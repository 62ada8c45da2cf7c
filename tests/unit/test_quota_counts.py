"""What a job adds to each quota key (policies/capacity/quotademand.py, policies/capacity/objectcounts.py): pods and
compute at the peak of its phases, count/pods and objects in full, storage from the runtime's
PVCs, hugepages; and the keys Kubernetes accepts but never enforces."""
from __future__ import annotations

import copy

from trainjob_admission.policies.checks import quota
from trainjob_admission.policies.checks.base import CheckContext
from trainjob_admission.policies.checks.quota import QuotaCheck
from trainjob_admission.policies.job.effective_job import build as effective

GPU = "nvidia.com/gpu"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
OBJECT_KEYS = ("count/jobs.batch", "count/jobsets.jobset.x-k8s.io", "count/trainjobs.trainer.kubeflow.org",
               "services", "count/services", "configmaps", "count/configmaps", "secrets", "count/secrets",
               "count/networkpolicies.networking.k8s.io", "count/mpijobs.kubeflow.org")


def hard(*keys, value="100"):
    return {key: value for key in keys}


def run(job, quotas, injections=()):
    return quota.check(CheckContext(job, quotas=quotas, injections=[{"kind": k} for k in injections]), QuotaCheck())


def mpi_job(build, runtime=None, **trainer):
    runtime = runtime or build.runtime()
    return effective(build.trainjob(runtime=runtime["metadata"]["name"], **trainer), build.state(runtime))


def phased_job(build, status="Complete", init_cpu="16", node_cpu="4", nodes=2):
    """A torch-style runtime: a dataset initializer that must finish (``status``) before the nodes start."""
    def rjob(name, ancestor, cpu, **extra):
        return {"name": name, **extra, "template": {"metadata": {"labels": {ANCESTOR: ancestor}},
                                                    "spec": {"template": {"spec": build.pod_spec(cpu=cpu, name=name)}}}}
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "torch"},
               "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [
                   rjob("dataset-initializer", "dataset-initializer", init_cpu),
                   rjob("node", "trainer", node_cpu, dependsOn=[{"name": "dataset-initializer", "status": status}]),
               ]}}}}
    return effective(build.trainjob(runtime="torch", numNodes=nodes), build.state(runtime))


# --- objects ------------------------------------------------------------------------------------

def test_an_mpi_trainjob_brings_its_jobset_jobs_service_configmaps_and_secret(build):
    job = mpi_job(build, numNodes=4)
    assert quota.demand(job, build.quota(hard(*OBJECT_KEYS))) == {
        "count/trainjobs.trainer.kubeflow.org": 1, "count/jobsets.jobset.x-k8s.io": 1,
        "count/jobs.batch": 2,  # one Job per replicated job (node, launcher)
        "services": 1, "count/services": 1,  # the JobSet's headless Service
        "configmaps": 2, "count/configmaps": 2,  # <job>-runtime-snapshot, <job>-mpi-hostfile
        "secrets": 1, "count/secrets": 1,  # <job>-mpi-ssh-auth
    }


def test_one_job_per_replica_and_no_service_without_dns_hostnames(build):
    runtime = build.runtime()
    jobset = runtime["spec"]["template"]["spec"]
    jobset["network"] = {"enableDNSHostnames": False}
    next(r for r in jobset["replicatedJobs"] if r["name"] == "node")["replicas"] = 3  # not the trainer ancestor
    demand = quota.demand(mpi_job(build, runtime, numNodes=2), build.quota(hard(*OBJECT_KEYS)))
    assert demand["count/jobs.batch"] == 4 and "services" not in demand


def test_the_injected_network_policy_counts(build):
    job = mpi_job(build, numNodes=2)
    q = build.quota(hard("count/networkpolicies.networking.k8s.io", "count/secrets", value="0"))
    assert quota.demand(job, q, ["Secret", "NetworkPolicy"]) == {
        "count/networkpolicies.networking.k8s.io": 1, "count/secrets": 1}  # our Secret is Trainer's: one
    findings = run(job, [q], ["NetworkPolicy"])
    assert len(findings) == 2
    message = next(f.message for f in findings if "networkpolicies" in f.message)
    assert message.startswith("job needs 1 count/networkpolicies.networking.k8s.io (NetworkPolicy ")


def test_the_engine_counts_what_the_bundle_injects(build, make_bundle, review):
    runtime = build.runtime()
    state = build.state(runtime, build.quota(hard("count/networkpolicies.networking.k8s.io", value="0")))
    obj = build.trainjob(numNodes=2, runtime="rt")
    with_policy = make_bundle({"checks": {"quota": {}}, "injections": {"networkPolicy": {"template": "default"}}})
    assert not review(obj, [with_policy], state).allowed
    assert review(obj, [make_bundle({"checks": {"quota": {}}})], state).allowed


def test_an_mpijob_brings_its_service_configmap_secret_and_launcher_job(build):
    mpijob = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "m", "namespace": "team-a"},
              "spec": {"mpiReplicaSpecs": {
                  "Launcher": {"replicas": 1, "template": {"spec": build.pod_spec()}},
                  "Worker": {"replicas": 4, "template": {"spec": build.pod_spec()}}}}}
    job = effective(mpijob, build.state())
    assert quota.demand(job, build.quota(hard(*OBJECT_KEYS, "count/pods"))) == {
        "count/mpijobs.kubeflow.org": 1, "count/jobs.batch": 1, "services": 1, "count/services": 1,
        "configmaps": 1, "count/configmaps": 1, "secrets": 1, "count/secrets": 1, "count/pods": 5}


def test_objects_over_quota_name_them_and_the_fix(build):
    job = mpi_job(build, numNodes=2)
    (finding,) = run(job, [build.quota({"count/configmaps": "10"}, {"count/configmaps": "9"})])
    assert finding.message == ('job needs 2 count/configmaps (ConfigMap job-runtime-snapshot, ConfigMap '
                               'job-mpi-hostfile); quota "compute" in team-a allows 10 and 9 are in use')
    assert finding.remediation.startswith("delete finished jobs in team-a")


def test_an_update_adds_no_objects(build):
    runtime = build.runtime()
    old, new = mpi_job(build, runtime, numNodes=2), mpi_job(build, runtime, numNodes=3)
    full = build.quota({"count/jobs.batch": "2", "count/configmaps": "2"}, {"count/jobs.batch": "2", "count/configmaps": "2"})
    assert quota.check(CheckContext(new, quotas=[full], old_job=old), QuotaCheck()) == []
    assert len(run(new, [full])) == 2  # as a CREATE both are over


# --- storage and hugepages ---------------------------------------------------------------------

def test_pvcs_of_the_runtimes_volume_claim_policies_count(build):
    runtime = build.runtime()
    runtime["spec"]["template"]["spec"]["volumeClaimPolicies"] = [{"templates": [
        {"metadata": {"name": "cache"}, "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "100Gi"}}}},
        {"metadata": {"name": "scratch"}, "spec": {"resources": {"requests": {"storage": "20Gi"}}}},
    ]}]
    job = mpi_job(build, runtime, numNodes=2)
    keys = hard("requests.storage", "persistentvolumeclaims", "count/persistentvolumeclaims",
                "fast.storageclass.storage.k8s.io/requests.storage", "fast.storageclass.storage.k8s.io/persistentvolumeclaims",
                "slow.storageclass.storage.k8s.io/requests.storage")
    assert quota.demand(job, build.quota(keys)) == {
        "requests.storage": 120 << 30, "persistentvolumeclaims": 2, "count/persistentvolumeclaims": 2,
        "fast.storageclass.storage.k8s.io/requests.storage": 100 << 30,
        "fast.storageclass.storage.k8s.io/persistentvolumeclaims": 1}
    (finding,) = run(job, [build.quota({"requests.storage": "200Gi"}, {"requests.storage": "150Gi"})])
    assert finding.message.startswith("job needs 120Gi requests.storage (PVCs from the runtime's volumeClaimPolicies)")
    assert "allows 200Gi and 150Gi are in use" in finding.message


def test_a_job_without_pvcs_adds_no_storage(build):
    assert quota.demand(mpi_job(build, numNodes=2), build.quota(hard("requests.storage", "persistentvolumeclaims"))) == {}


def test_hugepages_count_as_requests(build):
    node = build.pod_spec()
    node["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "2Gi", "hugepages-2Mi": "1Gi"},
                                          "limits": {"memory": "2Gi", "hugepages-2Mi": "1Gi"}}
    job = mpi_job(build, build.runtime(node=node), numNodes=3)  # 2 node pods + the launcher (no hugepages)
    assert quota.demand(job, build.quota(hard("hugepages-2Mi", "requests.hugepages-2Mi"))) == {
        "hugepages-2Mi": 2 << 30, "requests.hugepages-2Mi": 2 << 30}
    (finding,) = run(job, [build.quota({"requests.hugepages-2Mi": "1Gi"})])
    assert finding.message.startswith("job needs 2Gi hugepages-2Mi requests (2 nodes x 1Gi)")


# --- keys Kubernetes does not enforce ----------------------------------------------------------

def test_limits_of_an_extended_resource_never_deny_and_warn(build):
    job = mpi_job(build, numNodes=4, resourcesPerNode={"requests": {"cpu": "1"}, "limits": {GPU: "4"}})
    findings = run(job, [build.quota({f"limits.{GPU}": "1", GPU: "1"})])
    assert [f.severity for f in findings] == ["warn", "warn"], findings
    limits = next(f for f in findings if f"limits.{GPU}" in f.message)
    assert "Kubernetes does not enforce" in limits.message and "16 nvidia.com/gpu" in limits.message
    assert limits.remediation == f"ask your admin to set requests.{GPU} in the quota instead of limits.{GPU}"
    assert quota.demand(job, build.quota({f"limits.{GPU}": "1", GPU: "1"})) == {}


def test_an_unenforced_key_for_a_resource_the_job_does_not_use_says_nothing(build):
    assert run(mpi_job(build, numNodes=2), [build.quota({f"limits.{GPU}": "1"})]) == []


# --- phases and count/pods ---------------------------------------------------------------------

def test_phases_chained_by_complete_count_their_peak_not_their_sum(build):
    job = phased_job(build)  # initializer 16 cpu, then 2 nodes x 4 cpu
    q = build.quota(hard("requests.cpu", "pods", "count/pods"))
    assert quota.demand(job, q) == {"requests.cpu": 16000, "pods": 2, "count/pods": 3}
    assert run(job, [build.quota({"requests.cpu": "16"})]) == []  # the sum, 24, would have been refused
    (finding,) = run(job, [build.quota({"requests.cpu": "12"})])
    assert finding.message.startswith("job needs 16 cpu requests (1 dataset-initializer x 16; node runs at another "
                                      "time (dependsOn Complete))")
    assert finding.remediation == "ask your admin to raise the quota"  # no worker count makes the initializer fit


def test_phases_chained_by_ready_run_together(build):
    job = phased_job(build, status="Ready")
    assert quota.demand(job, build.quota(hard("requests.cpu", "pods"))) == {"requests.cpu": 24000, "pods": 3}


def test_the_fix_for_a_phased_job_keeps_every_phase_in_the_quota(build):
    job = phased_job(build, init_cpu="2", node_cpu="4", nodes=6)  # peak: 6 nodes x 4 = 24
    (finding,) = run(job, [build.quota({"requests.cpu": "10"})])
    assert "job needs 24 cpu requests (6 nodes x 4; dataset-initializer runs at another time" in finding.message
    assert (finding.remediation, finding.nodes_at_most) == ("ask your admin to raise the quota", 2)


def test_missing_ephemeral_storage_is_not_refused_by_kubernetes(build):
    """Only cpu and memory are in the quota admission's validationSet."""
    assert run(mpi_job(build, numNodes=2), [build.quota({"requests.ephemeral-storage": "100Gi"})]) == []


def test_a_missing_value_in_an_init_container_warns(build):
    node = build.pod_spec()
    node["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    runtime = build.runtime(node=node)
    (finding,) = run(mpi_job(build, runtime, numNodes=2), [build.quota({"requests.memory": "100Gi"})])
    assert "node container 'fetch'" in finding.message and "initContainers[name=fetch]" in finding.remediation
    pod_level = copy.deepcopy(runtime)  # pod-level resources set: the containers need none
    pod_level["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["resources"] = {
        "requests": {"cpu": "1", "memory": "4Gi"}}
    assert run(mpi_job(build, pod_level, numNodes=2), [build.quota({"requests.memory": "100Gi"})]) == []
