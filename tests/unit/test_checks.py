"""Built-in checks: quota pre-check, GPU limits, job shape, Pod Security / OpenShift SCC."""
from __future__ import annotations

import copy

import pytest

from trainjob_admission.policies.bundle.schema import Checks
from trainjob_admission.policies.checks import gpu, podsecurity, quota, shape
from trainjob_admission.policies.checks.base import CheckContext
from trainjob_admission.policies.checks.gpu import GpuCheck
from trainjob_admission.policies.checks.podsecurity import PodSecurityCheck
from trainjob_admission.policies.k8s import sccadmission
from trainjob_admission.policies.checks.quota import QuotaCheck
from trainjob_admission.policies.checks.registry import CHECKS
from trainjob_admission.policies.checks.shape import ShapeCheck
from trainjob_admission.policies.job.effective_job import build as effective


def job_of(build, runtime=None, name="job", namespace="team-a", labels=None, **trainer):
    runtime = runtime or build.runtime()
    return effective(build.trainjob(name=name, namespace=namespace, runtime=runtime["metadata"]["name"],
                                    labels=labels, **trainer), build.state(runtime))


def quota_check(job, quotas, old_job=None):
    return quota.check(CheckContext(job, quotas=quotas, old_job=old_job), QuotaCheck())


def per_node(cpu="2", memory="8Gi", gpus=0):
    resources: dict = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": gpus}
    return resources


# --- the registry -----------------------------------------------------------------------------

def test_every_check_setting_has_one_registered_check():
    """A settings section on bundle.Checks without its registry line (or the reverse) fails here."""
    assert sorted(c.setting for c in CHECKS) == sorted(Checks.model_fields)
    # rule names are in decision logs, queries and admins' notes: they never change
    assert {"quota", "gpu-limits", "job-shape", "pod-security", "limit-range"} <= {c.rule for c in CHECKS}


@pytest.mark.parametrize("checks, builds", [({"quota": {}}, 2), ({"gpu": {}, "shape": {}}, 1), ({"quota": {"enabled": False}}, 1)])
def test_the_old_job_is_built_only_for_a_check_that_needs_it(build, make_bundle, review, monkeypatch, checks, builds):
    from trainjob_admission.policies.decide import engine

    state = build.state(build.runtime())
    calls = []
    monkeypatch.setattr(engine.effective_job, "build", lambda obj, st, *more: calls.append(obj) or effective(obj, st, *more))
    review(build.trainjob(numNodes=2), [make_bundle({"checks": checks})], state, operation="UPDATE",
           old=build.trainjob(numNodes=1))
    assert len(calls) == builds


# --- quota ------------------------------------------------------------------------------------

def test_quota_example_over_quota_gives_numbers_and_fix(example_job, example_state):
    job = effective(example_job("over-quota"), example_state)
    (finding,) = quota_check(job, example_state.namespace_quotas("team-a"))
    assert "job needs 32 nvidia.com/gpu (8 nodes x 4)" in finding.message  # the launcher is one of the 8
    assert 'quota "compute" in team-a allows 32 and 24 are in use' in finding.message
    assert (finding.remediation, finding.nodes_at_most) == ("ask your admin to raise the quota", 2)


@pytest.mark.parametrize("value", ["1e20", "lots"])
def test_a_quota_value_beyond_counting_leaves_the_rest_of_the_quota_checked(build, value):
    """requests.storage: 1e20 is a valid quota (the API server keeps it exactly); it once switched
    off the whole quota, so an over-quota job was admitted with no warning."""
    job = job_of(build, numNodes=4, resourcesPerNode=per_node(gpus=2))  # 8 GPUs
    quota = build.quota({"requests.nvidia.com/gpu": "4", "requests.storage": value},
                        {"requests.nvidia.com/gpu": "0", "requests.storage": "0"})
    (finding,) = quota_check(job, [quota])
    assert "job needs 8 nvidia.com/gpu" in finding.message


def test_quota_used_is_subtracted(build):
    job = job_of(build, numNodes=4, resourcesPerNode=per_node(gpus=2))  # 4 nodes x 2 = 8 GPUs
    assert quota_check(job, [build.quota({"requests.nvidia.com/gpu": "8"}, {"requests.nvidia.com/gpu": "0"})]) == []
    (finding,) = quota_check(job, [build.quota({"requests.nvidia.com/gpu": "8"}, {"requests.nvidia.com/gpu": "1"})])
    assert "job needs 8 nvidia.com/gpu" in finding.message and "1 are in use" in finding.message
    assert finding.nodes_at_most == 3  # 7 free = 3 nodes x 2, the launcher among them


def test_quota_launcher_not_a_node_fix_counts_workers_only(build):
    job = job_of(build, build.runtime(launcher_as_node=False, ancestor="node"), numNodes=6,
                 resourcesPerNode=per_node(gpus=4))
    (finding,) = quota_check(job, [build.quota({"requests.nvidia.com/gpu": "32"}, {"requests.nvidia.com/gpu": "20"})])
    assert "job needs 24 nvidia.com/gpu (6 nodes x 4)" in finding.message
    assert finding.nodes_at_most == 3


