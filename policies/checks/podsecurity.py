"""Pod Security Standards (baseline, restricted; the current "latest" version) and the OpenShift
restricted-v2 SCC constraints, checked on the pods the job will create, before they exist.

Each violation names the pod, the field path inside its template and what to set instead.
The rules follow https://kubernetes.io/docs/concepts/security/pod-security-standards/. The SCC
model is OpenShift's restricted-v2 as shipped (openshift/cluster-kube-apiserver-operator,
bindata/bootkube/scc-manifests/0000_20_kube-apiserver-operator_00_scc-restricted-v2.yaml).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Literal

from pydantic import model_validator

from ..job.effective_job import PodSet, all_containers
from ..k8s.apitypes import Strict
from .base import CheckContext, Finding


class PodSecurityCheck(Strict):
    enabled: bool = True
    # For a namespace without a pod-security.kubernetes.io/enforce label (Kubernetes' own default
    # there is privileged); for every namespace when honorNamespaceLabel is false.
    defaultLevel: Literal["privileged", "baseline", "restricted"] = "baseline"
    honorNamespaceLabel: bool = True  # pod-security.kubernetes.io/enforce on the namespace wins
    # restricted-v2 SCC: auto where the namespace carries openshift.io/sa.scc.uid-range.
    openshiftSCC: Literal["auto", "always", "never"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """Bundles written before these fields changed keep their meaning: a PolicyBundle that
        stopped compiling on upgrade would leave its namespaces with no policy at all."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "level" in data:
            if "defaultLevel" in data:
                raise ValueError("`level` is the old name of `defaultLevel`: keep only `defaultLevel`")
            data["defaultLevel"] = data.pop("level")
        if isinstance(data.get("openshiftSCC"), bool):  # the old true checked every namespace
            data["openshiftSCC"] = "always" if data["openshiftSCC"] else "never"
        return data


LEVELS = ("privileged", "baseline", "restricted")
NAMESPACE_LEVEL_LABEL = "pod-security.kubernetes.io/enforce"
SCC_UID_RANGE = "openshift.io/sa.scc.uid-range"
SCC_GROUP_RANGE = "openshift.io/sa.scc.supplemental-groups"  # fsGroup's range; absent: the UID range

BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
})
PATCH_HINT = "spec.runtimePatches (containers[].securityContext, securityContext)"

Violation = tuple[str, str, str]  # (field path, what is wrong, what to set)


def effective_level(settings: PodSecurityCheck, namespace: dict) -> str:
    """The namespace's enforce label, as the PodSecurity admission plugin reads it; without one,
    the bundle's defaultLevel (not Kubernetes' own privileged, which would check nothing)."""
    label = ((namespace.get("metadata") or {}).get("labels") or {}).get(NAMESPACE_LEVEL_LABEL)
    if settings.honorNamespaceLabel and label in LEVELS:
        return label
    return settings.defaultLevel


def _containers(spec: dict) -> Iterator[tuple[str, dict, dict]]:
    for key, index, container in all_containers(spec):
        yield f"{key}[{container.get('name', index)}]", container, container.get("securityContext") or {}


