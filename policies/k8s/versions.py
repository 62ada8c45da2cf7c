"""What the cluster runs, and every behaviour of ours that depends on it: the one place where a
version decides anything.

The facts (:class:`Versions`) come from the API server when the service runs
(webhook/kube/discovery.py: ``/version``, Kueue's API group, the TrainJob schema), and offline
from ``--cluster-state`` (a ``kubectl version -o yaml`` document, the upstream CRDs) or flags
(:func:`from_flags`); with none of them, the newest of the tested matrix, said so.

Each gate names the upstream source that decides it (:data:`GATES`); code asks
``versions.enabled("PodLevelResources")``, never compares version numbers itself.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Literal

from .. import PolicyError

Component = Literal["kubernetes", "trainer", "kueue"]
MinorVersion = tuple[int, int]

# The tested matrix (docs/deploy.md "Supported versions"); outside it the service warns, except
# for a Trainer older than TRAINER_OLDEST, which it refuses (its TrainJob has no runtimePatches).
KUBERNETES_TESTED = ((1, 31), (1, 36))
TRAINER_TESTED = ((2, 2), (2, 3))
TRAINER_OLDEST = (2, 2)
KUEUE_APIS = ("v1beta2", "v1beta1")  # served Kueue API versions read, the preferred first
NEWEST_KUBERNETES, NEWEST_TRAINER, NEWEST_KUEUE_API = KUBERNETES_TESTED[1], TRAINER_TESTED[1], KUEUE_APIS[0]

TRAINJOB_CRD = "trainjobs.trainer.kubeflow.org"
KUEUE_GROUP = "kueue.x-k8s.io"
VERSION_KIND = "KubectlVersion"  # the document `kubectl version -o yaml` prints has no kind: the state file's name for it


class VersionError(PolicyError, ValueError):
    """A version a flag or file gives that cannot be read."""


@dataclass(frozen=True)
class Gate:
    """A behaviour that starts at one version of one component."""

    component: Component
    since: MinorVersion
    what: str
    source: str  # the upstream file (and symbol) that decides it


GATES: dict[str, Gate] = {
    # Kubernetes: feature gates on by default from `since` (pkg/features/kube_features.go's
    # versioned specs); a disabled field is dropped by the API server on create
    # (pkg/api/pod/util.go dropDisabledPodFields), so the pods never carry it.
    "PodLevelResources": Gate(
        "kubernetes", (1, 34),
        "pod-level spec.resources is kept and counts for the scheduler, the quota and QoS; before, the API "
        "server drops it from the pods (alpha, off, in 1.32-1.33; unknown before)",
        "k8s.io/kubernetes pkg/features/kube_features.go PodLevelResources {1.32 Alpha off, 1.34 Beta on}; "
        "pkg/api/pod/util.go dropDisabledPodLevelResources; pkg/quota/v1/evaluator/core/pods.go "
        "SkipPodLevelResources"),
    "SidecarContainers": Gate(
        "kubernetes", (1, 29),
        "an init container with restartPolicy Always is a sidecar that runs beside the app containers and "
        "counts in the pod's requests; before, the API server drops the field",
        "k8s.io/kubernetes pkg/features/kube_features.go SidecarContainers {1.28 Alpha off, 1.29 Beta on, 1.33 GA}; "
        "pkg/api/pod/util.go dropDisabledFields (restartPolicy of init containers); "
        "k8s.io/component-helpers/resource/helpers.go PodRequests"),
    # Trainer: by the TrainJob/runtime CRD shape and the controller of that release.
    "TrainerMergesResourcesPerNode": Gate(
        "trainer", (2, 3),
        "spec.trainer.resourcesPerNode merges into the runtime's node container (the TrainJob wins per key); "
        "Trainer v2.2 replaces the container's resources with it",
        "github.com/kubeflow/trainer/v2 v2.3.0 pkg/runtime/core/trainingruntime.go newRuntimeInfo "
        "(MergeResourceRequirements); v2.2.0 pkg/runtime/core/trainingruntime.go newRuntimeInfo and "
        "pkg/runtime/framework/plugins/jobset/builder.go Trainer (Resources = resourcesPerNode)"),
    "TrainerRuntimeSnapshot": Gate(
        "trainer", (2, 3),
        "Trainer copies the runtime into ConfigMap <job>-runtime-snapshot at the job's first build and "
        "rebuilds the job from that copy; v2.2 reads the live runtime on every build",
        "github.com/kubeflow/trainer/v2 v2.3.0 pkg/runtime/core/snapshot.go (not in v2.2.0)"),
    "RuntimePatchTerminationGracePeriod": Gate(
        "trainer", (2, 3),
        "a runtimePatch may set the pods' terminationGracePeriodSeconds; v2.2's CRD prunes it",
        "github.com/kubeflow/trainer/v2 v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go "
        "PodSpecPatch.TerminationGracePeriodSeconds (not in v2.2.0)"),
    # Kueue: only its API version is discovered; v1beta2 is served from v0.15 on, v1beta1 alone
    # means v0.14 or older.
    "KueueSkipsZeroRequests": Gate(
        "kueue", (0, 15),
        "a zero request of a resource the ClusterQueue does not cover is skipped (#8079, in v0.17); a Kueue "
        "that serves only v1beta1 (v0.14 or older) leaves the workload without a flavor, never admitted",
        "sigs.k8s.io/kueue v0.19.0 pkg/scheduler/flavorassigner/flavorassigner.go (#8079); "
        "v0.14.0 flavorassigner.go findFlavorForPodSets (resource unavailable in ClusterQueue)"),
}

# The CEL libraries of the Kubernetes CEL environment by the version that added them
# (k8s.io/apiserver pkg/cel/environment/base.go baseOpts), each with the functions of ours it
# holds. A ValidatingAdmissionPolicy compiles new expressions at the API server's compatibility
# version, one minor below its own (DefaultCompatibilityVersion: MinCompatibilityVersion, n-1),
# so a bundle that would not compile there is refused as VAP would refuse it.
CEL_LIBRARIES: dict[str, tuple[MinorVersion, frozenset[str]]] = {
    "lists, regex, strings (base)": ((1, 0), frozenset({
        "sum", "min", "max", "isSorted", "indexOf", "find", "findAll", "lowerAscii", "upperAscii", "trim",
        "replace", "split", "join"})),
    "authz": ((1, 27), frozenset({"path", "group", "serviceAccount", "resource", "subresource", "namespace",
                                  "name", "check", "allowed", "reason", "errored", "error"})),
    "quantity": ((1, 28), frozenset({"quantity", "isQuantity", "isLessThan", "isGreaterThan", "compareTo", "add",
                                     "sub", "asInteger", "asApproximateFloat", "isInteger", "sign"})),
}
CEL_SOURCE = "k8s.io/apiserver pkg/cel/environment/base.go (baseOpts, DefaultCompatibilityVersion)"


@dataclass(frozen=True)
class Versions:
    """What the cluster runs, as far as decisions depend on it. ``trainer`` None: no TrainJob CRD
    served; ``kueue_api`` None: Kueue's API is not served. ``source`` says where each came from,
    for the record, /readyz and the offline note."""

    kubernetes: MinorVersion = NEWEST_KUBERNETES
    kubernetes_version: str = ""  # gitVersion as the API server reports it ("v1.34.4", "v1.31.0+rhcos")
    trainer: MinorVersion | None = NEWEST_TRAINER
    kueue_api: str | None = NEWEST_KUEUE_API
    source: dict[str, str] = field(default_factory=lambda: dict.fromkeys(("kubernetes", "trainer", "kueue"), "default"),
                                   compare=False)

    def enabled(self, gate: str) -> bool:
        """Whether the behaviour GATES[gate] describes holds in this cluster."""
        spec = GATES[gate]
        if spec.component == "kubernetes":
            return self.kubernetes >= spec.since
        if spec.component == "trainer":
            return self.trainer is None or self.trainer >= spec.since
        return self.kueue_api != "v1beta1"  # kueue: v1beta2 (or nothing to judge) means v0.15 or newer

    @property
    def cel_level(self) -> MinorVersion:
        """The Kubernetes version whose CEL environment new VAP expressions compile against."""
        major, minor = self.kubernetes
        return (major, max(0, minor - 1))

    def cel_refusal(self, functions: Iterable[str]) -> str | None:
        """Why VAP on this cluster would not compile an expression calling ``functions``, or None."""
        for library, (since, names) in CEL_LIBRARIES.items():
            used = sorted(set(functions) & names)
            if used and since > self.cel_level:
                named = " and ".join(", ".join(f"{name}()" for name in used).rsplit(", ", 1))
                return (f"{named} {'is' if len(used) == 1 else 'are'} in the Kubernetes CEL {library} "
                        f"library from {_show(since)}, and this cluster's API server ({self.kubernetes_text}) "
                        f"compiles new ValidatingAdmissionPolicy expressions at {_show(self.cel_level)}")
        return None

    @property
    def kubernetes_text(self) -> str:
        return self.kubernetes_version or _show(self.kubernetes)

    @property
    def trainer_text(self) -> str:
        return "not served" if self.trainer is None else f"v{self.trainer[0]}.{self.trainer[1]}"

    @property
    def kueue_text(self) -> str:
        return "not served" if self.kueue_api is None else f"{KUEUE_GROUP}/{self.kueue_api}"

    def outside_matrix(self) -> list[str]:
        """What lies outside the tested matrix, one line each (a warning, not a refusal)."""
        out = []
        if not KUBERNETES_TESTED[0] <= self.kubernetes <= KUBERNETES_TESTED[1]:
            out.append(f"Kubernetes {self.kubernetes_text} is outside the tested {_show(KUBERNETES_TESTED[0])}-"
                       f"{_show(KUBERNETES_TESTED[1])}: judged with the gates of that version, untested")
        if self.trainer is not None and self.trainer > TRAINER_TESTED[1]:
            newest = f"v{TRAINER_TESTED[1][0]}.{TRAINER_TESTED[1][1]}"
            out.append(f"Trainer {self.trainer_text} is newer than the tested {newest}: judged as Trainer {newest}")
        return out

    def unsupported(self) -> str | None:
        """Why the service cannot judge TrainJobs in this cluster at all, or None."""
        if self.trainer is not None and self.trainer < TRAINER_OLDEST:
            said = _TRAINER_SAID_BY.get(self.source.get("trainer", ""), "the cluster's TrainJob CRD is")
            return (f"{said} Kubeflow Trainer {self.trainer_text} "
                    f"({_TRAINER_SHAPES[self.trainer]}): supported are Trainer v2.2 and v2.3, whose TrainJob has "
                    "spec.runtimePatches; upgrade Trainer to v2.2 or newer")
        return None

    def summary(self, *, sources: bool = False) -> dict[str, Any]:
        """For the decision record (``cluster``), /readyz and ``review -o json`` (with where each came from)."""
        out: dict[str, Any] = {"kubernetes": self.kubernetes_text, "trainer": self.trainer_text,
                               "kueue": self.kueue_text}
        return out | ({"source": dict(self.source)} if sources else {})

    def describe(self) -> str:
        return f"Kubernetes {self.kubernetes_text}, Trainer {self.trainer_text}, Kueue API {self.kueue_text}"


# How an unsupported Trainer's message names where its version came from (Versions.source).
_TRAINER_SAID_BY = {"flag": "--trainer-version says", "cluster-state": "the --cluster-state TrainJob CRD is"}


def _show(version: MinorVersion) -> str:
    return f"{version[0]}.{version[1]}"


def drop_disabled_fields(pod_spec: dict, versions: Versions) -> list[str]:
    """Remove from a new pod's spec what this cluster's API server drops from it (pkg/api/pod/util.go
    dropDisabledPodFields: a field whose feature gate is off, on create), in place; the fields
    removed, each with its gate, for the submitter's warning."""
    dropped = []
    if "resources" in pod_spec and not versions.enabled("PodLevelResources"):
        del pod_spec["resources"]
        dropped.append(f"spec.resources (pod-level resources: from Kubernetes {_show(GATES['PodLevelResources'].since)})")
    if not versions.enabled("SidecarContainers"):
        inits = pod_spec.get("initContainers")
        if isinstance(inits, list) and any(isinstance(c, dict) and "restartPolicy" in c for c in inits):
            pod_spec["initContainers"] = [{k: v for k, v in c.items() if k != "restartPolicy"} if isinstance(c, dict)
                                          else c for c in inits]
            dropped.append("restartPolicy of initContainers (sidecar containers: from Kubernetes "
                           f"{_show(GATES['SidecarContainers'].since)})")
    return dropped