@pytest.mark.parametrize("key, hard, words", [
    ("requests.cpu", "10", "job needs 16 cpu requests (4 nodes x 4)"),  # the launcher is one of them
    ("cpu", "10", "job needs 16 cpu requests"),
    ("requests.memory", "16Gi", "job needs 32Gi memory requests"),
    ("memory", "16Gi", "job needs 32Gi memory requests"),
    ("limits.cpu", "6", "job needs 8 cpu limits (4 nodes x 2)"),
    ("pods", "3", "job needs 4 pods"),
    ("count/pods", "3", "job needs 4 pods"),
])
def test_quota_keys(build, key, hard, words):
    resources = {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "8", "memory": "8Gi"}}
    if key == "limits.cpu":
        resources["limits"]["cpu"] = "2"
        resources["requests"]["cpu"] = "1"
    job = job_of(build, numNodes=4, resourcesPerNode=resources)
    findings = [f for f in quota_check(job, [build.quota({key: hard})]) if f.severity != "warn"]
    assert len(findings) == 1 and words in findings[0].message, findings
    assert f"allows {hard}" in findings[0].message


# Object counts, storage, scoped quotas and queued jobs: tests/unit/test_quota_*.py.


def test_quota_update_counts_only_growth(build):
    runtime = build.runtime()
    old = job_of(build, runtime, numNodes=4, resourcesPerNode=per_node(gpus=4))   # 16 GPUs, already in `used`
    grown = job_of(build, runtime, numNodes=6, resourcesPerNode=per_node(gpus=4))  # 24 GPUs
    q = build.quota({"requests.nvidia.com/gpu": "32"}, {"requests.nvidia.com/gpu": "20"})
    assert quota_check(grown, [q], old) == []  # needs 8 more, 12 free
    (finding,) = quota_check(grown, [q])  # as a CREATE it would need all 24
    assert "job needs 24" in finding.message
    q_tight = build.quota({"requests.nvidia.com/gpu": "32"}, {"requests.nvidia.com/gpu": "28"})
    (finding,) = quota_check(grown, [q_tight], old)
    assert "job needs 8 nvidia.com/gpu" in finding.message and "28 are in use" in finding.message
    same = job_of(build, runtime, numNodes=4, resourcesPerNode=per_node(gpus=4))
    full = build.quota({"requests.nvidia.com/gpu": "32"}, {"requests.nvidia.com/gpu": "32"})
    assert quota_check(same, [full], old) == []  # no growth, no demand


