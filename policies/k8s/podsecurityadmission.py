"""The Pod Security Standards at every policy version, as Pod Security admission evaluates a pod.

Mirrors k8s.io/pod-security-admission@v0.36.3: each check of policy/check_*.go with its version
history (``Versioned``: the minimum version a behaviour starts at, and the baseline checks a
restricted one replaces, OverrideCheckIDs), the registry that assembles the checks of a level
and version (policy/registry.go: baseline checks, then restricted ones, each group sorted by ID)
and the version label's grammar (api/helpers.go ParseVersion). Versions are the minor number of
``v1.N``; a version newer than the newest one upstream defines (``LATEST``), or ``latest``, is
evaluated as the newest, as registry.go EvaluatePod clamps it.

Each violation names the field a submitter changes (``spec.containers[name].securityContext.
privileged``), one per offending item, so a second finding on the same field is never hidden
(two forbidden sysctls are two violations). tests/unit/test_podsecurity_upstream.py holds this
module to every fixture upstream ships (test/testdata/{baseline,restricted}/v1.N/{pass,fail}),
read from the Go module cache.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Iterator

LATEST = 35  # the newest version any check of v0.36.3 defines (policy/check_procMount_*.go: v1.35)
BASELINE, RESTRICTED = "baseline", "restricted"
_VERSION = re.compile(r"v1\.(0|[1-9][0-9]*)")  # api/helpers.go versionRegexp

Violation = tuple[str, str, str]  # (field path, what is wrong, what to set instead)
CheckFn = Callable[[dict, dict], Iterator[Violation]]  # (pod metadata, pod spec)


def parse_version(text: object) -> int | None:
    """``v1.N`` -> N; ``latest`` and anything unparsable -> None (the newest): ParseVersion
    returns latest with its error, and the admission plugin evaluates with what it returned."""
    match = _VERSION.fullmatch(text) if isinstance(text, str) else None
    return int(match.group(1)) if match else None


def version_name(minor: int | None) -> str:
    return "latest" if minor is None else f"v1.{minor}"


# --- helpers (policy/helpers.go, visitor.go) ------------------------------------------------------

def _containers(spec: dict) -> Iterator[tuple[str, dict, dict | None]]:
    """visitContainers: init containers, containers, ephemeral containers; (path, container, its
    securityContext or None)."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for index, container in enumerate(_list(spec.get(key))):
            if isinstance(container, dict):
                sc = container.get("securityContext")
                yield f"spec.{key}[{container.get('name', index)}]", container, sc if isinstance(sc, dict) else None


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _pod_sc(spec: dict) -> dict | None:
    sc = spec.get("securityContext")
    return sc if isinstance(sc, dict) else None


def _windows(spec: dict) -> bool:
    """The 1.25+ restricted checks exempt pods whose spec.os.name is windows."""
    return _dict(spec.get("os")).get("name") == "windows"


def _user_namespaced(spec: dict) -> bool:
    """relaxPolicyForUserNamespacePod: hostUsers: false."""
    return spec.get("hostUsers") is False


def _present(value: object) -> bool:
    """A pointer field that is set (Go's != nil)."""
    return value is not None


# --- baseline checks ------------------------------------------------------------------------------

def host_namespaces(_: dict, spec: dict) -> Iterator[Violation]:
    """check_hostNamespaces.go 1.0."""
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(name) is True:
            yield f"spec.{name}", f"{name} is true (host namespaces)", f"remove {name}"


def privileged(_: dict, spec: dict) -> Iterator[Violation]:
    """check_privileged.go 1.0."""
    for path, _c, sc in _containers(spec):
        if sc is not None and sc.get("privileged") is True:
            yield f"{path}.securityContext.privileged", "privileged is true", "remove privileged: true"


BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})  # check_capabilities_baseline.go capabilities_allowed_1_0


def capabilities_baseline(_: dict, spec: dict) -> Iterator[Violation]:
    """check_capabilities_baseline.go 1.0: only the default set may be added."""
    for path, _c, sc in _containers(spec):
        added = [str(c) for c in _list(_dict((sc or {}).get("capabilities")).get("add")) if c not in BASELINE_CAPABILITIES]
        if added:
            yield f"{path}.securityContext.capabilities.add", f"adds capabilities {', '.join(sorted(set(added)))}", \
                "remove them from capabilities.add"


