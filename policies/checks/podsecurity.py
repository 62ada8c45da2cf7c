"""Pod Security admission and, on OpenShift, SCC admission, judged on the pods the job will
create, before they exist.

The level and version are the namespace's, read as Pod Security admission reads its labels
(k8s.io/pod-security-admission api/helpers.go PolicyToEvaluate): ``pod-security.kubernetes.io/
enforce`` (an unknown level is restricted: it fails closed) and ``enforce-version`` (``v1.N``;
missing, ``latest`` or unparsable: the newest). Without an enforce label the bundle's
``defaultLevel`` stands in for the cluster's admission configuration. The standards at each
version are policies/k8s/podsecurityadmission.py; the SCCs are policies/k8s/sccadmission.py: on
OpenShift the pod is first filled in and validated by the SCCs it may use, and Pod Security then
judges the pod as the SCC filled it in, as the two admission plugins run there.

Each violation names the pod, the field path inside its template and what to set instead.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..job.effective_job import PodSet
from ..k8s import podsecurityadmission as psa
from ..k8s import sccadmission as scc
from ..k8s.apitypes import Strict
from .base import CheckContext, Finding


class PodSecurityCheck(Strict):
    enabled: bool = True
    # For a namespace without a pod-security.kubernetes.io/enforce label (Kubernetes' own default
    # there is privileged); for every namespace when honorNamespaceLabel is false.
    defaultLevel: Literal["privileged", "baseline", "restricted"] = "baseline"
    # The policy version for a namespace without an enforce-version label: "latest" or "v1.N".
    defaultVersion: str = "latest"
    honorNamespaceLabel: bool = True  # pod-security.kubernetes.io/enforce(-version) on the namespace win
    # The SCCs: auto where the namespace carries openshift.io/sa.scc.uid-range.
    openshiftSCC: Literal["auto", "always", "never"] = "auto"
    # The SCCs the job's pods may use, tried in SCC admission's order (restricted-v2 first): every
    # authenticated user may use restricted-v2; add nonroot-v2 where the admin granted it.
    openshiftSCCs: list[Literal["restricted-v2", "nonroot-v2"]] = Field(default=["restricted-v2"], min_length=1)

    @field_validator("defaultVersion")
    @classmethod
    def _version(cls, value: str) -> str:
        if value != "latest" and psa.parse_version(value) is None:
            raise ValueError(f"defaultVersion must be \"latest\" or \"v1.N\", got {value!r}")
        return value

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
NAMESPACE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
PATCH_HINT = "spec.runtimePatches (containers[].securityContext, securityContext)"


def _labels(namespace: dict) -> dict:
    labels = (namespace.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def effective_level(settings: PodSecurityCheck, namespace: dict) -> str:
    """The namespace's enforce label as PolicyToEvaluate reads it (ParseLevel refuses an unknown
    level with restricted); without one, the bundle's defaultLevel (not Kubernetes' own
    privileged, which would check nothing)."""
    labels = _labels(namespace)
    if settings.honorNamespaceLabel and NAMESPACE_LEVEL_LABEL in labels:
        label = labels[NAMESPACE_LEVEL_LABEL]
        return label if label in LEVELS else "restricted"
    return settings.defaultLevel


def effective_version(settings: PodSecurityCheck, namespace: dict) -> int | None:
    """The namespace's enforce-version (v1.N -> N; latest or unparsable -> None, the newest),
    else the bundle's defaultVersion."""
    labels = _labels(namespace)
    if settings.honorNamespaceLabel and NAMESPACE_VERSION_LABEL in labels:
        return psa.parse_version(labels[NAMESPACE_VERSION_LABEL])
    return psa.parse_version(settings.defaultVersion)


def on_openshift(settings: PodSecurityCheck, namespace: dict) -> bool:
    """Whether SCC admission applies: forced by the bundle, or (auto) the namespace carries the
    UID range that OpenShift's namespace controller writes on every project."""
    if settings.openshiftSCC == "auto":
        return scc.Allocations.of(namespace).uids is not None
    return settings.openshiftSCC == "always"


def check(context: CheckContext, settings: PodSecurityCheck) -> list[Finding]:
    """Each pod set through the SCCs (on OpenShift), then Pod Security at the namespace's level
    and version."""
    namespace = context.namespace
    level, version = effective_level(settings, namespace), effective_version(settings, namespace)
    sccs = [scc.SCCS[name] for name in scc.SCCS if name in settings.openshiftSCCs] \
        if on_openshift(settings, namespace) else []
    allocations = scc.Allocations.of(namespace)
    findings: list[Finding] = []
    for ps in context.job.with_pods:
        findings.extend(_pod_findings(ps, level, version, sccs, allocations))
    return findings


def _pod_findings(ps: PodSet, level: str, version: int | None, sccs: list[scc.Scc],
                  allocations: scc.Allocations) -> list[Finding]:
    """One finding per pod set, listing every violation with its field path, so a submitter
    sees the whole picture at once instead of fixing one field per submission."""
    pod = ps.pod
    by_standard: list[tuple[str, list[psa.Violation]]] = []
    if sccs:
        admitted = None
        refusals = []
        for constraint in sccs:  # the first SCC that validates the pod admits it, as filled in
            filled, refused = scc.admit(pod, constraint, allocations)
            if not refused:
                admitted = filled
                break
            refusals.append((constraint.name, refused))
        if admitted is None:
            by_standard += [(f"OpenShift SCC {name}", refused) for name, refused in refusals]
            pod = scc.admit(pod, sccs[0], allocations)[0]  # Pod Security judges it as the first SCC fills it in
        else:
            pod = admitted
    if level != "privileged":
        standard = f'Pod Security "{level}"' + (f" at {psa.version_name(version)}" if version is not None else "")
        by_standard.insert(0, (standard, [v for _, v in psa.evaluate(level, version, pod.get("metadata") or {},
                                                                        pod.get("spec") or {})]))
    reported: dict[str, str] = {}  # field path -> the standard that reported it first
    entries: list[psa.Violation] = []
    standards: list[str] = []
    for standard, violations in by_standard:
        for path, problem, fix in dict.fromkeys(violations):
            if reported.setdefault(path, standard) != standard:
                continue  # the same field, already named by an earlier standard
            entries.append((path, problem, fix))
            if standard not in standards:
                standards.append(standard)
    return _finding(ps, entries, standards) if entries else []


def _finding(ps: PodSet, entries: list[psa.Violation], standards: list[str]) -> list[Finding]:
    problems = "; ".join(f"{path} ({problem})" for path, problem, _ in entries)
    fixes = list(dict.fromkeys(fix for _, _, fix in entries))
    # A runtimePatch keeps only securityContext of these (policies/job/runtimepatch.py): other fields
    # (host namespaces, volumes, ...) come from the runtime alone.
    unpatchable = list(dict.fromkeys(path for path, _, _ in entries if "securityContext" not in path))
    where = (f"in a TrainJob through {PATCH_HINT}, or use a runtime that conforms" if not unpatchable else
             f"use a runtime that conforms ({', '.join(unpatchable)} cannot be changed by spec.runtimePatches; "
             "ask your admin)")
    return [Finding(
        f"{ps.name} pod violates {' and '.join(standards)}: {problems} [in {ps.source}]",
        f"{'; '.join(fixes)} — {where}",
    )]