def test_quota_missing_request_is_a_warning(build):
    runtime = build.runtime(node=build.pod_spec(), launcher=build.pod_spec())
    for spec in (runtime["spec"]["template"]["spec"]["replicatedJobs"]):
        del spec["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
    job = job_of(build, runtime, numNodes=2)
    findings = quota_check(job, [build.quota({"requests.memory": "100Gi"})])
    (finding,) = findings
    assert finding.severity == "warn"
    assert 'quota "compute" in team-a tracks requests.memory' in finding.message
    assert "node container 'node'" in finding.message and "launcher container 'node'" in finding.message
    assert "resourcesPerNode.requests.memory" in finding.remediation
    # Once the job sets it, no warning.
    assert quota_check(job_of(build, runtime, numNodes=2, resourcesPerNode={"requests": {"memory": "1Gi"}}),
                       [build.quota({"requests.memory": "100Gi"})]) == []


def test_quota_missing_request_warns_through_the_engine(build, make_bundle, review):
    runtime = build.runtime(node=build.pod_spec(), launcher=build.pod_spec())
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        del rjob["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    state = build.state(runtime, build.quota({"requests.cpu": "100"}))
    decision = review(build.trainjob(numNodes=2), [make_bundle({"checks": {"quota": {}}})], state)
    assert decision.allowed and decision.decision == "warn"
    assert any("sets no cpu request" in w for w in decision.warnings)


def test_quota_per_worker_fix_when_no_worker_count_fits(build):
    job = job_of(build, build.runtime(launcher_as_node=False, ancestor="node"), numNodes=2,
                 resourcesPerNode=per_node(cpu="8"))
    (finding,) = quota_check(job, [build.quota({"requests.cpu": "12"}, {"requests.cpu": "0"})])
    # 17 cpu needed: launcher 1 fixed, 11 left, not enough for one more 8-cpu node beyond the first
    assert "job needs 17 cpu requests (2 nodes x 8 + the launcher x 1)" in finding.message
    assert finding.nodes_at_most == 1


# --- GPU --------------------------------------------------------------------------------------

def test_gpu_per_worker(example_job, example_state):
    job = effective(example_job("too-many-gpus"), example_state)
    findings = gpu.check(CheckContext(job), GpuCheck(maxPerWorker=8))
    (finding,) = findings
    assert finding.message == "each node, the launcher among them, requests 9 nvidia.com/gpu; the limit is 8 per node"
    assert 'spec.trainer.resourcesPerNode.limits["nvidia.com/gpu"] to 8 or less' in finding.remediation
    assert gpu.check(CheckContext(job), GpuCheck(maxPerWorker=9)) == []


def test_gpu_per_worker_names_workers_when_launcher_is_not_a_node(build):
    job = job_of(build, build.runtime(launcher_as_node=False, ancestor="node"), numNodes=4,
                 resourcesPerNode=per_node(gpus=6))
    (finding,) = gpu.check(CheckContext(job), GpuCheck(maxPerWorker=4))
    assert finding.message.startswith("each node requests 6 nvidia.com/gpu; the limit is 4 per node")
    assert finding.remediation == 'set spec.trainer.resourcesPerNode.limits["nvidia.com/gpu"] to 4 or less'


def test_gpu_per_job(build):
    job = job_of(build, build.runtime(launcher_as_node=False, ancestor="node"), numNodes=5,
                 resourcesPerNode=per_node(gpus=4))
    (finding,) = gpu.check(CheckContext(job), GpuCheck(maxPerJob=16))
    assert finding.message == "job requests 20 GPUs (5 nodes); the limit is 16 per job"
    assert (finding.remediation, finding.nodes_at_most) == (
        "reduce GPUs per node, or ask your admin for a larger GPU budget", 4)
    assert gpu.check(CheckContext(job), GpuCheck(maxPerJob=20)) == []


def test_per_worker_limits_hold_for_every_job_that_trains_whatever_its_name(build):
    """16 GPUs in a 'helper' replicated job of the runtime once escaped maxPerWorker 8, and its
    pods escaped maxWorkers: a job that is not the launcher or an initializer trains."""
    runtime = build.runtime()
    runtime["spec"]["template"]["spec"]["replicatedJobs"].append(
        {"name": "helper", "replicas": 3, "template": {"spec": {"template": {"spec": build.pod_spec(gpus=16)}}}})
    job = job_of(build, runtime, numNodes=2)
    (finding,) = gpu.check(CheckContext(job), GpuCheck(maxPerWorker=8))
    assert finding.message == "each node requests 16 nvidia.com/gpu; the limit is 8 per node"
    assert job.num_nodes == 2 + 3
    (too_many,) = shape.check(CheckContext(job), ShapeCheck(maxWorkers=4))
    assert too_many.message == "job has 5 nodes (spec.trainer.numNodes); the limit is 4"
    assert too_many.nodes_at_most == 1  # the runtime's 3 helper nodes stay


def test_gpu_allowed_resource_names(build):
    node = build.pod_spec()
    node["containers"][0]["resources"]["limits"] = {"amd.com/gpu": 1}
    job = job_of(build, build.runtime(node=node, launcher=build.pod_spec()), numNodes=2)
    (finding,) = gpu.check(CheckContext(job), GpuCheck(allowedResources=["nvidia.com/gpu"]))
    assert "node pods request 1 amd.com/gpu" in finding.message and "nvidia.com/gpu" in finding.remediation
    assert gpu.check(CheckContext(job), GpuCheck(allowedResources=["nvidia.com/gpu", "amd.com/gpu"])) == []
    assert gpu.check(CheckContext(job), GpuCheck(allowedResources=[])) == []  # empty: any accelerator


@pytest.mark.parametrize("launcher_as_node, allow, denied", [(False, False, True), (False, True, False),
                                                             (True, False, False)])
def test_gpu_on_launcher(build, launcher_as_node, allow, denied):
    runtime = build.runtime(launcher_as_node=launcher_as_node, ancestor="node",
                            node=build.pod_spec(gpus=1), launcher=build.pod_spec(gpus=2))
    job = job_of(build, runtime, numNodes=2)
    findings = gpu.check(CheckContext(job), GpuCheck(allowOnLauncher=allow))
    assert bool(findings) is denied
    if denied:
        assert "the launcher pod requests 2 nvidia.com/gpu" in findings[0].message


# --- shape ------------------------------------------------------------------------------------

def test_shape_max_workers(example_job, example_state):
    job = effective(example_job("too-many-nodes"), example_state)
    (finding,) = shape.check(CheckContext(job), ShapeCheck(maxWorkers=64))
    assert finding.message == "job has 65 nodes (spec.trainer.numNodes); the limit is 64"
    assert (finding.remediation, finding.nodes_at_most) == ("ask your admin to raise maxWorkers", 64)
    assert shape.check(CheckContext(job), ShapeCheck(maxWorkers=65)) == []


def test_shape_min_cpu_and_memory(build):
    job = job_of(build, numNodes=2, resourcesPerNode={"requests": {"cpu": "500m", "memory": "512Mi"}})
    findings = shape.check(CheckContext(job), ShapeCheck(minWorkerCpu="1", minWorkerMemory="1Gi"))
    assert [f.message for f in findings] == [
        "each node requests 500m cpu; the minimum per node is 1",
        "each node requests 512Mi memory; the minimum per node is 1Gi",
    ]
    assert findings[0].remediation == "set spec.trainer.resourcesPerNode.requests.cpu to at least 1"
    assert shape.check(CheckContext(job), ShapeCheck(minWorkerCpu="500m", minWorkerMemory="512Mi")) == []


def test_shape_allowed_runtimes(build):
    job = job_of(build, numNodes=2)
    (finding,) = shape.check(CheckContext(job), ShapeCheck(allowedRuntimes=["mpi-openmpi"]))
    assert finding.message == "runtime 'rt' is not allowed here" and "mpi-openmpi" in finding.remediation
    assert shape.check(CheckContext(job), ShapeCheck(allowedRuntimes=["rt"])) == []


@pytest.mark.parametrize("image, allowed, ok", [
    ("busybox", ["docker.io"], True),                       # bare names are Docker Hub
    ("library/busybox:1", ["docker.io"], True),
    ("busybox", ["quay.io"], False),
    ("quay.io/acme-ml/train:1", ["quay.io/acme-ml"], True),
    ("quay.io/acme-ml/train:1", ["quay.io/acme-ml/"], True),
    ("quay.io/acme-mlx/train:1", ["quay.io/acme-ml"], False),  # prefix is per path segment
    ("quay.io/other/train:1", ["quay.io/acme-ml"], False),
    ("quay.io/other/train:1", ["quay.io"], True),
    ("localhost:5000/x", ["localhost:5000"], True),
    ("registry.internal:5000/ml/x", ["registry.internal"], False),
    ("ghcr.io/kubeflow/trainer/x", ["ghcr.io/kubeflow"], True),
    ("index.docker.io/me/x", ["docker.io"], True),  # the kubelet pulls it from Docker Hub
    ("index.docker.io/me/x", ["quay.io"], False),
    ("MyRegistry/x", ["docker.io"], False),  # a capitalised first component is a host, as the kubelet reads it
])
def test_registry_allowed(image, allowed, ok):
    assert shape.registry_allowed(image, allowed) is ok


def test_shape_registries_flags_each_image(build):
    job = job_of(build, numNodes=2, image="docker.io/me/train:1")
    (finding,) = shape.check(CheckContext(job), ShapeCheck(allowedRegistries=["quay.io/acme-ml"]))
    assert "launcher image 'docker.io/me/train:1' comes from docker.io" in finding.message
    (finding,) = shape.check(CheckContext(job_of(build, numNodes=2, image="train:1")), ShapeCheck(allowedRegistries=["quay.io"]))
    assert "comes from docker.io" in finding.message


def test_shape_required_labels(build):
    job = job_of(build, numNodes=2, labels={"team": "a"})
    (finding,) = shape.check(CheckContext(job), ShapeCheck(requiredLabels=["team", "cost-center"]))
    assert finding.message == "job is missing required label cost-center"
    assert shape.check(CheckContext(job_of(build, numNodes=2, labels={"team": "a", "cost-center": "x"})),
                       ShapeCheck(requiredLabels=["team", "cost-center"])) == []


# --- pod security -----------------------------------------------------------------------------

PSS_ONLY = {"openshiftSCC": "never", "honorNamespaceLabel": False}


def _psa(build, node=None, launcher=None, namespace=None, **settings):
    runtime = build.runtime(node=node or build.pod_spec(), launcher=launcher or build.pod_spec())
    job = job_of(build, runtime, numNodes=2)
    settings, namespace = PodSecurityCheck(**settings), namespace or build.namespace()
    level, findings = podsecurity.effective_level(settings, namespace), podsecurity.check(CheckContext(job, namespace=namespace), settings)
    return level, " ".join(f.message for f in findings), findings


def test_conformant_runtime_passes_restricted(build):
    assert _psa(build, defaultLevel="restricted", **PSS_ONLY)[2] == []


def test_silent_pod_passes_baseline_but_not_restricted(build):
    silent = build.pod_spec(secure=False)
    assert _psa(build, node=silent, launcher=copy.deepcopy(silent), defaultLevel="baseline", **PSS_ONLY)[2] == []
    _, text, findings = _psa(build, node=silent, launcher=copy.deepcopy(silent), defaultLevel="restricted", **PSS_ONLY)
    assert len(findings) == 2  # one per pod set, each listing every violation
    for path in ("spec.containers[node].securityContext.allowPrivilegeEscalation",
                 "spec.containers[node].securityContext.runAsNonRoot",
                 "spec.containers[node].securityContext.seccompProfile",
                 "spec.containers[node].securityContext.capabilities.drop"):
        assert path in findings[0].message and path in findings[1].message
    assert 'node pod violates Pod Security "restricted"' in text
    assert "replicatedJobs[launcher] pod template" in text
    assert "set allowPrivilegeEscalation: false" in findings[0].remediation


@pytest.mark.parametrize("mutate, path", [
    (lambda s: s["containers"][0]["securityContext"].update(privileged=True),
     "spec.containers[node].securityContext.privileged"),
    (lambda s: s.update(hostNetwork=True), "spec.hostNetwork"),
    (lambda s: s.update(hostPID=True), "spec.hostPID"),
    (lambda s: s.update(volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}]), "spec.volumes[dev].hostPath"),
    (lambda s: s["containers"][0]["securityContext"].update(capabilities={"add": ["SYS_ADMIN"], "drop": ["ALL"]}),
     "spec.containers[node].securityContext.capabilities.add"),
    (lambda s: s["containers"][0].update(ports=[{"containerPort": 2222, "hostPort": 2222}]),
     "spec.containers[node].ports[2222].hostPort"),
    (lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}),
     "spec.securityContext.seccompProfile.type"),
    (lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
     "spec.securityContext.sysctls"),
    (lambda s: s.update(initContainers=[{"name": "init", "image": "x", "securityContext": {"privileged": True}}]),
     "spec.initContainers[init].securityContext.privileged"),
])
@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_baseline_violations_have_field_paths(build, mutate, path, level):
    node = build.pod_spec()
    mutate(node)
    _, text, findings = _psa(build, node=node, defaultLevel=level, **PSS_ONLY)
    assert path in text
    assert all(f.message.startswith("node pod") for f in findings)  # the launcher is fine