def baseline(spec: dict, metadata: dict) -> Iterator[Violation]:
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"spec.{field}", f"{field} is true (host namespaces)", f"remove {field}"
    pod_sc = spec.get("securityContext") or {}
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        yield "spec.securityContext.windowsOptions.hostProcess", "hostProcess is true", "remove hostProcess"
    for index, volume in enumerate(spec.get("volumes") or []):
        if "hostPath" in volume:
            yield f"spec.volumes[{volume.get('name', index)}].hostPath", "uses a hostPath volume", \
                "use a persistentVolumeClaim, emptyDir or configMap volume instead"
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield "spec.securityContext.sysctls", f"sets unsafe sysctl {sysctl.get('name')}", "remove the sysctl"
    yield from _seccomp_not_unconfined("spec.securityContext", pod_sc)
    yield from _selinux("spec.securityContext", pod_sc)
    yield from _apparmor_profile("spec.securityContext", pod_sc)
    for key, value in (metadata.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and value == "unconfined":
            yield f"metadata.annotations[{key}]", "AppArmor is unconfined", "remove the annotation"
    for path, container, sc in _containers(spec):
        base = f"spec.{path}"
        if sc.get("privileged"):
            yield f"{base}.securityContext.privileged", "privileged is true", "remove privileged: true"
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"{base}.securityContext.windowsOptions.hostProcess", "hostProcess is true", "remove hostProcess"
        added = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            yield f"{base}.securityContext.capabilities.add", f"adds capabilities {', '.join(sorted(added))}", \
                "remove them from capabilities.add"
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                yield f"{base}.ports[{port.get('containerPort')}].hostPort", f"uses hostPort {port['hostPort']}", \
                    "remove hostPort (MPI ranks reach each other through the job's headless Service)"
        if sc.get("procMount") not in (None, "Default"):
            yield f"{base}.securityContext.procMount", f"procMount is {sc['procMount']}", "remove procMount"
        yield from _seccomp_not_unconfined(f"{base}.securityContext", sc)
        yield from _selinux(f"{base}.securityContext", sc)
        yield from _apparmor_profile(f"{base}.securityContext", sc)


def _seccomp_not_unconfined(path: str, sc: dict) -> Iterator[Violation]:
    if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield f"{path}.seccompProfile.type", "seccomp is Unconfined", "use RuntimeDefault"


def _selinux(path: str, sc: dict) -> Iterator[Violation]:
    options = sc.get("seLinuxOptions") or {}
    if options.get("type", "") not in SELINUX_TYPES or options.get("user") or options.get("role"):
        yield f"{path}.seLinuxOptions", "sets a custom SELinux type, user or role", "remove seLinuxOptions"


def _apparmor_profile(path: str, sc: dict) -> Iterator[Violation]:
    if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        yield f"{path}.appArmorProfile.type", "AppArmor is Unconfined", "use RuntimeDefault"


def _restricted_volumes(spec: dict) -> Iterator[Violation]:
    """Volume types outside the restricted list (hostPath is baseline's finding)."""
    for index, volume in enumerate(spec.get("volumes") or []):
        bad = [k for k in volume if k not in RESTRICTED_VOLUMES and k not in ("name", "hostPath")]
        if bad:
            yield f"spec.volumes[{volume.get('name', index)}]", f"uses a {bad[0]} volume", \
                "use configMap, secret, emptyDir, projected, csi or persistentVolumeClaim volumes"


def restricted(spec: dict, metadata: dict) -> Iterator[Violation]:
    yield from baseline(spec, metadata)
    yield from _restricted_volumes(spec)
    pod_sc = spec.get("securityContext") or {}
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_sc.get("runAsUser") == 0:
        yield "spec.securityContext.runAsUser", "runs as root (runAsUser: 0)", "set runAsUser to a non-zero UID"
    for path, _, sc in _containers(spec):
        base = f"spec.{path}.securityContext"
        if sc.get("allowPrivilegeEscalation") is not False:
            yield f"{base}.allowPrivilegeEscalation", "allowPrivilegeEscalation is not false", \
                "set allowPrivilegeEscalation: false"
        if not (sc.get("runAsNonRoot") is True or (pod_sc.get("runAsNonRoot") is True and sc.get("runAsNonRoot") is not False)):
            yield f"{base}.runAsNonRoot", "runAsNonRoot is not true", \
                "set runAsNonRoot: true (pod or container securityContext)"
        if sc.get("runAsUser") == 0:
            yield f"{base}.runAsUser", "runs as root (runAsUser: 0)", "set runAsUser to a non-zero UID"
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            yield f"{base}.seccompProfile", "seccompProfile is not RuntimeDefault or Localhost", \
                "set seccompProfile.type: RuntimeDefault (pod or container securityContext)"
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"{base}.capabilities.drop", "does not drop ALL capabilities", "set capabilities.drop: [ALL]"
        extra = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra & BASELINE_CAPABILITIES:
            yield f"{base}.capabilities.add", f"adds {', '.join(sorted(extra & BASELINE_CAPABILITIES))}", \
                "add only NET_BIND_SERVICE"


Span = tuple[int, int]


def scc_restricted_v2(spec: dict, metadata: dict, uids: Span | None, groups: Span | None,
                      covered: str = "privileged") -> Iterator[Violation]:
    """OpenShift restricted-v2. SCC admission fills in what a pod leaves unset, so silence is no
    violation: runAsUser from the namespace's UID range (runAsUser MustRunAsRange), fsGroup from
    its group range (MustRunAs), allowPrivilegeEscalation false, drop ALL
    (requiredDropCapabilities), seccomp runtime/default (seccompProfiles). It refuses what a pod
    sets against it: privileged, host namespaces and ports, hostPath and volume types outside
    its list, capabilities beyond NET_BIND_SERVICE, allowPrivilegeEscalation true, another
    seccomp profile, a runAsUser or fsGroup outside the ranges. ``covered`` is the Pod Security
    level already checked on the same pod, whose (identical) findings are not produced again."""
    if covered == "privileged":
        yield from baseline(spec, metadata)
    if covered != "restricted":
        yield from _restricted_volumes(spec)
    pod_sc = spec.get("securityContext") or {}
    candidates = [("spec.securityContext", pod_sc)] + [(f"spec.{p}.securityContext", sc) for p, _, sc in _containers(spec)]
    for path, sc in candidates:
        if sc.get("allowPrivilegeEscalation") is True:
            yield f"{path}.allowPrivilegeEscalation", "allowPrivilegeEscalation is true", "remove it or set false"
        extra = set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            yield f"{path}.capabilities.add", f"adds {', '.join(sorted(extra))}", "add only NET_BIND_SERVICE"
        if (sc.get("seccompProfile") or {}).get("type") not in (None, "RuntimeDefault", "Unconfined"):
            yield f"{path}.seccompProfile.type", f"seccomp is {sc['seccompProfile']['type']} (the SCC allows " \
                "only runtime/default)", "use RuntimeDefault or remove seccompProfile"  # Unconfined: baseline's
        if sc.get("runAsUser") == 0:
            yield f"{path}.runAsUser", "runs as root (runAsUser: 0)", "remove runAsUser (OpenShift assigns one)"
        yield from _outside(path, "runAsUser", sc.get("runAsUser"), uids, "UID")
        yield from _outside(path, "fsGroup", sc.get("fsGroup"), groups or uids, "group")


def _outside(path: str, field: str, value: object, span: Span | None, what: str) -> Iterator[Violation]:
    if span and isinstance(value, int) and value and not span[0] <= value <= span[1]:
        low, high = span
        yield f"{path}.{field}", f"{field} {value} is outside the namespace's {what} range {low}-{high}", \
            f"remove {field} (OpenShift assigns one) or pick one in {low}-{high}"


def uid_range(namespace: dict, annotation: str = SCC_UID_RANGE) -> Span | None:
    """openshift.io/sa.scc.uid-range: "1000680000/10000" -> (1000680000, 1000689999); the first
    block of a comma-separated list (supplemental-groups may carry several)."""
    value = ((namespace.get("metadata") or {}).get("annotations") or {}).get(annotation, "")
    start, _, size = value.split(",")[0].strip().partition("/")
    if start.isdigit() and size.isdigit():
        return int(start), int(start) + int(size) - 1
    return None


def on_openshift(settings: PodSecurityCheck, namespace: dict) -> bool:
    """Whether restricted-v2 applies: forced by the bundle, or (auto) the namespace carries the
    UID range that OpenShift's namespace controller writes on every project."""
    if settings.openshiftSCC == "auto":
        return uid_range(namespace) is not None
    return settings.openshiftSCC == "always"


def check(context: CheckContext, settings: PodSecurityCheck) -> list[Finding]:
    """Each pod set at the namespace's level (see effective_level), plus the SCC if asked."""
    namespace = context.namespace
    level = effective_level(settings, namespace)
    rules: list[tuple[str, Callable[[dict, dict], Iterator[Violation]]]] = []
    if level == "baseline":
        rules.append((f'Pod Security "{level}"', baseline))
    elif level == "restricted":
        rules.append((f'Pod Security "{level}"', restricted))
    if on_openshift(settings, namespace):
        uids, groups = uid_range(namespace), uid_range(namespace, SCC_GROUP_RANGE)
        rules.append(("OpenShift SCC restricted-v2", lambda s, m: scc_restricted_v2(s, m, uids, groups, level)))
    findings: list[Finding] = []
    for ps in context.job.with_pods:
        findings.extend(_pod_findings(ps, rules))
    return findings


def _pod_findings(ps: PodSet, rules: list[tuple[str, Callable]]) -> list[Finding]:
    """One finding per pod set, listing every violation with its field path, so a submitter
    sees the whole picture at once instead of fixing one field per submission."""
    seen: dict[str, tuple[str, str]] = {}
    standards: list[str] = []
    spec, metadata = ps.pod.get("spec") or {}, ps.pod.get("metadata") or {}
    for standard, rule in rules:
        for path, problem, fix in rule(spec, metadata):
            if path not in seen:
                seen[path] = (problem, fix)
                if standard not in standards:
                    standards.append(standard)
    if not seen:
        return []
    problems = "; ".join(f"{path} ({problem})" for path, (problem, _) in seen.items())
    fixes = list(dict.fromkeys(fix for _, fix in seen.values()))
    # A runtimePatch keeps only securityContext of these (policies/job/runtimepatch.py): other fields
    # (host namespaces, volumes, ...) come from the runtime alone.
    unpatchable = [path for path in seen if "securityContext" not in path]
    where = (f"in a TrainJob through {PATCH_HINT}, or use a runtime that conforms" if not unpatchable else
             f"use a runtime that conforms ({', '.join(unpatchable)} cannot be changed by spec.runtimePatches; "
             "ask your admin)")
    return [Finding(
        f"{ps.name} pod violates {' and '.join(standards)}: {problems} [in {ps.source}]",
        f"{'; '.join(fixes)} — {where}",
    )]