NEWEST = Versions()


# --- reading the facts ----------------------------------------------------------------------------
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def parse_minor(text: Any, what: str) -> MinorVersion:
    """"1.34", "v1.34.4", "v2.2.0" -> (1, 34)."""
    found = _VERSION.match(str(text).strip()) if isinstance(text, (str, int, float)) else None
    if not found:
        raise VersionError(f"{what} {text!r} is not a version like 1.34 or v1.34.4")
    return int(found[1]), int(found[2])


def kubernetes_of(server_version: dict) -> tuple[MinorVersion, str]:
    """The API server's version from ``/version`` (or ``serverVersion`` of ``kubectl version -o
    yaml``): major and minor as numbers ("31+" on some distributions), and its gitVersion."""
    git = str(server_version.get("gitVersion") or "")
    major = re.match(r"\d+", str(server_version.get("major") or ""))
    minor = re.match(r"\d+", str(server_version.get("minor") or ""))
    if major and minor:
        return (int(major[0]), int(minor[0])), git
    if git:
        return parse_minor(git, "serverVersion.gitVersion"), git
    raise VersionError("the version document has no serverVersion.major/minor or gitVersion")


# Trainer releases by the TrainJob CRD's shape (pkg/apis/trainer/v1alpha1/trainjob_types.go of each).
_TRAINER_SHAPES = {(2, 0): "spec.podSpecOverrides", (2, 1): "spec.podTemplateOverrides",
                   (2, 2): "spec.runtimePatches without terminationGracePeriodSeconds",
                   (2, 3): "spec.runtimePatches with terminationGracePeriodSeconds"}