def test_restricted_only_violations(build):
    for mutate, path in [
        (lambda s: s["containers"][0]["securityContext"].update(capabilities={"add": ["CHOWN"], "drop": ["ALL"]}),
         "spec.containers[node].securityContext.capabilities.add"),
        (lambda s: s["securityContext"].update(runAsUser=0), "spec.securityContext.runAsUser"),
        (lambda s: s.update(volumes=[{"name": "nfs", "nfs": {"server": "x", "path": "/"}}]), "spec.volumes[nfs]"),
    ]:
        node = build.pod_spec()
        mutate(node)
        assert _psa(build, node=node, defaultLevel="baseline", **PSS_ONLY)[2] == []
        assert path in _psa(build, node=node, defaultLevel="restricted", **PSS_ONLY)[1]


def test_container_run_as_non_root_false_overrides_pod(build):
    node = build.pod_spec()
    node["containers"][0]["securityContext"]["runAsNonRoot"] = False
    assert "securityContext.runAsNonRoot" in _psa(build, node=node, defaultLevel="restricted", **PSS_ONLY)[1]


def test_namespace_label_honoured_or_ignored(build):
    silent = build.pod_spec(secure=False)
    ns = build.namespace(labels={"pod-security.kubernetes.io/enforce": "baseline"})
    level, _, findings = _psa(build, node=silent, launcher=copy.deepcopy(silent), namespace=ns,
                              defaultLevel="restricted", openshiftSCC="never", honorNamespaceLabel=True)
    assert level == "baseline" and findings == []
    level, _, findings = _psa(build, node=silent, launcher=copy.deepcopy(silent), namespace=ns,
                              defaultLevel="restricted", openshiftSCC="never", honorNamespaceLabel=False)
    assert level == "restricted" and findings
    # A stricter namespace label also wins over a looser bundle level.
    strict = build.namespace(labels={"pod-security.kubernetes.io/enforce": "restricted"})
    level, _, findings = _psa(build, node=silent, namespace=strict, defaultLevel="baseline", openshiftSCC="never")
    assert level == "restricted" and findings
    # A bogus label value is restricted, as Pod Security admission reads it (api/helpers.go
    # ParseLevel fails closed); with honorNamespaceLabel false the label is not read at all.
    bogus = build.namespace(labels={"pod-security.kubernetes.io/enforce": "yes-please"})
    assert _psa(build, namespace=bogus, defaultLevel="baseline", openshiftSCC="never")[0] == "restricted"
    assert _psa(build, namespace=bogus, defaultLevel="baseline", **PSS_ONLY)[0] == "baseline"


