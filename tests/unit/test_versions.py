"""What the cluster runs, and each behaviour keyed by it (policies/k8s/versions.py): every gate is
judged on both sides with objects of each version read from the Go module cache (the TrainJob CRDs
of Trainer v2.0 to v2.3, Kueue v0.14's and v0.19's CRDs and their own example queues), and the
Kubernetes version as `kubectl version -o yaml` prints it."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import upstream
from trainjob_admission.policies.capacity import clusterqueues
from trainjob_admission.policies.k8s import kueueapi, versions
from trainjob_admission.policies.k8s.clusterstate import ClusterState, parse_objects
from trainjob_admission.policies.k8s.versions import NEWEST, GATES, Versions

CRD = "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml"
# (module key, stack) of each Trainer release's TrainJob CRD, and the release it is
TRAINER_CRDS = {(2, 0): ("trainer-v2.0", "newest"), (2, 1): ("trainer-v2.1", "newest"),
                (2, 2): ("trainer", "oldest"), (2, 3): ("trainer", "newest")}
KUEUE_STACKS = {"v1beta1": "oldest", "v1beta2": "newest"}  # Kueue v0.14.0, v0.19.0
GPU = "nvidia.com/gpu"
SCRIPT = Path(sys.executable).parent / "trainjob-admission"


def trainjob_crd(release: tuple[int, int]) -> dict:
    key, stack = TRAINER_CRDS[release]
    try:
        return upstream.objects({"module": key, "stack": stack, "path": CRD}, Path())[0]
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))


def kueue_objects(api: str, path: str) -> list[dict]:
    try:
        return upstream.objects({"module": "kueue", "stack": KUEUE_STACKS[api], "path": path}, Path())
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))


def kubectl_version(git: str, minor: str) -> str:
    """What `kubectl version -o yaml` prints (a client v1.36.3 against the server ``git``): no kind."""
    return f"""clientVersion:
  buildDate: "1970-01-01T00:00:00Z"
  compiler: gc
  gitCommit: ""
  gitTreeState: clean
  gitVersion: v1.36.3
  goVersion: go1.26.8
  major: "1"
  minor: "36"
  platform: linux/amd64
kustomizeVersion: v5.7.1
serverVersion:
  buildDate: "1970-01-01T00:00:00Z"
  compiler: gc
  gitCommit: ""
  gitTreeState: clean
  gitVersion: {git}
  goVersion: go1.26.8
  major: "1"
  minor: "{minor}"
  platform: linux/amd64
