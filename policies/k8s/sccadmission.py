"""OpenShift SecurityContextConstraints admission for the SCCs whose settings a namespace's
annotations determine: restricted-v2 (every authenticated user's) and nonroot-v2.

Two upstream sources: the SCCs as OpenShift ships them (openshift/cluster-kube-apiserver-operator
bindata/bootkube/scc-manifests/0000_20_kube-apiserver-operator_00_scc-{restricted,nonroot}-v2.yaml)
and the admission that applies one to a pod (openshift/apiserver-library-go
pkg/securitycontextconstraints): sccmatching/matcher.go fills the SCC's pre-allocated values from
the namespace's annotations, sccmatching/provider.go first fills in what the pod leaves unset
(Create*SecurityContext) and then validates the result (Validate*SecurityContext) with the
strategies of user/, selinux/, group/, capabilities/, seccomp/ and sysctl/. The pod is admitted
by the first SCC it validates against, in util/sort's order (restricted-v2 before nonroot-v2),
and is stored as that SCC filled it in, which is what Pod Security admission then judges.

Where the namespace lacks an annotation (an OpenShift project always has them; a namespace a
bundle treats as OpenShift with ``openshiftSCC: always`` may not), the rule that needs it is not
applied: OpenShift itself would refuse every pod there, which would say nothing useful.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Iterator

UID_RANGE = "openshift.io/sa.scc.uid-range"
MCS = "openshift.io/sa.scc.mcs"
SUPPLEMENTAL_GROUPS = "openshift.io/sa.scc.supplemental-groups"  # fsGroup's; without it, the UID range (matcher.go)
SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION = "container.seccomp.security.alpha.kubernetes.io/"
# sysctl/mustmatchpatterns.go: the legacy safe list, and those a kernel of 4.15 / 4.15 / 4.15+
# (every kernel OpenShift 4.18+ runs) namespaces, SafeSysctlAllowlist.
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
})
RUNTIME_DEFAULT = ("runtime/default", "docker/default")  # seccomp/strategy.go runtimeDefaultAllowed

Violation = tuple[str, str, str]  # (field path, what is wrong, what to set instead)
Span = tuple[int, int]


@dataclass(frozen=True)
class Scc:
    """The settings of a shipped SCC that differ between restricted-v2 and nonroot-v2; both also
    forbid privileged containers, host namespaces, host ports and privilege escalation, require
    dropping ALL capabilities and allow adding only NET_BIND_SERVICE, take seccomp runtime/default
    and the namespace's SELinux level (seLinuxContext MustRunAs)."""

    name: str
    run_as_user: str  # MustRunAsRange (the namespace's UID range) | MustRunAsNonRoot
    fs_group: str  # MustRunAs (the namespace's first group) | RunAsAny
    volumes: frozenset[str] = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                                         "persistentVolumeClaim", "projected", "secret"})


RESTRICTED_V2 = Scc("restricted-v2", run_as_user="MustRunAsRange", fs_group="MustRunAs")
NONROOT_V2 = Scc("nonroot-v2", run_as_user="MustRunAsNonRoot", fs_group="RunAsAny")
SCCS = {scc.name: scc for scc in (RESTRICTED_V2, NONROOT_V2)}  # in util/sort ByRestrictions order


@dataclass(frozen=True)
class Allocations:
    """What matcher.go reads from the namespace's annotations; None where one is missing."""

    uids: Span | None = None  # openshift.io/sa.scc.uid-range "start/size"
    level: str | None = None  # openshift.io/sa.scc.mcs, e.g. "s0:c27,c4"
    groups: list[Span] = field(default_factory=list)  # supplemental-groups blocks (or the UID range)

    @classmethod
    def of(cls, namespace: dict) -> "Allocations":
        annotations = (namespace.get("metadata") or {}).get("annotations") or {}
        uids = _blocks(annotations.get(UID_RANGE))
        level = annotations.get(MCS)
        return cls(uids[0] if uids else None, level if isinstance(level, str) and level else None,
                   _blocks(annotations.get(SUPPLEMENTAL_GROUPS, annotations.get(UID_RANGE))))