def test_privileged_level_skips_pss(build):
    node = build.pod_spec()
    node["containers"][0]["securityContext"]["privileged"] = True
    assert _psa(build, node=node, defaultLevel="privileged", **PSS_ONLY)[2] == []


def test_openshift_scc_uid_range(build):
    ns = build.namespace(annotations={"openshift.io/sa.scc.uid-range": "1000680000/10000"})
    assert sccadmission.Allocations.of(ns).uids == (1000680000, 1000689999)
    # pod_spec() sets runAsUser 1000: outside the namespace range.
    _, text, findings = _psa(build, namespace=ns, defaultLevel="privileged", openshiftSCC="auto", honorNamespaceLabel=False)
    assert "spec.securityContext.runAsUser" in text
    assert "runAsUser 1000 is outside the namespace's UID range 1000680000-1000689999" in text
    assert "OpenShift SCC restricted-v2" in text
    inside = build.pod_spec()
    inside["securityContext"]["runAsUser"] = 1000685000
    assert _psa(build, node=inside, launcher=copy.deepcopy(inside), namespace=ns, defaultLevel="privileged",
                openshiftSCC="auto")[2] == []
    # Not on OpenShift (no annotation): auto skips the SCC; never skips it everywhere.
    assert _psa(build, defaultLevel="privileged", openshiftSCC="auto")[2] == []
    assert _psa(build, namespace=ns, defaultLevel="privileged", openshiftSCC="never")[2] == []
    # always: the SCC's refusals even without the annotation (no range to compare UIDs with).
    root = build.pod_spec(secure=False)
    root["securityContext"] = {"runAsUser": 0}
    assert "runs as root" in _psa(build, node=root, defaultLevel="privileged", openshiftSCC="always")[1]
    assert _psa(build, node=root, defaultLevel="privileged", openshiftSCC="auto")[2] == []


