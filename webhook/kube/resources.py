"""The API resources the service reads and writes, as REST paths."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    kind: str
    api_version: str  # "v1" or "group/version"
    plural: str

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base] + (["namespaces", namespace] if namespace else []) + [self.plural]
        parts += [name] if name else []
        parts += [subresource] if subresource else []
        return "/".join(parts)


CLUSTER_TRAINING_RUNTIMES = Resource("ClusterTrainingRuntime", "trainer.kubeflow.org/v1alpha1", "clustertrainingruntimes")
TRAINING_RUNTIMES = Resource("TrainingRuntime", "trainer.kubeflow.org/v1alpha1", "trainingruntimes")
NAMESPACES = Resource("Namespace", "v1", "namespaces")
RESOURCE_QUOTAS = Resource("ResourceQuota", "v1", "resourcequotas")
LIMIT_RANGES = Resource("LimitRange", "v1", "limitranges")
RUNTIME_CLASSES = Resource("RuntimeClass", "node.k8s.io/v1", "runtimeclasses")  # pod overhead
PRIORITY_CLASSES = Resource("PriorityClass", "scheduling.k8s.io/v1", "priorityclasses")  # the global default
STORAGE_CLASSES = Resource("StorageClass", "storage.k8s.io/v1", "storageclasses")  # the default class
NODES = Resource("Node", "v1", "nodes")  # the schedulability pre-check: what the nodes offer
PODS = Resource("Pod", "v1", "pods")  # ... and what the pods bound to them hold now
# Kueue's queues and what they give (the Kueue pre-check, policies/capacity/clusterqueues.py), at the version the
# cluster serves (webhook/kube/discovery.py: v1beta2 from Kueue v0.15, v1beta1 before; policies/k8s/kueueapi.py
# reads both alike); a cluster without Kueue answers 404, read as "no queues".
KUEUE_PLURALS = {"LocalQueue": "localqueues", "ClusterQueue": "clusterqueues", "Cohort": "cohorts",
                 "ResourceFlavor": "resourceflavors", "WorkloadPriorityClass": "workloadpriorityclasses"}


def kueue_resources(version: str) -> tuple[Resource, ...]:
    """Kueue's kinds the pre-check reads, at ``version`` ("v1beta2" or "v1beta1"); the LocalQueues first."""
    return tuple(Resource(kind, f"kueue.x-k8s.io/{version}", plural) for kind, plural in KUEUE_PLURALS.items())


# Admins' waivers of named rules for named jobs (policies/decide/exceptions.py); without the CRD, none.
POLICY_EXCEPTIONS = Resource("PolicyException", "policy.trainjob-admission.io/v1alpha1", "policyexceptions")
# What evaluate reads, besides Kueue's (kueue_resources).
STATE_RESOURCES = (CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, NAMESPACES, RESOURCE_QUOTAS, LIMIT_RANGES,
                   RUNTIME_CLASSES, PRIORITY_CLASSES, STORAGE_CLASSES, NODES, PODS, POLICY_EXCEPTIONS)
# Of the pods, only those on a node and not finished (a pod that finishes leaves the watch as DELETED).
FIELD_SELECTORS = {PODS: "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"}

# Trainer's runtime snapshot of one job, read by name on its UPDATE (webhook/admission/runtimesnapshots.py); and,
# watched with policies/k8s/clusterstate.py PARAMS_SELECTOR only, the ConfigMaps bundles take params from.
CONFIG_MAPS = Resource("ConfigMap", "v1", "configmaps")

# Who may do what, asked for the CEL ``authorizer`` (webhook/admission/access.py): create only.
SUBJECT_ACCESS_REVIEWS = Resource("SubjectAccessReview", "authorization.k8s.io/v1", "subjectaccessreviews")

# The Warning Event at 80% of a TrainJob's deadline (webhook/loops/deadlinewarnings.py): create only.
EVENTS = Resource("Event", "v1", "events")

POLICY_BUNDLES = Resource("PolicyBundle", "policy.trainjob-admission.io/v1alpha1", "policybundles")

# What the injector creates and the reconciler adopts, by kind.
SECRETS = Resource("Secret", "v1", "secrets")
NETWORK_POLICIES = Resource("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies")
INJECTED = {r.kind: r for r in (SECRETS, NETWORK_POLICIES)}

# Where each replica writes its decision log's signed checkpoint (webhook/loops/checkpointer.py):
# get, create and patch in the service's own namespace only.
LEASES = Resource("Lease", "coordination.k8s.io/v1", "leases")

# The background audit's results (webhook/loops/policyreports.py), one per namespace: the format Kyverno and
# Policy Reporter read; its CRD comes with them.
POLICY_REPORTS = Resource("PolicyReport", "wgpolicyk8s.io/v1alpha2", "policyreports")

# The jobs we decide, by kind, as (group, version, plural): TrainJob, and the legacy v2beta1 MPIJob.
JOB_RESOURCES = {"TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
                 "MPIJob": ("kubeflow.org", "v2beta1", "mpijobs")}
JOBS = {kind: Resource(kind, f"{group}/{version}", plural) for kind, (group, version, plural) in JOB_RESOURCES.items()}


def names_a_job(ref: dict) -> bool:
    """Whether an ownerReference names one of our jobs: a job's kind in that kind's API group (any
    version). One of a job's kind in another group names a look-alike, which the garbage collector
    cannot resolve, so it owns nothing."""
    kind = ref.get("kind")
    return kind in JOB_RESOURCES and str(ref.get("apiVersion", "")).rpartition("/")[0] == JOB_RESOURCES[kind][0]
