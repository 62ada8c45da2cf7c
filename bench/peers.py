"""The peers bench/cluster.py --peers compares our webhook with: a ValidatingAdmissionPolicy and a
Kyverno ClusterPolicy, each holding the default bundle's checks it can express on the TrainJob
alone, and Kyverno's admission controller itself, run on the host against the test control plane.

What the peers can express (the TrainJob's own fields; the runtime's are out of their reach, so a
job that leaves resourcesPerNode or numNodes to its runtime is judged on the runtime's defaults by
us and on nothing by them): numNodes <= shape.maxWorkers, GPUs per node (nvidia.com/gpu +
amd.com/gpu, limits or else requests) <= gpu.maxPerWorker, numNodes x GPUs per node <=
params.maxJobGpus, cpu and memory requested per node >= shape.minWorkerCpu / minWorkerMemory.
Out of reach: quota, LimitRange, pod security, schedulability (cluster state), accelerator
families, GPUs on the launcher (the runtime's pod templates), injections and mutations.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import yaml

from trainjob_admission.policies.job.runtimepatch import OWN_MANAGER
from tests.support.objects import trainjob
from tests.support.service import cluster

ROOT = Path(__file__).resolve().parents[1]
_DEFAULT = yaml.safe_load((ROOT / "policies/bundle/builtin/default.yaml").read_text())["spec"]
MAX_WORKERS = _DEFAULT["checks"]["shape"]["maxWorkers"]
MAX_GPUS_PER_WORKER = _DEFAULT["checks"]["gpu"]["maxPerWorker"]
MAX_JOB_GPUS = _DEFAULT["params"]["maxJobGpus"]
MIN_CPU = _DEFAULT["checks"]["shape"]["minWorkerCpu"]
MIN_MEMORY = _DEFAULT["checks"]["shape"]["minWorkerMemory"]
GPUS = ("nvidia.com/gpu", "amd.com/gpu")
TRAINJOB_MATCH = {"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                  "resources": ["trainjobs"]}


def _with_cpu(job: dict, cpu: str) -> dict:
    job = copy.deepcopy(job)
    job["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] = cpu
    return job


# Inputs for the denial comparison: name -> (TrainJob, whether the default bundle admits it).
CASES = {
    "4 nodes x 1 GPU": (trainjob("ok", image=None, command=None, suspend=True), True),
    f"{MAX_GPUS_PER_WORKER + 1} GPUs per node": (
        trainjob("gpus", nodes=2, gpus=MAX_GPUS_PER_WORKER + 1, image=None, command=None, suspend=True), False),
    f"{MAX_WORKERS + 1} nodes": (trainjob("nodes", nodes=MAX_WORKERS + 1, gpus=0, image=None, command=None,
                                          suspend=True), False),
    f"{MAX_JOB_GPUS // MAX_GPUS_PER_WORKER + 1} x {MAX_GPUS_PER_WORKER} GPUs": (
        trainjob("total", nodes=MAX_JOB_GPUS // MAX_GPUS_PER_WORKER + 1, gpus=MAX_GPUS_PER_WORKER, image=None,
                 command=None, suspend=True), False),
    "512Mi memory per node": (trainjob("mem", memory="512Mi", image=None, command=None, suspend=True), False),
    "500m cpu per node": (_with_cpu(trainjob("cpu", image=None, command=None, suspend=True), "500m"), False),
}


# --------------------------------------------------------------------------------------------
# ValidatingAdmissionPolicy
# --------------------------------------------------------------------------------------------
def _quantity(value: str) -> str:
    """CEL: a quantity field (int-or-string: 2 arrives as an int, "2" as a string) as a quantity."""
    return f"(type({value}) == int ? quantity(string({value})) : quantity({value}))"


def _node_amount(resource: str, default: str) -> str:
    """CEL: the per-node amount of `resource` in resourcesPerNode, limits when requests are absent."""
    rpn = "object.?spec.?trainer.?resourcesPerNode"
    return _quantity(f"{rpn}.?requests[?'{resource}'].orValue({rpn}.?limits[?'{resource}'].orValue('{default}'))")


def vap_objects(name: str, namespace: str) -> list[dict]:
    """A ValidatingAdmissionPolicy and its binding (Deny) for TrainJobs in `namespace` only."""
    gpus = " + ".join(_node_amount(r, "0") + ".asInteger()" for r in GPUS)
    validations = [
        {"expression": f"variables.nodes <= {MAX_WORKERS}",
         "messageExpression": f"'job has ' + string(variables.nodes) + ' workers; the limit is {MAX_WORKERS}: "
                              f"set spec.trainer.numNodes to {MAX_WORKERS} or less'"},
        {"expression": f"variables.gpus <= {MAX_GPUS_PER_WORKER}",
         "messageExpression": f"'each worker requests ' + string(variables.gpus) + ' GPUs; the limit is "
                              f"{MAX_GPUS_PER_WORKER} per worker: set spec.trainer.resourcesPerNode.limits to "
                              f"{MAX_GPUS_PER_WORKER} or less'"},
        {"expression": f"variables.nodes * variables.gpus <= {MAX_JOB_GPUS}",
         "messageExpression": f"'job requests ' + string(variables.nodes * variables.gpus) + ' GPUs in total; the "
                              f"limit is {MAX_JOB_GPUS}: reduce spec.trainer.numNodes or GPUs per worker'"},
        {"expression": f"{_node_amount('cpu', MIN_CPU)}.compareTo(quantity('{MIN_CPU}')) >= 0",
         "message": f"each worker requests less than {MIN_CPU} cpu: set "
                    f"spec.trainer.resourcesPerNode.requests.cpu to at least {MIN_CPU}"},
        {"expression": f"{_node_amount('memory', MIN_MEMORY)}.compareTo(quantity('{MIN_MEMORY}')) >= 0",
         "message": f"each worker requests less than {MIN_MEMORY} memory: set "
                    f"spec.trainer.resourcesPerNode.requests.memory to at least {MIN_MEMORY}"},
    ]
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [TRAINJOB_MATCH]},
                       "variables": [{"name": "nodes", "expression": "object.?spec.?trainer.?numNodes.orValue(1)"},
                                     {"name": "gpus", "expression": gpus}],
                       "validations": validations}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": namespace}}}}}
    return [policy, binding]


# --------------------------------------------------------------------------------------------
# Kyverno
# --------------------------------------------------------------------------------------------
_RPN = "request.object.spec.trainer.resourcesPerNode"
# Kyverno hands integers of the object to JMESPath as int64, which its arithmetic (multiply) refuses.
_NODES = "to_number(to_string(request.object.spec.trainer.numNodes || `1`))"
_GPUS = "sum([" + ", ".join(f'to_number({_RPN}.limits."{r}" || {_RPN}.requests."{r}" || `0`)' for r in GPUS) + "])"


def _kyverno_rule(name: str, key: str, operator: str, value, message: str, namespace: str) -> dict:
    return {"name": name,
            "match": {"any": [{"resources": {"kinds": ["trainer.kubeflow.org/v1alpha1/TrainJob"],
                                             "namespaces": [namespace], "operations": ["CREATE", "UPDATE"]}}]},
            "validate": {"failureAction": "Enforce", "message": message,
                         "deny": {"conditions": {"any": [{"key": key, "operator": operator, "value": value}]}}}}


def kyverno_policy(name: str, namespace: str, patch: list[dict] | None = None) -> dict:
    """A ClusterPolicy with the same checks as vap_objects, in Kyverno's own (JMESPath) rules; the API
    server calls Kyverno for `namespace` only (matchConditions). With ``patch`` (a JSON patch), a
    mutate rule adds it to every created TrainJob as well, so Kyverno is called twice per create, as
    our webhook is: the bench passes what our /mutate patched its job with."""
    amount = {r: f"{{{{ {_RPN}.requests.{r} || {_RPN}.limits.{r} || '{d}' }}}}" for r, d in
              (("cpu", MIN_CPU), ("memory", MIN_MEMORY))}
    rules = [
        _kyverno_rule("max-workers", f"{{{{ {_NODES} }}}}", "GreaterThan", MAX_WORKERS,
                      f"job has {{{{ {_NODES} }}}} workers; the limit is {MAX_WORKERS}: set spec.trainer.numNodes "
                      f"to {MAX_WORKERS} or less", namespace),
        _kyverno_rule("gpus-per-worker", f"{{{{ {_GPUS} }}}}", "GreaterThan", MAX_GPUS_PER_WORKER,
                      f"each worker requests {{{{ {_GPUS} }}}} GPUs; the limit is {MAX_GPUS_PER_WORKER} per worker: "
                      f"set spec.trainer.resourcesPerNode.limits to {MAX_GPUS_PER_WORKER} or less", namespace),
        _kyverno_rule("max-job-gpus", f"{{{{ multiply({_NODES}, {_GPUS}) }}}}", "GreaterThan", MAX_JOB_GPUS,
                      f"job requests {{{{ multiply({_NODES}, {_GPUS}) }}}} GPUs in total; the limit is "
                      f"{MAX_JOB_GPUS}: reduce spec.trainer.numNodes or GPUs per worker", namespace),
        _kyverno_rule("min-worker-cpu", amount["cpu"], "LessThan", MIN_CPU,
                      f"each worker requests {amount['cpu']} cpu; the minimum is {MIN_CPU}: set "
                      f"spec.trainer.resourcesPerNode.requests.cpu to at least {MIN_CPU}", namespace),
        _kyverno_rule("min-worker-memory", amount["memory"], "LessThan", MIN_MEMORY,
                      f"each worker requests {amount['memory']} memory; the minimum is {MIN_MEMORY}: set "
                      f"spec.trainer.resourcesPerNode.requests.memory to at least {MIN_MEMORY}", namespace),
    ]
    if patch:  # once: Kyverno's webhook is reinvoked after later ones mutate, and "/-" would append again
        ours = f"request.object.spec.runtimePatches[?manager=='{OWN_MANAGER}'] || `[]`"
        rules.append({"name": "default-bundle-patch",
                      "match": {"any": [{"resources": {"kinds": ["trainer.kubeflow.org/v1alpha1/TrainJob"],
                                                       "namespaces": [namespace], "operations": ["CREATE"]}}]},
                      "preconditions": {"all": [{"key": f"{{{{ length({ours}) }}}}", "operator": "Equals", "value": 0}]},
                      "mutate": {"patchesJson6902": json.dumps(patch)}})
    return {"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": name},
            "spec": {"background": False, "rules": rules,
                     "webhookConfiguration": {"failurePolicy": "Fail", "timeoutSeconds": 10, "matchConditions": [
                         {"name": "bench-namespace", "expression": f"request.namespace == '{namespace}'"}]}}}


KYVERNO_NS = "kyverno"
KYVERNO_ENV = {"KYVERNO_NAMESPACE": KYVERNO_NS, "KYVERNO_SERVICEACCOUNT_NAME": "kyverno-admission-controller",
               "KYVERNO_DEPLOYMENT": "kyverno-admission-controller", "KYVERNO_POD_NAME": "kyverno-bench",
               "INIT_CONFIG": "kyverno", "METRICS_CONFIG": "kyverno-metrics"}
MANAGED = "webhook.kyverno.io/managed-by=kyverno"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((cluster.LOOPBACK, 0))
        return s.getsockname()[1]


def _crd_files() -> list[Path]:
    return sorted((cluster.own_module_dir("kyverno") / "config" / "crds").rglob("*.yaml"))


class Kyverno:
    """Kyverno's admission controller on the host: its CRDs, namespace and ConfigMap applied, itself
    out of cluster (--serverIP: it issues its own CA and serving pair into Secrets and registers its
    webhooks by URL), the policies applied once it answers. stop() removes all of it again."""

    def __init__(self, workdir: Path, policies: list[dict]):
        self.policies, self.log = policies, workdir / "kyverno.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> None:
        binary = cluster.own_module_binary("kyverno")
        files = [a for f in _crd_files() for a in ("-f", f)]
        # a previous run's CRDs may still be terminating (stop() does not wait for them)
        cluster.kubectl("wait", "--for=delete", *files, f"--timeout={timeout:.0f}s", timeout=timeout + 30)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", *files)
        cluster.kubectl("wait", "--for=condition=Established", "crd", "clusterpolicies.kyverno.io", "--timeout=60s")
        cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KYVERNO_NS}},
                               *({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": KYVERNO_NS}}
                                 for n in ("kyverno", "kyverno-metrics"))])
        port = _free_port()
        argv = [str(binary), "--kubeconfig", str(cluster.ADMIN_KUBECONFIG),
                "--serverIP", f"{cluster.LOOPBACK}:{port}", "--webhookServerHost", cluster.LOOPBACK,
                "--webhookServerPort", str(port), "--servicePort", str(port),
                "--caSecretName", "kyverno-svc.kyverno.svc.kyverno-tls-ca",
                "--tlsSecretName", "kyverno-svc.kyverno.svc.kyverno-tls-pair",
                "--admissionReports=false", "--disableMetrics", "--controllerRuntimeMetricsAddress=0",
                "--leaderElectionRetryPeriod=1s"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=os.environ | KYVERNO_ENV,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:  # the policy webhook must be up before Kyverno lets its own policy in
            if self.proc.poll() is not None:
                raise RuntimeError(f"kyverno exited {self.proc.returncode}; see {self.log}")
            listed = {"apiVersion": "v1", "kind": "List", "items": self.policies}
            if cluster.kubectl("apply", "-f", "-", input=json.dumps(listed), check=False).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"kyverno did not accept its policies within {timeout:.0f} s; see {self.log}")
            time.sleep(2)

    def stop(self) -> None:
        """Deletes without waiting for the deletions to finish (CRDs can take minutes)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Kyverno leaves its webhooks behind when it stops (autoDeleteWebhooks is off): they go first,
        # or the API server would keep calling a process that is gone.
        for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
            cluster.kubectl("delete", kind, "-l", MANAGED, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "clusterpolicy", *(p["metadata"]["name"] for p in self.policies), "--ignore-not-found",
                        check=False)
        cluster.kubectl("delete", "namespace", KYVERNO_NS, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", *(a for f in _crd_files() for a in ("-f", f)),
                        check=False)