def host_path_volumes(_: dict, spec: dict) -> Iterator[Violation]:
    """check_hostPathVolumes.go 1.0."""
    for index, volume in enumerate(_list(spec.get("volumes"))):
        if isinstance(volume, dict) and _present(volume.get("hostPath")):
            yield f"spec.volumes[{volume.get('name', index)}].hostPath", "uses a hostPath volume", \
                "use a persistentVolumeClaim, emptyDir or configMap volume instead"


def host_ports(_: dict, spec: dict) -> Iterator[Violation]:
    """check_hostPorts.go 1.0: any hostPort but 0."""
    for path, container, _sc in _containers(spec):
        for port in _list(container.get("ports")):
            if isinstance(port, dict) and port.get("hostPort") not in (None, 0):
                yield f"{path}.ports[{port.get('containerPort')}].hostPort", f"uses hostPort {port['hostPort']}", \
                    "remove hostPort (MPI ranks reach each other through the job's headless Service)"


APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _apparmor_annotation_allowed(value: object) -> bool:
    return value in ("", "runtime/default") or (isinstance(value, str) and value.startswith("localhost/"))


def app_armor_profile(metadata: dict, spec: dict) -> Iterator[Violation]:
    """check_appArmorProfile.go 1.0: a set profile type is RuntimeDefault or Localhost; the
    deprecated annotations runtime/default, localhost/* or empty."""
    for path, sc in [("spec", _pod_sc(spec))] + [(p, s) for p, _c, s in _containers(spec)]:
        profile = (sc or {}).get("appArmorProfile")
        if _present(profile) and _dict(profile).get("type") not in ("RuntimeDefault", "Localhost"):
            yield f"{path}.securityContext.appArmorProfile.type", \
                f"AppArmor profile type is {_dict(profile).get('type')!s}", "use RuntimeDefault or Localhost"
    for key, value in sorted(_dict(metadata.get("annotations")).items()):
        if str(key).startswith(APPARMOR_ANNOTATION) and not _apparmor_annotation_allowed(value):
            yield f"metadata.annotations[{key}]", f"sets AppArmor profile {value}", \
                "remove the annotation or set it to runtime/default"


SELINUX_TYPES_1_0 = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
SELINUX_TYPES_1_31 = SELINUX_TYPES_1_0 | {"container_engine_t"}


def _selinux(allowed: frozenset[str]) -> CheckFn:
    def se_linux_options(_: dict, spec: dict) -> Iterator[Violation]:
        """check_seLinuxOptions.go: type from the allowed set, no user, no role."""
        for path, sc in [("spec", _pod_sc(spec))] + [(p, s) for p, _c, s in _containers(spec)]:
            options = (sc or {}).get("seLinuxOptions")
            if not _present(options):
                continue
            options = _dict(options)
            if options.get("type", "") not in allowed:
                yield f"{path}.securityContext.seLinuxOptions.type", f"SELinux type {options.get('type')} is not " \
                    "allowed", f"remove it or use one of {', '.join(sorted(t for t in allowed if t))}"
            for part in ("user", "role"):
                if options.get(part):
                    yield f"{path}.securityContext.seLinuxOptions.{part}", f"sets a custom SELinux {part}", \
                        f"remove seLinuxOptions.{part}"
    return se_linux_options


def _proc_mount(relax_user_namespaces: bool) -> CheckFn:
    def proc_mount(_: dict, spec: dict) -> Iterator[Violation]:
        """check_procMount_baseline.go: procMount unset or Default (1.35: any value in a pod with
        hostUsers: false); check_procMount_restricted.go (1.35) keeps the 1.0 rule."""
        if relax_user_namespaces and _user_namespaced(spec):
            return
        for path, _c, sc in _containers(spec):
            if sc is not None and _present(sc.get("procMount")) and sc.get("procMount") != "Default":
                fix = "remove procMount" + ("" if relax_user_namespaces else " (restricted allows only Default)")
                if relax_user_namespaces:
                    fix += ", or run the pod in a user namespace (hostUsers: false)"
                yield f"{path}.securityContext.procMount", f"procMount is {sc['procMount']}", fix
    return proc_mount


SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION = "container.seccomp.security.alpha.kubernetes.io/"


def seccomp_annotations(metadata: dict, spec: dict) -> Iterator[Violation]:
    """check_seccompProfile_baseline.go 1.0-1.18: the alpha annotations, runtime/default,
    docker/default or localhost/*."""
    annotations = _dict(metadata.get("annotations"))
    keys = [SECCOMP_POD_ANNOTATION] + [SECCOMP_CONTAINER_ANNOTATION + str(c.get("name", "")) for _p, c, _s in _containers(spec)]
    for key in keys:
        value = annotations.get(key)
        if key in annotations and not (value in ("runtime/default", "docker/default")
                                       or (isinstance(value, str) and value.startswith("localhost/"))):
            yield f"metadata.annotations[{key}]", f"sets seccomp profile {value}", \
                "remove the annotation or set it to runtime/default"