def _blocks(value: object) -> list[Span]:
    """library-go security/uid ParseBlock over comma-separated "start/size" (or "start-end") blocks."""
    spans = []
    for part in str(value or "").split(","):
        part = part.strip()
        start, sep, rest = part.partition("/") if "/" in part else part.partition("-")
        if not (sep and start.isdigit() and rest.isdigit()):
            return []
        first, second = int(start), int(rest)
        spans.append((first, first + second - 1) if sep == "/" else (first, second))
    return spans


def admit(pod: dict, scc: Scc, ns: Allocations) -> tuple[dict, list[Violation]]:
    """The pod as ``scc`` fills it in (provider.go Create*SecurityContext), and what it then
    refuses in it (Validate*SecurityContext); an empty list: the SCC admits the pod."""
    filled = _fill(pod, scc, ns)
    return filled, list(dict.fromkeys(_validate(filled, scc, ns)))


# --- filling in (provider.go CreatePodSecurityContext, CreateContainerSecurityContext) ------------

def _fill(pod: dict, scc: Scc, ns: Allocations) -> dict:
    pod = copy.deepcopy(pod)
    metadata, spec = pod.setdefault("metadata", {}), pod.setdefault("spec", {})
    if not isinstance(spec.get("securityContext"), dict):
        spec["securityContext"] = {}
    pod_sc = spec["securityContext"]
    annotations = metadata.get("annotations") if isinstance(metadata.get("annotations"), dict) else {}
    if scc.fs_group == "MustRunAs" and pod_sc.get("fsGroup") is None and ns.groups:
        pod_sc["fsGroup"] = ns.groups[0][0]  # group/mustrunas.go GenerateSingle: the first range's min
    if pod_sc.get("seLinuxOptions") is None and ns.level:
        pod_sc["seLinuxOptions"] = {"level": ns.level}  # selinux/mustrunas.go Generate
    profile = _pod_profile(annotations, pod_sc) or RUNTIME_DEFAULT[0]  # seccomp/strategy.go Generate
    metadata["annotations"] = {**annotations, SECCOMP_POD_ANNOTATION: profile}
    pod_sc["seccompProfile"] = _profile_field(profile)
    for container in _containers(spec):
        if not isinstance(container.get("securityContext"), dict):
            container["securityContext"] = {}
        sc = container["securityContext"]
        run_as_user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if run_as_user is None and scc.run_as_user == "MustRunAsRange" and ns.uids:
            sc["runAsUser"] = run_as_user = ns.uids[0]  # user/mustrunasrange.go Generate: the range's min
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is None and (
                (run_as_user is None and scc.run_as_user == "MustRunAsNonRoot")
                or (isinstance(run_as_user, int) and run_as_user > 0)):
            sc["runAsNonRoot"] = True
        capabilities = sc.get("capabilities") if isinstance(sc.get("capabilities"), dict) else {}
        drop = [str(c) for c in capabilities.get("drop") or []]
        if "ALL" not in drop:  # capabilities/mustrunas.go Generate: requiredDropCapabilities ALL
            sc["capabilities"] = {**capabilities, "drop": sorted({*drop, "ALL"})}
        own = annotations.get(SECCOMP_CONTAINER_ANNOTATION + str(container.get("name", "")))
        if own is not None:
            sc["seccompProfile"] = _profile_field(own)
        if sc.get("allowPrivilegeEscalation") is None:  # allowPrivilegeEscalation: false in the SCC
            sc["allowPrivilegeEscalation"] = False
    return pod


def _containers(spec: dict) -> Iterator[dict]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                yield container


def _pod_profile(annotations: dict, pod_sc: dict) -> str:
    """seccomp/strategy.go: the pod annotation, else the pod field, as an annotation value."""
    return annotations.get(SECCOMP_POD_ANNOTATION) or _annotation_for(pod_sc.get("seccompProfile"))


def _annotation_for(profile: object) -> str:
    """seccompAnnotationForField."""
    if not isinstance(profile, dict):
        return ""
    kind = profile.get("type")
    if kind == "Unconfined":
        return "unconfined"
    if kind == "RuntimeDefault":
        return "runtime/default"
    if kind == "Localhost" and profile.get("localhostProfile") is not None:
        return f"localhost/{profile['localhostProfile']}"
    return ""


