"""The background audit's I/O (policies/offline/audit.py decides): the jobs that exist, read from the API,
and the PolicyReports written back, one per namespace named ``trainjob-admission``."""
from __future__ import annotations

from typing import Callable, TypeVar

from trainjob_admission.policies.offline.audit import MANAGED_BY, REPORT_NAME

from .. import ServiceError
from ..kube.client import ApiError, KubeApi, api_client, call_json, list_all
from ..kube.resources import JOBS, POLICY_REPORTS

T = TypeVar("T")
REPORT_SELECTOR = ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())


class ReportsNotServed(ServiceError):
    """The API server does not serve wgpolicyk8s.io/v1alpha2 PolicyReports (no CRD)."""


def using(kubeconfig: str, context: str | None, work: Callable[[KubeApi], T]) -> T:
    """``work`` with a client for the user's kubeconfig and --context (the CLI), closed after."""
    api = api_client(kubeconfig, context)
    try:
        return work(api)
    finally:
        api.close()


def read_jobs(api: KubeApi, namespace: str | None) -> list[dict]:
    """Every TrainJob and MPIJob in ``namespace`` (None: all); a kind whose CRD is not served has none."""
    jobs: list[dict] = []
    for resource in JOBS.values():
        try:
            jobs += list_all(api, resource, namespace=namespace)[0]
        except ApiError as exc:
            if exc.status != 404:
                raise
    return jobs


def write_reports(api: KubeApi, reports: list[dict], namespace: str | None) -> list[str]:
    """Create or replace each report (unless it says the same), and delete ours in ``namespace`` (None: all) that no longer
    have a job to report on. Returns "namespace/name" of each report deleted."""
    written = set()
    for report in reports:
        ns = report["metadata"]["namespace"]
        written.add(ns)
        path = POLICY_REPORTS.path(ns, REPORT_NAME)
        try:
            current = call_json(api, "GET", path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            _create(api, ns, report)
            continue
        if _untimed(current) == _untimed(report):
            continue  # no write when nothing changed (several replicas scan alike)
        body = dict(report, metadata=dict(report["metadata"],
                                          resourceVersion=current["metadata"]["resourceVersion"]))
        call_json(api, "PUT", path, body=body)
    deleted = []
    try:
        ours = list_all(api, POLICY_REPORTS, namespace=namespace, label_selector=REPORT_SELECTOR)[0]
    except ApiError as exc:
        if exc.status != 404:
            raise
        ours = []  # not served: there is no report to delete
    for stale in ours:
        meta = stale["metadata"]
        if meta["name"] == REPORT_NAME and meta["namespace"] not in written:
            call_json(api, "DELETE", POLICY_REPORTS.path(meta["namespace"], REPORT_NAME))
            deleted.append(f"{meta['namespace']}/{REPORT_NAME}")
    return deleted


def _untimed(report: dict) -> tuple:
    """What a report says, without the time of the scan that said it."""
    meta = report.get("metadata") or {}
    results = [{k: v for k, v in r.items() if k != "timestamp"} for r in report.get("results") or []]
    return meta.get("labels"), meta.get("annotations"), report.get("summary"), results


def _create(api: KubeApi, namespace: str, report: dict) -> None:
    try:
        call_json(api, "POST", POLICY_REPORTS.path(namespace), body=report)
    except ApiError as exc:
        if exc.status == 404 and _not_served(api):  # else its namespace is gone
            raise ReportsNotServed(
                f"the API server does not serve {POLICY_REPORTS.api_version} PolicyReports: install their CRD "
                "(wgpolicyk8s.io_policyreports.yaml, shipped by Kyverno and Policy Reporter) or leave out "
                "--write-reports") from None
        raise


def _not_served(api: KubeApi) -> bool:
    try:
        call_json(api, "GET", f"/apis/{POLICY_REPORTS.api_version}")
    except ApiError as exc:
        return exc.status == 404
    return False