def _seccomp_type(sc: dict | None) -> tuple[bool, object]:
    profile = (sc or {}).get("seccompProfile")
    return _present(profile), _dict(profile).get("type")


def seccomp_profile_baseline(_: dict, spec: dict) -> Iterator[Violation]:
    """check_seccompProfile_baseline.go 1.19: a set profile is RuntimeDefault or Localhost."""
    for path, sc in [("spec", _pod_sc(spec))] + [(p, s) for p, _c, s in _containers(spec)]:
        present, kind = _seccomp_type(sc)
        if present and kind not in ("RuntimeDefault", "Localhost"):
            yield f"{path}.securityContext.seccompProfile.type", f"seccomp profile is {kind}", "use RuntimeDefault"


SYSCTLS_1_0 = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                         "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"})
SYSCTLS_1_27 = SYSCTLS_1_0 | {"net.ipv4.ip_local_reserved_ports"}
SYSCTLS_1_29 = SYSCTLS_1_27 | {"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                               "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SYSCTLS_1_32 = SYSCTLS_1_29 | {"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}


def _sysctls(allowed: frozenset[str]) -> CheckFn:
    def sysctls(_: dict, spec: dict) -> Iterator[Violation]:
        """check_sysctls.go: only the safe sysctls of the version."""
        for sysctl in _list((_pod_sc(spec) or {}).get("sysctls")):
            name = _dict(sysctl).get("name")
            if name not in allowed:
                yield f"spec.securityContext.sysctls[{name}]", f"sets unsafe sysctl {name}", "remove the sysctl"
    return sysctls


def windows_host_process(_: dict, spec: dict) -> Iterator[Violation]:
    """check_windowsHostProcess.go 1.0."""
    for path, sc in [("spec", _pod_sc(spec))] + [(p, s) for p, _c, s in _containers(spec)]:
        if _dict((sc or {}).get("windowsOptions")).get("hostProcess") is True:
            yield f"{path}.securityContext.windowsOptions.hostProcess", "hostProcess is true", "remove hostProcess"


def host_probes_and_lifecycle(_: dict, spec: dict) -> Iterator[Violation]:
    """check_hostProbesAndhostLifecycle.go 1.34: no host in probes' and lifecycle handlers'
    httpGet and tcpSocket."""
    for path, container, _sc in _containers(spec):
        handlers = [(probe, container.get(probe)) for probe in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(f"lifecycle.{hook}", _dict(container.get("lifecycle")).get(hook)) for hook in ("postStart", "preStop")]
        for where, handler in handlers:
            for action in ("httpGet", "tcpSocket"):
                host = _dict(_dict(handler).get(action)).get("host")
                if host:
                    yield f"{path}.{where}.{action}.host", f"{where} uses host {host}", \
                        "remove host (a probe or hook reaches the pod's own IP)"


# --- restricted checks ----------------------------------------------------------------------------

def _windows_exempt(check: CheckFn) -> CheckFn:
    """The 1.25 version of a restricted check: Windows pods (spec.os.name) pass."""
    def exempt(metadata: dict, spec: dict) -> Iterator[Violation]:
        return iter(()) if _windows(spec) else check(metadata, spec)
    exempt.__doc__ = f"{check.__doc__} From 1.25, not for spec.os.name: windows."
    return exempt


def _user_namespace_exempt(check: CheckFn) -> CheckFn:
    """The 1.35 version of a check: pods with hostUsers: false pass."""
    def exempt(metadata: dict, spec: dict) -> Iterator[Violation]:
        return iter(()) if _user_namespaced(spec) else check(metadata, spec)
    exempt.__doc__ = f"{check.__doc__} From 1.35, not for hostUsers: false."
    return exempt


def allow_privilege_escalation(_: dict, spec: dict) -> Iterator[Violation]:
    """check_allowPrivilegeEscalation.go 1.8: every container sets it false."""
    for path, _c, sc in _containers(spec):
        if (sc or {}).get("allowPrivilegeEscalation") is not False:
            yield f"{path}.securityContext.allowPrivilegeEscalation", "allowPrivilegeEscalation is not false", \
                "set allowPrivilegeEscalation: false"


def capabilities_restricted(_: dict, spec: dict) -> Iterator[Violation]:
    """check_capabilities_restricted.go 1.22: drop ALL, add only NET_BIND_SERVICE."""
    for path, _c, sc in _containers(spec):
        capabilities = (sc or {}).get("capabilities")
        if "ALL" not in _list(_dict(capabilities).get("drop")):
            yield f"{path}.securityContext.capabilities.drop", "does not drop ALL capabilities", \
                "set capabilities.drop: [ALL]"
        added = sorted({str(c) for c in _list(_dict(capabilities).get("add")) if c != "NET_BIND_SERVICE"})
        if added:
            yield f"{path}.securityContext.capabilities.add", f"adds capabilities {', '.join(added)}", \
                "add only NET_BIND_SERVICE"


RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim",
                      "projected", "secret")


def restricted_volumes(_: dict, spec: dict) -> Iterator[Violation]:
    """check_restrictedVolumes.go 1.0: only the listed volume sources (hostPath among the others)."""
    for index, volume in enumerate(_list(spec.get("volumes"))):
        volume = _dict(volume)
        sources = [k for k, v in volume.items() if k != "name" and _present(v)]
        if not sources or any(source in RESTRICTED_VOLUMES for source in sources):
            continue  # no source: the API server stores an emptyDir (core/v1 SetDefaults_Volume)
        kind = sources[0]
        where = f"spec.volumes[{volume.get('name', index)}]" + (".hostPath" if kind == "hostPath" else "")
        yield where, f"uses a {kind} volume", "use configMap, secret, emptyDir, projected, csi, ephemeral or " \
                                               "persistentVolumeClaim volumes"


def run_as_non_root(_: dict, spec: dict) -> Iterator[Violation]:
    """check_runAsNonRoot.go 1.0: runAsNonRoot true on the pod or on every container, never false."""
    pod = (_pod_sc(spec) or {}).get("runAsNonRoot")
    if pod is False:
        yield "spec.securityContext.runAsNonRoot", "runAsNonRoot is false", "set runAsNonRoot: true"
    for path, _c, sc in _containers(spec):
        own = (sc or {}).get("runAsNonRoot")
        if own is False:
            yield f"{path}.securityContext.runAsNonRoot", "runAsNonRoot is false", "set runAsNonRoot: true"
        elif own is None and pod is not True:
            yield f"{path}.securityContext.runAsNonRoot", "runAsNonRoot is not true", \
                "set runAsNonRoot: true (pod or container securityContext)"


def run_as_user(_: dict, spec: dict) -> Iterator[Violation]:
    """check_runAsUser.go 1.23: never runAsUser 0."""
    for path, sc in [("spec", _pod_sc(spec))] + [(p, s) for p, _c, s in _containers(spec)]:
        value = (sc or {}).get("runAsUser")
        if value == 0 and not isinstance(value, bool):
            yield f"{path}.securityContext.runAsUser", "runs as root (runAsUser: 0)", "set runAsUser to a non-zero UID"


def seccomp_profile_restricted(_: dict, spec: dict) -> Iterator[Violation]:
    """check_seccompProfile_restricted.go 1.19: RuntimeDefault or Localhost on the pod or every
    container."""
    pod_present, pod_type = _seccomp_type(_pod_sc(spec))
    pod_set = pod_present and pod_type in ("RuntimeDefault", "Localhost")
    if pod_present and not pod_set:
        yield "spec.securityContext.seccompProfile.type", f"seccomp profile is {pod_type}", "use RuntimeDefault"
    for path, _c, sc in _containers(spec):
        present, kind = _seccomp_type(sc)
        if present and kind not in ("RuntimeDefault", "Localhost"):
            yield f"{path}.securityContext.seccompProfile.type", f"seccomp profile is {kind}", "use RuntimeDefault"
        elif not present and not pod_set:
            yield f"{path}.securityContext.seccompProfile", "seccompProfile is not RuntimeDefault or Localhost", \
                "set seccompProfile.type: RuntimeDefault (pod or container securityContext)"


# --- the registry ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Versioned:
    minimum: int  # the first v1.N this behaviour applies to
    check: CheckFn
    overrides: tuple[str, ...] = ()  # baseline check IDs it replaces at restricted (OverrideCheckIDs)


@dataclass(frozen=True)
class PolicyCheck:
    id: str  # policy CheckID
    level: str
    versions: tuple[Versioned, ...]


_procmount = _proc_mount(relax_user_namespaces=False)
CHECKS: tuple[PolicyCheck, ...] = (
    PolicyCheck("allowPrivilegeEscalation", RESTRICTED, (
        Versioned(8, allow_privilege_escalation), Versioned(25, _windows_exempt(allow_privilege_escalation)))),
    PolicyCheck("appArmorProfile", BASELINE, (Versioned(0, app_armor_profile),)),
    PolicyCheck("capabilities_baseline", BASELINE, (Versioned(0, capabilities_baseline),)),
    PolicyCheck("capabilities_restricted", RESTRICTED, (
        Versioned(22, capabilities_restricted, ("capabilities_baseline",)),
        Versioned(25, _windows_exempt(capabilities_restricted), ("capabilities_baseline",)))),
    PolicyCheck("hostNamespaces", BASELINE, (Versioned(0, host_namespaces),)),
    PolicyCheck("hostPathVolumes", BASELINE, (Versioned(0, host_path_volumes),)),
    PolicyCheck("hostPorts", BASELINE, (Versioned(0, host_ports),)),
    PolicyCheck("hostProbesAndHostLifecycle", BASELINE, (Versioned(34, host_probes_and_lifecycle),)),
    PolicyCheck("privileged", BASELINE, (Versioned(0, privileged),)),
    PolicyCheck("procMount", BASELINE, (Versioned(0, _procmount), Versioned(35, _proc_mount(relax_user_namespaces=True)))),
    PolicyCheck("procMount_restricted", RESTRICTED, (Versioned(35, _procmount, ("procMount",)),)),
    PolicyCheck("restrictedVolumes", RESTRICTED, (Versioned(0, restricted_volumes, ("hostPathVolumes",)),)),
    PolicyCheck("runAsNonRoot", RESTRICTED, (Versioned(0, run_as_non_root),
                                             Versioned(35, _user_namespace_exempt(run_as_non_root)))),
    PolicyCheck("runAsUser", RESTRICTED, (Versioned(23, run_as_user), Versioned(35, _user_namespace_exempt(run_as_user)))),
    PolicyCheck("seLinuxOptions", BASELINE, (Versioned(0, _selinux(SELINUX_TYPES_1_0)),
                                             Versioned(31, _selinux(SELINUX_TYPES_1_31)))),
    PolicyCheck("seccompProfile_baseline", BASELINE, (Versioned(0, seccomp_annotations),
                                                      Versioned(19, seccomp_profile_baseline))),
    PolicyCheck("seccompProfile_restricted", RESTRICTED, (
        Versioned(19, seccomp_profile_restricted, ("seccompProfile_baseline",)),
        Versioned(25, _windows_exempt(seccomp_profile_restricted), ("seccompProfile_baseline",)))),
    PolicyCheck("sysctls", BASELINE, (Versioned(0, _sysctls(SYSCTLS_1_0)), Versioned(27, _sysctls(SYSCTLS_1_27)),
                                      Versioned(29, _sysctls(SYSCTLS_1_29)), Versioned(32, _sysctls(SYSCTLS_1_32)))),
    PolicyCheck("windowsHostProcess", BASELINE, (Versioned(0, windows_host_process),)),
)


def _at(check: PolicyCheck, minor: int) -> Versioned | None:
    """The behaviour of ``check`` at v1.minor (inflateVersions): the last one starting at or before it."""
    return next((v for v in reversed(check.versions) if v.minimum <= minor), None)


@functools.cache
def checks_for(level: str, minor: int | None) -> tuple[tuple[str, CheckFn], ...]:
    """The (ID, check) pairs a level evaluates at v1.minor (None: the newest), in registry.go's
    order: baseline IDs sorted, then restricted IDs sorted; at restricted, without the baseline
    checks a restricted one overrides at that version."""
    minor = LATEST if minor is None or minor > LATEST else minor
    active = {c.id: (c, v) for c in CHECKS if (v := _at(c, minor)) is not None}
    baseline = {i: v for i, (c, v) in active.items() if c.level == BASELINE}
    if level == BASELINE:
        return tuple((i, baseline[i].check) for i in sorted(baseline))
    restricted = {i: v for i, (c, v) in active.items() if c.level == RESTRICTED}
    overridden = {o for v in restricted.values() for o in v.overrides}
    kept = {i: v for i, v in baseline.items() if i not in overridden}
    return tuple((i, kept[i].check) for i in sorted(kept)) + tuple((i, restricted[i].check) for i in sorted(restricted))


def evaluate(level: str, minor: int | None, metadata: dict, spec: dict) -> list[tuple[str, Violation]]:
    """(check ID, violation) for each violation of the pod at level:v1.minor; [] for privileged."""
    if level not in (BASELINE, RESTRICTED):
        return []
    return [(check_id, v) for check_id, check in checks_for(level, minor) for v in check(metadata, spec)]