"""


def cluster(kubernetes: str = "v1.36.3", trainer: tuple[int, int] | None = (2, 3), *objects: dict) -> ClusterState:
    """A state as review --cluster-state reads it, with the version document and the TrainJob CRD."""
    minor = kubernetes.split(".")[1]
    found = parse_objects(kubectl_version(kubernetes, minor), "version.yaml") + list(copy.deepcopy(objects))
    if trainer is not None:
        found.append(trainjob_crd(trainer))
    return ClusterState.from_objects(found)


# -- reading the facts -------------------------------------------------------------------------------

@pytest.mark.parametrize("release", sorted(TRAINER_CRDS))
def test_trainer_release_is_read_from_its_trainjob_crd(release):
    assert versions.trainer_of_crd(trainjob_crd(release)) == release


def test_a_trainer_older_than_v2_2_is_refused_naming_the_supported_range():
    for release, shape in (((2, 1), "spec.podTemplateOverrides"), ((2, 0), "spec.podSpecOverrides")):
        state = cluster("v1.34.4", release)
        problem = state.versions.unsupported()
        assert problem and f"Trainer v{release[0]}.{release[1]} ({shape})" in problem, problem
        assert "supported are Trainer v2.2 and v2.3" in problem and "upgrade Trainer to v2.2" in problem
    assert cluster("v1.34.4", (2, 2)).versions.unsupported() is None


def test_the_api_servers_version_is_read_as_kubectl_version_prints_it():
    state = cluster("v1.31.0")
    assert (state.versions.kubernetes, state.versions.kubernetes_version) == ((1, 31), "v1.31.0")
    assert state.versions.source == {"kubernetes": "cluster-state", "trainer": "cluster-state", "kueue": "default"}
    # distributions report "31+" as the minor (OpenShift, EKS): the digits count
    plus = parse_objects(kubectl_version("v1.31.6+rhcos", "31+"), "version.yaml")
    assert versions.from_objects(plus).kubernetes == (1, 31)


def test_without_any_version_the_newest_is_assumed_and_said():
    state = ClusterState.from_objects([])
    assert state.versions == NEWEST and state.versions.source == dict.fromkeys(("kubernetes", "trainer", "kueue"), "default")
    assert versions.defaulted(state.versions)[0].startswith("Kubernetes 1.36")


@pytest.mark.parametrize("api", sorted(KUEUE_STACKS))
def test_the_kueue_api_is_read_from_its_crds(api):
    crds = kueue_objects(api, "config/components/crd/bases/kueue.x-k8s.io_localqueues.yaml")
    assert versions.from_objects(crds).kueue_api == api


def test_flags_win_over_the_state_file():
    found = versions.from_flags(cluster("v1.36.3").versions, kubernetes="1.31", trainer="v2.2", kueue_api="v1beta1")
    assert (found.kubernetes, found.trainer, found.kueue_api) == ((1, 31), (2, 2), "v1beta1")
    assert found.source == {"kubernetes": "flag", "trainer": "flag", "kueue": "flag"}
    with pytest.raises(versions.VersionError, match="--kubernetes-version 'latest'"):
        versions.from_flags(NEWEST, kubernetes="latest")


def test_outside_the_tested_matrix_is_a_warning_not_a_refusal():
    old = Versions(kubernetes=(1, 29))
    assert old.outside_matrix() and "outside the tested 1.31-1.36" in old.outside_matrix()[0]
    assert old.unsupported() is None
    assert not Versions(kubernetes=(1, 31), trainer=(2, 2), kueue_api="v1beta1").outside_matrix()


def test_every_gate_names_its_upstream_source_and_is_in_the_support_statement():
    statement = (Path(__file__).parents[2] / "docs/deploy.md").read_text()
    for name, gate in GATES.items():
        assert gate.source and ("k8s.io/" in gate.source or "kubeflow/trainer" in gate.source
                                or "sigs.k8s.io/kueue" in gate.source), name
        assert f"| `{name}` |" in statement, f"docs/deploy.md \"Supported versions\" does not list the gate {name}"


# -- Kubernetes gates -------------------------------------------------------------------------------

def pod_level_runtime(build) -> dict:
    """An MPI runtime whose pods ask 2 cpu at pod level (their container asks 1)."""
    runtime = build.runtime(launcher_as_node=False)
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        rjob["template"]["spec"]["template"]["spec"]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}
    return runtime


@pytest.mark.parametrize("kubernetes, per_pod", [("v1.31.0", 1000), ("v1.33.4", 1000), ("v1.34.0", 2000),
                                                 ("v1.36.3", 2000)])
def test_pod_level_resources_count_from_1_34_and_are_dropped_before(build, make_bundle, review, kubernetes, per_pod):
    state = cluster(kubernetes, (2, 3), pod_level_runtime(build), build.namespace(),
                    build.quota({"requests.cpu": "5"}))
    decision = review(build.trainjob(numNodes=2), [make_bundle({"checks": {"quota": {}}})], state)
    assert [ps.requests["cpu"] for ps in decision.job.pod_sets] == [per_pod, per_pod]
    kept = per_pod == 2000
    assert all(("resources" in ps.pod["spec"]) == kept for ps in decision.job.pod_sets)
    # 3 pods against 5 cpu: 6 with pod-level resources, 3 without (the submitter is told what is dropped)
    assert decision.allowed != kept, decision.messages
    dropped = [w for w in decision.warnings if "the API server drops" in w]
    assert bool(dropped) != kept and all("spec.resources (pod-level resources: from Kubernetes 1.34)" in w
                                         for w in dropped), decision.warnings


@pytest.mark.parametrize("kubernetes, sidecar", [("v1.28.9", False), ("v1.29.0", True), ("v1.31.0", True)])
def test_a_restartable_init_container_is_a_sidecar_from_1_29(build, review, default, kubernetes, sidecar):
    """A 4-cpu sidecar beside a 1-cpu app container: 5 cpu a pod as a sidecar; before 1.29 the API
    server drops restartPolicy and it is an init container that ends first (max(4, 1) = 4)."""
    runtime = build.runtime(launcher_as_node=False)
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["initContainers"] = [{"name": "proxy", "image": "quay.io/acme-ml/proxy:1", "restartPolicy": "Always",
                              "resources": {"requests": {"cpu": "4"}}, **{k: v for k, v in pod["containers"][0].items()
                                                                          if k == "securityContext"}}]
    decision = review(build.trainjob(numNodes=1), default, cluster(kubernetes, (2, 3), runtime, build.namespace()))
    assert decision.job.pod_sets[0].requests["cpu"] == (5000 if sidecar else 4000)


@pytest.mark.parametrize("kubernetes, refused", [("v1.28.0", True), ("v1.29.0", False), ("v1.31.0", False)])
def test_cel_is_checked_at_the_library_level_vap_compiles_at(build, kubernetes, refused):
    """quantity() came with Kubernetes 1.28's CEL environment, which a 1.29 API server compiles
    new expressions at (n-1); a 1.28 one still compiles at 1.27 and refuses it."""
    from trainjob_admission.policies.bundle.compile import BundleError, compile_document

    document = build.bundle_document({"validations": [
        {"name": "cpu", "expression": "quantity('1') .isLessThan(quantity('2'))", "message": "m"}]})
    found = cluster(kubernetes, None).versions
    if not refused:
        compile_document(document, "b.yaml", versions=found)
        return
    with pytest.raises(BundleError) as info:
        compile_document(document, "b.yaml", versions=found)
    assert "isLessThan() and quantity() are in the Kubernetes CEL quantity library from 1.28" in str(info.value)
    assert "compiles new ValidatingAdmissionPolicy expressions at 1.27" in str(info.value)


def test_policy_lint_takes_the_clusters_version(tmp_path):
    bundle = tmp_path / "b.yaml"
    bundle.write_text(yaml.safe_dump({"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
                                      "metadata": {"name": "b"}, "spec": {"validations": [
                                          {"name": "q", "expression": "quantity('1').isInteger()", "message": "m"}]}}))
    for version, code in (("1.28", 2), ("1.31", 0)):
        result = subprocess.run([str(SCRIPT), "policy", "lint", str(bundle), "--kubernetes-version", version],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == code, result.stdout + result.stderr


# -- Trainer gates ---------------------------------------------------------------------------------

@pytest.mark.parametrize("release, cpu", [((2, 2), 0), ((2, 3), 1000)])
def test_resources_per_node_merge_from_v2_3_and_replace_in_v2_2(build, review, default, example_state, release, cpu):
    """examples/runtimes/mpi-openmpi.yaml asks 1 cpu and 2Gi per node container; the job gives only a
    GPU limit: v2.3 merges (1 cpu, 2Gi and the GPU), v2.2 replaces (the GPU alone)."""
    runtime = example_state.cluster_runtimes["mpi-openmpi"]
    state = cluster("v1.31.0", release, runtime, build.namespace())
    job = build.trainjob(runtime="mpi-openmpi", numNodes=2, resourcesPerNode={"limits": {GPU: "1"}})
    decision = review(job, default, state)
    assert {ps.name: (ps.requests.get("cpu", 0), ps.gpus) for ps in decision.job.pod_sets} == {
        "node": (cpu, {GPU: 1}), "launcher": (cpu, {GPU: 1})}


@pytest.mark.parametrize("release, kept", [((2, 2), False), ((2, 3), True)])
def test_a_patchs_termination_grace_period_is_kept_from_v2_3(build, release, kept):
    from trainjob_admission.policies.job import effective_job

    patch = {"manager": "example.test/x", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 5}}}}}]}}}}
    job = effective_job.build(build.trainjob(numNodes=2, runtime_patches=[patch]),
                              cluster("v1.34.0", release, build.runtime(launcher_as_node=False), build.namespace()))
    node = next(ps for ps in job.pod_sets if ps.name == "node")
    assert ("terminationGracePeriodSeconds" in node.pod["spec"]) == kept


@pytest.mark.parametrize("release, snapshot_used", [((2, 2), False), ((2, 3), True)])
def test_an_update_is_judged_against_the_runtime_snapshot_only_from_v2_3(build, make_bundle, review, release,
                                                                          snapshot_used):
    """The runtime now asks 16 GPUs a worker, the job's snapshot 4: Trainer v2.3 rebuilds the job from
    the snapshot, v2.2 has none and reads the live runtime (the ConfigMap is nobody's)."""
    from tests.unit.test_runtime_snapshot import GPU_CHECK, gpu_runtime, job, snapshot

    state = cluster("v1.34.0", release, gpu_runtime(build, 16), snapshot(gpu_runtime(build, 4)), build.namespace())
    decision = review(job(build, labels={"team": "vision"}), [make_bundle(GPU_CHECK)], state, operation="UPDATE",
                      old=job(build))
    assert decision.job.pod_sets[0].gpus == {GPU: 4 if snapshot_used else 16}
    assert decision.allowed == snapshot_used


@pytest.mark.parametrize("release, configmaps", [((2, 2), 1), ((2, 3), 2)])
def test_the_runtime_snapshot_configmap_counts_in_quota_only_from_v2_3(build, release, configmaps):
    """An MPI TrainJob brings ConfigMap <job>-mpi-hostfile; Trainer v2.3 also <job>-runtime-snapshot,
    v2.2 makes none (the cluster tier's scoped-quota test saw the quota controller count 1 on v2.2)."""
    from trainjob_admission.policies.checks import quota
    from trainjob_admission.policies.job import effective_job

    job = effective_job.build(build.trainjob(numNodes=2), cluster("v1.33.0", release, build.runtime(), build.namespace()))
    assert quota.demand(job, build.quota({"count/configmaps": "10", "configmaps": "10"})) == {
        "count/configmaps": configmaps, "configmaps": configmaps}


# -- Kueue: v1beta1 and v1beta2 ---------------------------------------------------------------------

EXAMPLES = "cmd/kueueviz/examples"


@pytest.mark.parametrize("file", ["01-cluster-queues.yaml", "02-local-queues.yaml", "00-resource-flavor.yaml",
                                  "07-workload-priority-classes.yaml"])
def test_kueue_v1beta1_objects_read_as_their_v1beta2_versions(file):
    """Kueue wrote the same example queues at v1beta1 (v0.14.0) and v1beta2 (v0.19.0): mapped, the
    first are the second (cohort is cohortName, Borrow and Preempt are MayStopSearch)."""
    old, new = kueue_objects("v1beta1", f"{EXAMPLES}/{file}"), kueue_objects("v1beta2", f"{EXAMPLES}/{file}")
    assert [o["apiVersion"] for o in old] == [kueueapi.V1BETA1] * len(old)
    mapped = [{**kueueapi.as_v1beta2(o), "apiVersion": kueueapi.V1BETA2} for o in old]
    assert mapped == new
    if file.startswith("01"):  # not vacuous: both renames occur
        assert {o["spec"]["flavorFungibility"]["whenCanBorrow"] for o in mapped if "flavorFungibility" in o["spec"]} == {
            "MayStopSearch"} and any("cohort" in o["spec"] for o in old)


def test_a_v1beta1_cohort_is_the_same_tree_as_a_v1beta2_one():
    trees = {}
    for api in KUEUE_STACKS:
        state = ClusterState.from_objects(kueue_objects(api, f"{EXAMPLES}/01-cluster-queues.yaml"))
        tree = clusterqueues.forest(state.cluster_queues, state.cohorts or clusterqueues.NONE)
        trees[api] = {name: node.parent for (kind, name), node in tree.nodes.items() if kind == "cq"}
        assert {o["apiVersion"] for o in state.cluster_queues.values()} == {f"kueue.x-k8s.io/{api}"}  # as read
    assert trees["v1beta1"] == trees["v1beta2"] and "ai-for-humanity-foundation" in trees["v1beta1"].values()


def kueue_setup(build, api: str, *, gpu_request_zero: bool = False) -> ClusterState:
    """Kueue v0.14's (v1beta1) or v0.19's (v1beta2) CRDs, a GPU-less ClusterQueue in a cohort, its
    LocalQueue and flavor, at ``api``; a runtime whose launcher may ask 0 GPUs."""
    crds = kueue_objects(api, "config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml")
    cohort = {"cohort" if api == "v1beta1" else "cohortName": "research"}
    group = {"coveredResources": ["cpu", "memory"], "flavors": [{"name": "default", "resources": [
        {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "256Gi"}]}]}
    objects = [
        {"apiVersion": f"kueue.x-k8s.io/{api}", "kind": "ClusterQueue", "metadata": {"name": "cq"},
         "spec": {**cohort, "namespaceSelector": {}, "resourceGroups": [group]}},
        {"apiVersion": f"kueue.x-k8s.io/{api}", "kind": "LocalQueue", "metadata": {"name": "q", "namespace": "team-a"},
         "spec": {"clusterQueue": "cq"}},
        {"apiVersion": f"kueue.x-k8s.io/{api}", "kind": "ResourceFlavor", "metadata": {"name": "default"}, "spec": {}},
    ]
    launcher = build.pod_spec(cpu="1", memory="2Gi")
    if gpu_request_zero:  # the request defaults from the limit
        launcher["containers"][0]["resources"]["limits"] = {GPU: "0"}
    runtime = build.runtime(launcher_as_node=False, launcher=launcher)
    return cluster("v1.34.0", (2, 3), runtime, build.namespace(), *crds, *objects)


@pytest.mark.parametrize("api", sorted(KUEUE_STACKS))
def test_both_kueue_apis_are_judged_alike_and_the_record_names_the_one_seen(build, make_bundle, review, api):
    state = kueue_setup(build, api)
    assert state.versions.kueue_api == api
    too_large = build.trainjob(numNodes=80, labels={clusterqueues.QUEUE_LABEL: "q"})
    decision = review(too_large, [make_bundle({"checks": {"kueue": {}}})], state)
    assert not decision.allowed and "ClusterQueue cq (LocalQueue q) can ever provide at most 64" in decision.messages[0]["message"]
    assert decision.facts["kueue"]["apiVersion"] == f"kueue.x-k8s.io/{api}"
    assert decision.cluster["kueue"] == f"kueue.x-k8s.io/{api}"


@pytest.mark.parametrize("api, admitted", [("v1beta1", False), ("v1beta2", True)])
def test_a_zero_request_of_an_uncovered_resource_is_skipped_only_by_a_kueue_serving_v1beta2(build, make_bundle, review,
                                                                                            api, admitted):
    """A launcher asking 0 GPUs of a queue that covers no GPUs: Kueue v0.17+ skips it (#8079); a Kueue
    serving only v1beta1 (v0.14 or older) finds the workload no flavor and never admits it."""
    state = kueue_setup(build, api, gpu_request_zero=True)
    decision = review(build.trainjob(numNodes=2, labels={clusterqueues.QUEUE_LABEL: "q"}),
                      [make_bundle({"checks": {"kueue": {}}})], state)
    assert decision.allowed == admitted, decision.messages
    if not admitted:
        assert ("pod set launcher requests nvidia.com/gpu, which ClusterQueue cq (LocalQueue q) does not cover "
                "(it covers cpu, memory) (a request of 0: the Kueue here, which serves only kueue.x-k8s.io/v1beta1, "
                "still needs a flavor for it)") in decision.messages[0]["message"]


# -- offline: review says what it assumed, and takes the facts from files or flags ------------------

def test_review_decides_for_an_older_cluster_from_its_version_document_or_flags(tmp_path, build, example_state):
    runtime = copy.deepcopy(example_state.cluster_runtimes["mpi-openmpi"])
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["resources"] = {
        "requests": {"cpu": "4"}}
    state = tmp_path / "state.yaml"
    state.write_text(yaml.safe_dump_all([runtime, build.namespace(), build.quota({"requests.cpu": "4"})]))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(build.trainjob(runtime="mpi-openmpi", numNodes=2)))
    version = tmp_path / "version.yaml"
    version.write_text(kubectl_version("v1.31.0", "31"))

    def review(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), "review", "-f", str(job), "--cluster-state", str(state), *extra],
                              capture_output=True, text=True, timeout=60)

    newest = review()  # the node pod's 4 cpu (pod level) and the launcher's 1 against 4
    assert newest.returncode == 1 and "note: judged as Kubernetes 1.36" in newest.stderr, newest.stderr
    for extra in (("--cluster-state", str(version)), ("--kubernetes-version", "1.31")):
        older = review(*extra)  # 1 cpu each: the pod-level 4 is dropped by a 1.31 API server
        assert older.returncode == 0, older.stdout + older.stderr
        assert "note: judged as Kubernetes" not in older.stderr and "drops" in older.stdout, older.stdout