def trainer_of_schema(spec_properties: dict) -> MinorVersion | None:
    """Trainer's release from the TrainJob's spec schema (the CRD's openAPIV3Schema, or the API
    server's OpenAPI v3 document): runtimePatches came in v2.2 (podTemplateOverrides before,
    podSpecOverrides in v2.0), and a patch's terminationGracePeriodSeconds in v2.3."""
    if not isinstance(spec_properties, dict):
        return None
    if "runtimePatches" in spec_properties:
        pod = _dig(spec_properties["runtimePatches"], "items", "properties", "trainingRuntimeSpec", "properties",
                   "template", "properties", "spec", "properties", "replicatedJobs", "items", "properties",
                   "template", "properties", "spec", "properties", "template", "properties", "spec", "properties")
        return (2, 3) if isinstance(pod, dict) and "terminationGracePeriodSeconds" in pod else (2, 2)
    if "podTemplateOverrides" in spec_properties:
        return (2, 1)
    if "podSpecOverrides" in spec_properties:
        return (2, 0)
    return None


def _dig(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def trainer_of_crd(crd: dict) -> MinorVersion | None:
    """Trainer's release from its TrainJob CustomResourceDefinition (v1alpha1's schema)."""
    for version in _dig(crd, "spec", "versions") or []:
        if isinstance(version, dict) and version.get("name") == "v1alpha1":
            return trainer_of_schema(_dig(version, "schema", "openAPIV3Schema", "properties", "spec", "properties"))
    return None


def kueue_api_of(served: Iterable[str]) -> str | None:
    """The Kueue API version read: v1beta2 where served (Kueue v0.15+), else v1beta1."""
    served = set(served)
    return next((v for v in KUEUE_APIS if v in served), None)


def from_objects(objects: Iterable[dict]) -> Versions:
    """The facts a state file holds: a ``kubectl version -o yaml`` document, the TrainJob CRD,
    Kueue's CRDs (or, without them, the apiVersion its objects were read at). What it does not
    hold is the newest (``source`` says "default")."""
    found = Versions()
    source = dict(found.source)
    kueue_served: set[str] = set()
    kueue_seen: set[str] = set()
    for obj in objects:
        kind = obj.get("kind")
        if kind == VERSION_KIND:
            kubernetes, git = kubernetes_of(obj.get("serverVersion") or {})
            found = replace(found, kubernetes=kubernetes, kubernetes_version=git)
            source["kubernetes"] = "cluster-state"
        elif kind == "CustomResourceDefinition":
            name = _dig(obj, "metadata", "name")
            if name == TRAINJOB_CRD:
                found = replace(found, trainer=trainer_of_crd(obj))
                source["trainer"] = "cluster-state"
            elif _dig(obj, "spec", "group") == KUEUE_GROUP:
                kueue_served |= {v.get("name") for v in _dig(obj, "spec", "versions") or []
                                 if isinstance(v, dict) and v.get("served")}
        elif str(obj.get("apiVersion", "")).startswith(KUEUE_GROUP + "/"):
            kueue_seen.add(str(obj["apiVersion"]).split("/", 1)[1])
    if kueue_served or kueue_seen:
        found = replace(found, kueue_api=kueue_api_of(kueue_served or kueue_seen))
        source["kueue"] = "cluster-state"
    return replace(found, source=source)


def from_flags(base: Versions, *, kubernetes: str | None = None, trainer: str | None = None,
               kueue_api: str | None = None) -> Versions:
    """``base`` with what flags say instead (they win over a state file)."""
    source = dict(base.source)
    if kubernetes is not None:
        base = replace(base, kubernetes=parse_minor(kubernetes, "--kubernetes-version"), kubernetes_version="")
        source["kubernetes"] = "flag"
    if trainer is not None:
        base = replace(base, trainer=parse_minor(trainer, "--trainer-version"))
        source["trainer"] = "flag"
    if kueue_api is not None:
        if kueue_api not in KUEUE_APIS:
            raise VersionError(f"--kueue-api-version {kueue_api!r}: one of {', '.join(KUEUE_APIS)}")
        base = replace(base, kueue_api=kueue_api)
        source["kueue"] = "flag"
    return replace(base, source=source)


def defaulted(versions: Versions) -> list[str]:
    """The facts that were not given and were taken as the newest, for the offline note."""
    shown = {"kubernetes": f"Kubernetes {versions.kubernetes_text} (--kubernetes-version)",
             "trainer": f"Trainer {versions.trainer_text} (--trainer-version)",
             "kueue": f"Kueue API {versions.kueue_text} (--kueue-api-version)"}
    return [shown[k] for k, where in versions.source.items() if where == "default"]