def test_openshift_fs_group_is_the_first_supplemental_group(build):
    """restricted-v2's fsGroup MustRunAs takes one group: the start of the first block of
    openshift.io/sa.scc.supplemental-groups (apiserver-library-go sccmatching/matcher.go
    getPreallocatedFSGroup), which SCC admission also fills in where the pod sets none."""
    ns = build.namespace(annotations={"openshift.io/sa.scc.uid-range": "1000680000/10000",
                                      "openshift.io/sa.scc.supplemental-groups": "2000/100,5000/10"})
    node = build.pod_spec(secure=False)
    node["securityContext"] = {"fsGroup": 2000}
    silent = build.pod_spec(secure=False)
    assert _psa(build, node=node, launcher=silent, namespace=ns, defaultLevel="privileged")[2] == []
    for other in (2050, 5000, 1000685000):  # in a block, in the second block, in the UID range
        node["securityContext"] = {"fsGroup": other}
        assert f"fsGroup {other} is not the namespace's group 2000" in \
            _psa(build, node=node, launcher=copy.deepcopy(silent), namespace=ns, defaultLevel="privileged")[1]
    # nonroot-v2 (fsGroup RunAsAny) admits it where the admin granted it.
    assert _psa(build, node=node, launcher=copy.deepcopy(silent), namespace=ns, defaultLevel="privileged",
                openshiftSCCs=["restricted-v2", "nonroot-v2"])[2] == []


OPENSHIFT = {"openshift.io/sa.scc.uid-range": "1000680000/10000"}


