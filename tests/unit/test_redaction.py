"""policies/k8s/redaction.py: which submitted values are kept out of messages, and how."""
from __future__ import annotations

from trainjob_admission.policies.k8s.clusterstate import ClusterState
from trainjob_admission.policies.k8s.redaction import echoable_values, scrub
from tests.support.objects import bare_trainjob, mpi_runtime, pod_spec

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_env_values_and_annotations_anywhere_in_the_job_longest_first():
    job = {"metadata": {"annotations": {"ci/token": "tok-12345678", "owner": "ml"}},
           "spec": {"trainer": {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": SECRET},
                                        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                                        {"name": "DEBUG", "value": "1"}]},
                    "runtimePatches": [{"trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                        {"template": {"metadata": {"annotations": {"note": "rotate-after-" + SECRET}},
                                      "spec": {"containers": [{"env": [{"name": "DB", "value": "postgres://u:pw@db"}]}]}}}
                    ]}}}}]}}
    assert echoable_values(job) == ["rotate-after-" + SECRET, SECRET, "postgres://u:pw@db", "tok-12345678"]
    values = echoable_values(job, None)
    assert scrub(f"note rotate-after-{SECRET}, key {SECRET}, DEBUG=1, owner ml", values) == \
        "note [redacted], key [redacted], DEBUG=1, owner ml"


def test_the_services_own_annotations_are_requests_to_it_and_kept():
    job = {"metadata": {"annotations": {"trainjob-admission.io/gpu-product": "NVIDIA-A100-SXM4-80GB",
                                        "example.com/trainjob-admission.io/x": "kept-out-12345"}}}
    assert echoable_values(job) == ["kept-out-12345"]


def test_hostile_shapes_are_ignored():
    assert echoable_values({"env": "x" * 20, "annotations": ["y" * 20], "spec": {"env": [None, 3, {"value": 5}]}}) == []


def test_values_the_runtime_and_the_namespace_hold_are_redacted_too(make_bundle, review):
    """A rule may echo what the submitter never wrote: an env value the runtime sets (containers
    and initContainers of every pod set) or a namespace annotation."""
    node = pod_spec()
    node["containers"][0]["env"] = [{"name": "HF_TOKEN", "value": "hf_RUNTIMESECRETabcdef123456"}]
    launcher = pod_spec()
    launcher["initContainers"] = [{"name": "fetch", "image": "busybox",
                                   "env": [{"name": "S3_KEY", "value": "s3-INITSECRET-0987654321"}]}]
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "team-a", "labels": {"cost-center": "cc-4711-long-label"},
                              "annotations": {"vault.example.com/token": "s.NAMESPACESECRETxyz123"}}}
    state = ClusterState.from_objects([mpi_runtime(node=node, launcher=launcher), namespace])
    bundle = make_bundle({"validations": [
        {"name": "env", "expression": "false", "messageExpression":
            "job.podSets.map(p, p.pod.spec.containers.map(c, has(c.env) ? c.env.map(e, e.value).join(',') : '')"
            ".join(';') + '|' + (has(p.pod.spec.initContainers) ? p.pod.spec.initContainers.map(c, "
            "c.env.map(e, e.value).join(',')).join(';') : '')).join(' ')"},
        {"name": "ns", "expression": "false", "messageExpression":
            "namespaceObject.metadata.annotations.map(k, namespaceObject.metadata.annotations[k]).join(',') + ' ' + "
            "namespaceObject.metadata.labels['cost-center']"},
    ]})
    text = " ".join(m["message"] for m in review(bare_trainjob(numNodes=2), [bundle], state).messages)
    for secret in ("hf_RUNTIMESECRETabcdef123456", "s3-INITSECRET-0987654321", "s.NAMESPACESECRETxyz123"):
        assert secret not in text, text
    assert text.count("[redacted]") >= 3 and "cc-4711-long-label" in text, "labels are not secret: kept"


def test_profiles_and_scc_ranges_kubernetes_defines_are_not_secrets(build, default, review):
    """A Pod Security finding names the profile it refuses: the annotation's value "unconfined"
    (or an SCC range) is Kubernetes' vocabulary, not a credential, and stays in the message."""
    job = {"metadata": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/node": "unconfined",
        "seccomp.security.alpha.kubernetes.io/pod": "localhost/profile-12345",
        "openshift.io/sa.scc.mcs": "s0:c27,c4,c9",
        "example.com/token": "tok-12345678"}}}
    assert echoable_values(job) == ["tok-12345678"]
    node = pod_spec(secure=False)
    runtime = mpi_runtime(node=node, launcher=pod_spec(secure=False))
    runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["metadata"] = {
        "annotations": {"container.apparmor.security.beta.kubernetes.io/node": "unconfined"}}
    decision = review(bare_trainjob(numNodes=2), default, ClusterState.from_objects([runtime, build.namespace()]))
    (message,) = [m["message"] for m in decision.messages if m["rule"] == "default/pod-security"]
    assert "sets AppArmor profile unconfined" in message and "[redacted]" not in message