def _profile_field(annotation: str) -> dict:
    """provider.go seccompFieldForAnnotation."""
    if annotation == "unconfined":
        return {"type": "Unconfined"}
    if annotation in RUNTIME_DEFAULT:
        return {"type": "RuntimeDefault"}
    if annotation.startswith("localhost/"):
        return {"type": "Localhost", "localhostProfile": annotation[len("localhost/"):]}
    return {}


# --- validating (provider.go ValidatePodSecurityContext, ValidateContainerSecurityContext) --------

def _validate(pod: dict, scc: Scc, ns: Allocations) -> Iterator[Violation]:
    spec, annotations = pod["spec"], pod["metadata"].get("annotations") or {}
    pod_sc = spec.get("securityContext") or {}
    fs_group = pod_sc.get("fsGroup")
    if scc.fs_group == "MustRunAs" and ns.groups and fs_group is not None and fs_group != ns.groups[0][0]:
        # matcher.go getPreallocatedFSGroup: the range is the first block's start alone
        yield "spec.securityContext.fsGroup", f"fsGroup {fs_group} is not the namespace's group {ns.groups[0][0]}", \
            "remove fsGroup (OpenShift assigns the namespace's)"
    profile = _pod_profile(annotations, pod_sc)
    if profile not in RUNTIME_DEFAULT:
        yield "spec.securityContext.seccompProfile.type", f"seccomp profile {profile} is not allowed by {scc.name} (only " \
                                                     "runtime/default)", "use RuntimeDefault or remove seccompProfile"
    yield from _selinux("spec.securityContext", pod_sc.get("seLinuxOptions"), ns)
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(name) is True:
            yield f"spec.{name}", f"{name} is true (host namespaces)", f"remove {name}"
    for sysctl in pod_sc.get("sysctls") or []:
        name = (sysctl or {}).get("name") if isinstance(sysctl, dict) else None
        if name not in SAFE_SYSCTLS:
            yield f"spec.securityContext.sysctls[{name}]", f"sets unsafe sysctl {name}", "remove the sysctl"
    for index, volume in enumerate(spec.get("volumes") or []):
        volume = volume if isinstance(volume, dict) else {}
        kind = next((k for k, v in volume.items() if k != "name" and v is not None), "emptyDir")
        if kind not in scc.volumes:
            yield f"spec.volumes[{volume.get('name', index)}]" + (".hostPath" if kind == "hostPath" else ""), \
                f"uses a {kind} volume", f"use one of the volume types {scc.name} allows: {', '.join(sorted(scc.volumes))}"
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for index, container in enumerate(spec.get(key) or []):
            if isinstance(container, dict):
                yield from _container(f"spec.{key}[{container.get('name', index)}]", container, pod_sc, annotations,
                                      scc, ns)