def test_openshift_scc_rejects_explicit_contradictions_only(build):
    ns = build.namespace(annotations=OPENSHIFT)
    silent = build.pod_spec(secure=False)  # SCC admission would fill these in: fine
    assert _psa(build, node=silent, launcher=copy.deepcopy(silent), namespace=ns, defaultLevel="privileged")[2] == []
    node = build.pod_spec(secure=False)
    node["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": True, "runAsUser": 0,
                                                "capabilities": {"add": ["NET_ADMIN"]},
                                                "seccompProfile": {"type": "Localhost", "localhostProfile": "x"}}
    node["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
    _, text, _ = _psa(build, node=node, namespace=ns, defaultLevel="privileged")
    for path in ("spec.containers[node].securityContext.allowPrivilegeEscalation",
                 "spec.containers[node].securityContext.runAsUser",
                 "spec.containers[node].securityContext.capabilities.add",
                 "spec.containers[node].securityContext.seccompProfile.type",
                 "spec.volumes[host].hostPath"):
        assert path in text


# --- the default bundle on stock-shaped jobs ----------------------------------------------------

def _stock(build, review, default, namespace: dict, node: dict | None = None):
    """A job as Trainer's stock runtimes and the SDK build them: no securityContext at all."""
    silent = build.pod_spec(secure=False)
    runtime = build.runtime(node=node or silent, launcher=copy.deepcopy(silent))
    decision = review(build.trainjob(numNodes=2), default, build.state(runtime, namespace))
    return decision, [m for m in decision.messages if m["rule"] == "default/pod-security"]


def test_stock_job_admitted_in_unlabelled_namespace(build, review, default):
    decision, denials = _stock(build, review, default, build.namespace())
    assert denials == [] and decision.allowed, decision.messages


def test_stock_job_denied_under_restricted_label_with_the_field(build, review, default):
    ns = build.namespace(labels={"pod-security.kubernetes.io/enforce": "restricted"})
    decision, (denial, *_) = _stock(build, review, default, ns)
    assert not decision.allowed
    assert 'violates Pod Security "restricted"' in denial["message"]
    assert "spec.containers[node].securityContext.runAsNonRoot" in denial["message"]


def test_stock_job_on_openshift_admitted_when_only_scc_defaults_are_missing(build, review, default):
    decision, denials = _stock(build, review, default, build.namespace(annotations=OPENSHIFT))
    assert denials == [] and decision.allowed, decision.messages


@pytest.mark.parametrize("securityContext, path", [
    ({"runAsUser": 1000}, "spec.containers[node].securityContext.runAsUser"),
    ({"privileged": True}, "spec.containers[node].securityContext.privileged"),
])
def test_stock_job_on_openshift_denied_for_what_the_scc_refuses(build, review, default, securityContext, path):
    node = build.pod_spec(secure=False)
    node["containers"][0]["securityContext"] = securityContext
    decision, (denial,) = _stock(build, review, default, build.namespace(annotations=OPENSHIFT), node)
    assert not decision.allowed and path in denial["message"]
    if "runAsUser" in securityContext:
        assert "OpenShift SCC restricted-v2" in denial["message"] and "1000680000-1000689999" in denial["message"]


def test_example_privileged_runtime_is_denied_with_paths(example_job, example_state, default, review):
    decision = review(example_job("privileged"), default, example_state)
    assert not decision.allowed
    (message,) = decision.messages
    assert message["rule"] == "default/pod-security"
    assert message["message"].startswith('launcher pod violates Pod Security "restricted"')
    assert "spec.containers[node].securityContext.privileged (privileged is true)" in message["message"]
    assert "ClusterTrainingRuntime mpi-privileged" in message["message"]
    assert "remove privileged: true" in message["remediation"]


# --- where a fix goes: spec.trainer only for what Trainer copies into the container --------------

def test_registry_fix_names_the_field_that_sets_each_image(build):
    # The trainer ancestor's "node" container takes spec.trainer.image; the other job keeps the
    # runtime's image, which a runtimePatch cannot change (the CRD prunes it); a sidecar likewise.
    node = build.pod_spec(image="docker.io/acme/sshd:1")
    node["containers"].append({"name": "metrics", "image": "docker.io/acme/exporter:2"})
    job = job_of(build, build.runtime(node=node), numNodes=2, image="docker.io/me/train:1")
    fixes = {f.message.split(" comes from")[0]: f.remediation for f in shape.check(CheckContext(job), ShapeCheck(allowedRegistries=["quay.io"]))}
    assert fixes == {
        "launcher image 'docker.io/me/train:1'": "use an image from quay.io in spec.trainer.image",
        "node image 'docker.io/acme/sshd:1'": "use an image from quay.io in containers[name=node].image of "
                                              "ClusterTrainingRuntime rt, replicatedJobs[node] pod template (only the "
                                              "runtime sets it; spec.runtimePatches cannot change it)",
        "node image 'docker.io/acme/exporter:2'": "use an image from quay.io in containers[name=metrics].image of "
                                                  "ClusterTrainingRuntime rt, replicatedJobs[node] pod template (only "
                                                  "the runtime sets it; spec.runtimePatches cannot change it)",
    }


def test_registry_fix_for_a_legacy_mpijob_names_its_replica_spec(example_job, example_state):
    obj = example_job("legacy-mpijob")
    obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["image"] = "horovod/horovod:0.28.1"
    findings = shape.check(CheckContext(effective(obj, example_state)), ShapeCheck(allowedRegistries=["quay.io"]))
    (finding,) = findings
    name = obj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["name"]
    assert finding.remediation == (f"use an image from quay.io in spec.mpiReplicaSpecs.Launcher.template.spec."
                                   f"containers[name={name}].image")


def test_quota_missing_value_fix_names_each_containers_field(build):
    # resourcesPerNode reaches "node" containers of the trainer ancestor and, with the launcher
    # as a node, of the node job; a sidecar's value only comes from the template.
    launcher = build.pod_spec()
    launcher["containers"].append({"name": "log-shipper", "image": "quay.io/acme/fluent:1"})
    job = job_of(build, build.runtime(launcher=launcher), numNodes=2, resourcesPerNode={"requests": {"cpu": "2"}})
    (finding,) = quota_check(job, [build.quota({"requests.memory": "100Gi"})])
    assert "launcher container 'log-shipper' sets no memory request" in finding.message
    assert finding.remediation == ("set containers[name=log-shipper].resources.requests.memory of "
                                   "ClusterTrainingRuntime rt, replicatedJobs[launcher] pod template (only the runtime "
                                   "sets it; spec.runtimePatches cannot change it); or ask your admin for a LimitRange "
                                   "default")


def test_every_finding_on_one_field_is_named(build):
    """Two forbidden sysctls are two findings, each naming its sysctl; tcp_rmem/tcp_wmem are safe
    from v1.32 (check_sysctls.go sysctlsAllowedV1Dot32) and refused before."""
    node = build.pod_spec()
    node["securityContext"]["sysctls"] = [{"name": "net.ipv4.tcp_wmem", "value": "4096 16384 4194304"},
                                          {"name": "kernel.msgmax", "value": "65536"},
                                          {"name": "net.core.somaxconn", "value": "1024"}]
    _, text, _ = _psa(build, node=node, defaultLevel="baseline", **PSS_ONLY)
    assert "sets unsafe sysctl kernel.msgmax" in text and "sets unsafe sysctl net.core.somaxconn" in text
    assert "tcp_wmem" not in text
    pinned = build.namespace(labels={"pod-security.kubernetes.io/enforce": "baseline",
                                     "pod-security.kubernetes.io/enforce-version": "v1.31"})
    _, text, _ = _psa(build, node=node, namespace=pinned, openshiftSCC="never")
    assert 'Pod Security "baseline" at v1.31' in text
    for name in ("net.ipv4.tcp_wmem", "kernel.msgmax", "net.core.somaxconn"):
        assert f"spec.securityContext.sysctls[{name}] (sets unsafe sysctl {name})" in text


@pytest.mark.parametrize("version, refused", [
    ("v1.18", False),  # the field was not yet judged: seccomp annotations only (v1.0-v1.18)
    ("v1.19", True), ("latest", True), ("not-a-version", True),  # unparsable: the newest
])
def test_enforce_version_picks_the_policy_version(build, version, refused):
    node = build.pod_spec()
    node["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    ns = build.namespace(labels={"pod-security.kubernetes.io/enforce": "baseline",
                                 "pod-security.kubernetes.io/enforce-version": version})
    assert bool(_psa(build, node=node, namespace=ns, openshiftSCC="never")[2]) is refused