def test_review_warns_outside_the_tested_matrix_and_names_the_flag_it_refuses(tmp_path, build, example_state):
    """A version the flags give outside the tested range is judged with a warning on stderr (as
    serve logs it); an unsupported Trainer given by flag is named as the flag's, not the cluster's."""
    state = tmp_path / "state.yaml"
    state.write_text(yaml.safe_dump_all([example_state.cluster_runtimes["mpi-openmpi"], build.namespace()]))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(build.trainjob(runtime="mpi-openmpi", numNodes=2)))

    def review(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), "review", "-f", str(job), "--cluster-state", str(state), *extra],
                              capture_output=True, text=True, timeout=60)

    for flags, warning in ((("--kubernetes-version", "1.20"), "warning: Kubernetes 1.20 is outside the tested 1.31-1.36"),
                           (("--kubernetes-version", "1.99"), "warning: Kubernetes 1.99 is outside the tested 1.31-1.36"),
                           (("--trainer-version", "v2.9"),
                            "warning: Trainer v2.9 is newer than the tested v2.3: judged as Trainer v2.3")):
        judged = review(*flags)
        assert judged.returncode == 0 and warning in judged.stderr, (flags, judged.stdout + judged.stderr)
    assert "warning:" not in review().stderr
    refused = review("--trainer-version", "v2.1")
    assert refused.returncode == 2 and refused.stderr.startswith(
        "error: --trainer-version says Kubeflow Trainer v2.1 (spec.podTemplateOverrides): supported are Trainer v2.2 "
        "and v2.3"), refused.stderr


def test_review_help_shows_how_to_decide_for_an_older_cluster():
    shown = subprocess.run([str(SCRIPT), "review", "--help"], capture_output=True, text=True, timeout=60).stdout
    for line in ("--kubernetes-version 1.X", "--trainer-version v2.X", "--kueue-api-version {v1beta2,v1beta1}",
                 "kubectl version -o yaml > version.yaml",
                 "kubectl get crd trainjobs.trainer.kubeflow.org -o yaml > trainjob-crd.yaml",
                 "--cluster-state version.yaml --cluster-state trainjob-crd.yaml",
                 "--kubernetes-version 1.31 --trainer-version v2.2 --kueue-api-version v1beta1",
                 "supported versions and what happens outside them: docs/deploy.md"):
        assert line in shown, line