def _container(path: str, container: dict, pod_sc: dict, annotations: dict, scc: Scc, ns: Allocations
               ) -> Iterator[Violation]:
    sc = container.get("securityContext") if isinstance(container.get("securityContext"), dict) else {}
    where = f"{path}.securityContext"
    run_as_user = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if scc.run_as_user == "MustRunAsRange" and ns.uids is None and run_as_user == 0 and run_as_user is not False:
        # No range known, but the namespace controller never allocates one holding 0.
        yield (f"{where}.runAsUser" if "runAsUser" in sc else "spec.securityContext.runAsUser"), \
            "runs as root (runAsUser: 0), outside any namespace's UID range", "remove runAsUser (OpenShift assigns one)"
    if scc.run_as_user == "MustRunAsRange" and ns.uids and isinstance(run_as_user, int):
        low, high = ns.uids
        if not low <= run_as_user <= high:  # user/mustrunasrange.go Validate
            field = f"{where}.runAsUser" if "runAsUser" in sc else "spec.securityContext.runAsUser"
            yield field, (f"runs as root (runAsUser: 0), outside the namespace's UID range {low}-{high}" if run_as_user == 0
                          else f"runAsUser {run_as_user} is outside the namespace's UID range {low}-{high}"), \
                f"remove runAsUser (OpenShift assigns one) or pick one in {low}-{high}"
    if scc.run_as_user == "MustRunAsNonRoot":  # user/nonroot.go Validate
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is False:
            yield f"{where}.runAsNonRoot", "runAsNonRoot is false", "set runAsNonRoot: true"
        elif run_as_user == 0 and not isinstance(run_as_user, bool):
            yield f"{where}.runAsUser", "runs as root (runAsUser: 0)", "set a non-zero runAsUser"
    yield from _selinux(where, sc.get("seLinuxOptions", pod_sc.get("seLinuxOptions")), ns)
    profile = _container_profile(container, sc, pod_sc, annotations)
    if profile not in RUNTIME_DEFAULT:
        yield f"{where}.seccompProfile.type", f"seccomp profile {profile} is not allowed by {scc.name} (only " \
                                         "runtime/default)", "use RuntimeDefault or remove seccompProfile"
    if sc.get("privileged") is True:
        yield f"{where}.privileged", "privileged is true", "remove privileged: true"
    added = sorted({str(c) for c in (sc.get("capabilities") or {}).get("add") or [] if c != "NET_BIND_SERVICE"})
    if added:  # capabilities/mustrunas.go Validate: allowedCapabilities NET_BIND_SERVICE
        yield f"{where}.capabilities.add", f"adds capabilities {', '.join(added)}", "add only NET_BIND_SERVICE"
    for port in container.get("ports") or []:
        if isinstance(port, dict) and isinstance(port.get("hostPort"), int) and port["hostPort"] > 0:
            yield f"{path}.ports[{port.get('containerPort')}].hostPort", f"uses hostPort {port['hostPort']}", \
                "remove hostPort"
    if sc.get("allowPrivilegeEscalation") is True:
        yield f"{where}.allowPrivilegeEscalation", "allowPrivilegeEscalation is true", "remove it or set false"


def _container_profile(container: dict, sc: dict, pod_sc: dict, annotations: dict) -> str:
    """seccomp/strategy.go profileForContainer: the container's field, its annotation, the pod's
    field, the pod's annotation."""
    if isinstance(sc.get("seccompProfile"), dict):
        return _annotation_for(sc["seccompProfile"])
    own = annotations.get(SECCOMP_CONTAINER_ANNOTATION + str(container.get("name", "")))
    if own is not None:
        return own
    if isinstance(pod_sc.get("seccompProfile"), dict):
        return _annotation_for(pod_sc["seccompProfile"])
    return annotations.get(SECCOMP_POD_ANNOTATION, "")


def _selinux(path: str, options: object, ns: Allocations) -> Iterator[Violation]:
    """selinux/mustrunas.go Validate: the namespace's level (categories in any order), and no
    type, user or role (restricted-v2 and nonroot-v2 set none)."""
    if ns.level is None:
        return
    options = options if isinstance(options, dict) else {}
    level = options.get("level", "")
    if not _equal_levels(ns.level, level):
        yield f"{path}.seLinuxOptions.level", (f"SELinux level {level} is not the namespace's {ns.level}" if level else
                                               f"SELinux level is unset, not the namespace's {ns.level}"), \
            f"remove seLinuxOptions (OpenShift assigns {ns.level}) or set level: {ns.level}"
    for part in ("type", "user", "role"):
        if options.get(part):
            yield f"{path}.seLinuxOptions.{part}", f"sets SELinux {part} {options[part]}, which the SCC does not allow", \
                f"remove seLinuxOptions.{part}"


def _equal_levels(expected: str, actual: object) -> bool:
    """selinux/mustrunas.go equalLevels: the same sensitivity and the same set of categories."""
    if expected == actual:
        return True
    if not isinstance(actual, str) or ":" not in expected or ":" not in actual:
        return False
    want_sensitivity, want = expected.split(":", 1)
    got_sensitivity, got = actual.split(":", 1)
    return want_sensitivity == got_sensitivity and sorted(want.split(",")) == sorted(got.split(","))