def test_user_namespaced_pods_are_relaxed_from_v1_35(build):
    """hostUsers: false lets a pod run as UID 0 in its user namespace and use procMount Unmasked
    at baseline (check_runAsUser.go, check_runAsNonRoot.go, check_procMount_baseline.go 1.35);
    restricted still refuses Unmasked (check_procMount_restricted.go)."""
    node = build.pod_spec()
    node["hostUsers"] = False
    node["securityContext"].update(runAsUser=0, runAsNonRoot=False)
    node["containers"][0]["securityContext"]["procMount"] = "Unmasked"
    for version, level, findings in [("v1.34", "baseline", ["procMount"]), ("v1.35", "baseline", []),
                                     ("v1.34", "restricted", ["procMount", "runAsUser", "runAsNonRoot"]),
                                     ("v1.35", "restricted", ["procMount"])]:
        ns = build.namespace(labels={"pod-security.kubernetes.io/enforce": level,
                                     "pod-security.kubernetes.io/enforce-version": version})
        _, text, _ = _psa(build, node=node, namespace=ns, openshiftSCC="never")
        assert sorted(f for f in ("procMount", "runAsUser", "runAsNonRoot") if f"securityContext.{f}" in text) == \
            sorted(findings), (version, level, text)


MCS = {**OPENSHIFT, "openshift.io/sa.scc.mcs": "s0:c27,c4"}


@pytest.mark.parametrize("options, refused", [
    (None, []),  # SCC admission fills in the namespace's level
    ({"level": "s0:c27,c4"}, []),
    ({"level": "s0:c4,c27"}, []),  # the same categories in another order (selinux/mustrunas.go equalLevels)
    ({"level": "s0:c1,c2"}, ["seLinuxOptions.level"]),
    ({"level": "s1:c27,c4"}, ["seLinuxOptions.level"]),
    ({"type": "container_t"}, ["seLinuxOptions.level", "seLinuxOptions.type"]),  # no level: not the namespace's
    ({"level": "s0:c27,c4", "type": "spc_t"}, ["seLinuxOptions.type"]),
])
def test_openshift_scc_selinux_level_is_the_namespaces_mcs(build, options, refused):
    """restricted-v2's seLinuxContext MustRunAs takes the level of openshift.io/sa.scc.mcs and no
    type, user or role (apiserver-library-go selinux/mustrunas.go Validate); pod and container alike."""
    for where in ("pod", "container"):
        node = build.pod_spec(secure=False)
        if options is not None:
            target = node if where == "pod" else node["containers"][0]
            target["securityContext"] = {"seLinuxOptions": options}
        _, text, _ = _psa(build, node=node, launcher=build.pod_spec(secure=False),
                          namespace=build.namespace(annotations=MCS), defaultLevel="privileged")
        found = sorted({f for f in ("seLinuxOptions.level", "seLinuxOptions.type") if f in text})
        assert found == sorted(refused), (where, text)
        if refused and "level" in refused[0]:
            assert "not the namespace's s0:c27,c4" in text and "OpenShift SCC restricted-v2" in text


def test_pod_security_judges_the_pod_as_the_scc_filled_it_in(build):
    """On OpenShift, Pod Security admission runs after SCC admission: a silent pod gets a UID from
    the range, runAsNonRoot, drop ALL, no privilege escalation and seccomp runtime/default, so
    restricted admits it there and refuses it elsewhere."""
    silent = build.pod_spec(secure=False)
    restricted = {"pod-security.kubernetes.io/enforce": "restricted"}
    on_openshift = build.namespace(labels=restricted, annotations=MCS)
    assert _psa(build, node=silent, launcher=copy.deepcopy(silent), namespace=on_openshift)[2] == []
    assert _psa(build, node=silent, launcher=copy.deepcopy(silent), namespace=build.namespace(labels=restricted))[2]


def test_nonroot_v2_admits_any_non_root_uid_where_granted(build):
    """nonroot-v2 (MustRunAsNonRoot): runAsUser 1000 outside the range is refused by restricted-v2
    and admitted by nonroot-v2; root is refused by both."""
    node = build.pod_spec(secure=False)
    node["securityContext"] = {"runAsUser": 1000}
    ns = build.namespace(annotations=MCS)
    both = ["restricted-v2", "nonroot-v2"]
    assert "outside the namespace's UID range" in _psa(build, node=node, namespace=ns, defaultLevel="privileged")[1]
    assert _psa(build, node=node, launcher=build.pod_spec(secure=False), namespace=ns, defaultLevel="privileged",
                openshiftSCCs=both)[2] == []
    node["securityContext"] = {"runAsUser": 0}
    _, text, _ = _psa(build, node=node, namespace=ns, defaultLevel="privileged", openshiftSCCs=both)
    assert "OpenShift SCC restricted-v2" in text and "runs as root" in text
