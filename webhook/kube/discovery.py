"""What the cluster runs, asked of the API server (policies/k8s/versions.py says what depends on it).

Three reads that every authenticated user may make (the ``system:discovery`` and
``system:public-info-viewer`` roles: no RBAC of ours): ``/version`` (the API server's version),
``/apis/kueue.x-k8s.io`` (the Kueue API versions served, 404 without Kueue) and the TrainJob's
schema from the OpenAPI v3 document of ``trainer.kubeflow.org/v1alpha1`` (Trainer's release, by
its shape). That document holds all of Trainer's CRDs (megabytes), so it is fetched again only
when the index ``/openapi/v3`` gives it another hash: a poll costs three small GETs.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from urllib.parse import parse_qsl, urlsplit

from trainjob_admission.policies.k8s import versions as cluster_versions
from trainjob_admission.policies.k8s.versions import KUEUE_GROUP, Versions

from .. import ServiceError
from .client import ApiError, ClusterUnreachable, KubeApi, api_client, call_json

log = logging.getLogger("trainjob_admission.discovery")


class UnsupportedCluster(ServiceError):
    """The cluster runs what the service cannot judge (Versions.unsupported says what)."""

TRAINER_OPENAPI = "apis/trainer.kubeflow.org/v1alpha1"  # its key in the /openapi/v3 index
TRAINJOB_GVK = {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"}
SOURCE = dict.fromkeys(("kubernetes", "trainer", "kueue"), "discovered")


class Discovery:
    """Reads the facts; remembers the Trainer schema's hash so an unchanged one is not fetched again."""

    def __init__(self, api: KubeApi):
        self.api = api
        self._trainer_hash: str | None = None
        self._trainer: tuple[int, int] | None = None

    def read(self) -> Versions:
        """The cluster's versions now; raises what the client raises when the API cannot answer."""
        kubernetes, git = cluster_versions.kubernetes_of(call_json(self.api, "GET", "/version"))
        return replace(cluster_versions.NEWEST, kubernetes=kubernetes, kubernetes_version=git,
                       trainer=self._read_trainer(), kueue_api=self._read_kueue(), source=dict(SOURCE))

    def _read_kueue(self) -> str | None:
        try:
            group = call_json(self.api, "GET", f"/apis/{KUEUE_GROUP}")
        except ApiError as exc:
            if exc.status == 404:
                return None  # Kueue is not installed
            raise
        return cluster_versions.kueue_api_of(str(v.get("version")) for v in group.get("versions") or []
                                             if isinstance(v, dict))

    def _read_trainer(self) -> tuple[int, int] | None:
        paths = call_json(self.api, "GET", "/openapi/v3").get("paths") or {}
        url = (paths.get(TRAINER_OPENAPI) or {}).get("serverRelativeURL")
        if not url:
            self._trainer_hash = self._trainer = None
            return None  # no TrainJob CRD
        parts = urlsplit(str(url))
        query = dict(parse_qsl(parts.query))
        if query.get("hash") is None or query.get("hash") != self._trainer_hash:
            document = call_json(self.api, "GET", parts.path, query=query)
            self._trainer = cluster_versions.trainer_of_schema(trainjob_spec(document))
            self._trainer_hash = query.get("hash")
            log.info("TrainJob schema read (%s): Trainer v%s", url, ".".join(map(str, self._trainer or ())) or "?")
        return self._trainer


def trainjob_spec(document: dict) -> dict:
    """The TrainJob's ``spec`` properties in an OpenAPI v3 document ({} when it has no TrainJob)."""
    for schema in ((document.get("components") or {}).get("schemas") or {}).values():
        kinds = schema.get("x-kubernetes-group-version-kind") if isinstance(schema, dict) else None
        if isinstance(kinds, list) and TRAINJOB_GVK in kinds:
            spec = (schema.get("properties") or {}).get("spec") or {}
            return spec.get("properties") or {}
    return {}


def discover(kubeconfig: str, context: str | None = None) -> Versions:
    """The versions of the cluster ``kubeconfig`` reaches, read once (``review --kubeconfig``)."""
    api = api_client(kubeconfig, context)
    try:
        return Discovery(api).read()
    except ApiError as exc:
        raise ClusterUnreachable(f"the Kubernetes API server at {api.describe()} refused to say its version, Kueue's "
                                 f"API versions or the TrainJob schema: {exc}", reason=str(exc)) from None
    finally:
        api.close()
