"""The cluster state the engine decides with, from the API: watched for the server, read once
for ``review --kubeconfig``."""
from __future__ import annotations

from trainjob_admission.policies.k8s.clusterstate import PARAMS_KIND, PARAMS_SELECTOR, ClusterState
from trainjob_admission.policies.k8s.versions import Versions

from .client import ApiError, ClusterUnreachable, KubeApi, api_client, call_json, clean, list_all
from .discovery import Discovery
from .resources import (
    CLUSTER_TRAINING_RUNTIMES, CONFIG_MAPS, FIELD_SELECTORS, KUEUE_PLURALS, LIMIT_RANGES, NAMESPACES, NODES, PODS,
    POLICY_EXCEPTIONS, PRIORITY_CLASSES, RESOURCE_QUOTAS, RUNTIME_CLASSES, STATE_RESOURCES, STORAGE_CLASSES,
    TRAINING_RUNTIMES, Resource, kueue_resources,
)
from .watch import Watcher


class StateSink:
    """Feeds one kind of :class:`ClusterState`."""

    def __init__(self, state: ClusterState, kind: str):
        self.state, self.kind = state, kind

    def replace(self, objects: list[dict]) -> None:
        self.state.replace(self.kind, objects)

    def apply(self, event: str, obj: dict) -> None:
        if event == "DELETED":
            self.state.delete(obj)
        else:
            self.state.upsert(obj)


def state_watchers(api: KubeApi, state: ClusterState) -> list[Watcher]:
    """A watch per kind evaluate reads, but Kueue's (:func:`kueue_watchers`: their version is
    discovered first); of ConfigMaps only those labelled as bundles' params."""
    return [Watcher(api, resource, StateSink(state, resource.kind), field_selector=FIELD_SELECTORS.get(resource))
            for resource in STATE_RESOURCES] + [
        Watcher(api, CONFIG_MAPS, StateSink(state, PARAMS_KIND), label_selector=PARAMS_SELECTOR)]


def kueue_watchers(api: KubeApi, state: ClusterState, version: str | None) -> list[Watcher]:
    """A watch per Kueue kind at the served ``version``; none when Kueue is not served, whose kinds
    are then known to be empty."""
    if version is None:
        for kind in KUEUE_PLURALS:
            state.replace(kind, [])
        return []
    return [Watcher(api, resource, StateSink(state, resource.kind)) for resource in kueue_resources(version)]


def read_state(kubeconfig: str, namespace: str, context: str | None = None,
               versions: Versions | None = None) -> ClusterState:
    """The cluster's versions (webhook/kube/discovery.py), the runtimes, the Namespace, its
    ResourceQuotas and LimitRanges, the Runtime-, Priority- and StorageClasses, read once (each
    call with a timeout); the Nodes and the pods bound to them when the user may list them (a
    namespace user usually may not: the schedulability pre-check is then left out, and ``review
    --strict`` says so). ``versions``: already discovered (else read here)."""
    api = api_client(kubeconfig, context)
    try:
        versions = versions or Discovery(api).read()
        objects: list[dict] = []
        for resource, ns in ((CLUSTER_TRAINING_RUNTIMES, None), (TRAINING_RUNTIMES, namespace), (RESOURCE_QUOTAS, namespace),
                             (LIMIT_RANGES, namespace), (RUNTIME_CLASSES, None), (PRIORITY_CLASSES, None),
                             (STORAGE_CLASSES, None)):
            objects += _listed(api, resource, ns, absent=(404,)) or []  # 404: the Trainer CRDs (or node.k8s.io) are not served
        nodes = _listed(api, NODES, None, absent=(403, 404)) or []
        pods = _listed(api, PODS, None, absent=(403, 404)) if nodes else None
        # the namespace's PolicyExceptions: none without the CRD, or when the user may not list them
        objects += _listed(api, POLICY_EXCEPTIONS, namespace, absent=(403, 404)) or []
        # the namespace's params ConfigMaps (paramRef), when the user may list ConfigMaps there
        objects += _listed(api, CONFIG_MAPS, namespace, absent=(403,), label_selector=PARAMS_SELECTOR) or []
        # Kueue's: none without its CRDs (404), not known when the user may not list them (403)
        kueue = {r.kind: _listed(api, r, namespace if r.kind == "LocalQueue" else None, absent=(403,), empty=(404,))
                 for r in kueue_resources(versions.kueue_api)} if versions.kueue_api else dict.fromkeys(KUEUE_PLURALS, [])
        try:
            objects.append(clean(NAMESPACES, call_json(api, "GET", NAMESPACES.path(name=namespace))))
        except ApiError as exc:
            if exc.status != 404:
                raise
    except ApiError as exc:
        raise ClusterUnreachable(
            f"the Kubernetes API server at {api.describe()} refused a read: {exc}. "
            "Use a kubeconfig whose user may list runtimes, resourcequotas, limitranges, runtimeclasses, "
            "priorityclasses and storageclasses (and nodes and pods, for the schedulability pre-check) and get "
            "the namespace, "
            "or export them with kubectl and pass --cluster-state") from None
    finally:
        api.close()
    state = ClusterState.from_objects(objects + nodes)
    state.versions = versions
    if pods is not None:
        state.replace("Pod", pods)  # known, even when none: the nodes' free capacity is all of it
    for kind, items in kueue.items():
        if items is not None:
            state.replace(kind, items)
    return state


def _listed(api: KubeApi, resource: Resource, namespace: str | None, absent: tuple[int, ...],
            label_selector: str | None = None, empty: tuple[int, ...] = ()) -> list[dict] | None:
    """Every ``resource`` object; None (not known) when the API answers with a status in
    ``absent``, [] (none exist) with one in ``empty``."""
    try:
        return list_all(api, resource, namespace=namespace, label_selector=label_selector,
                        field_selector=FIELD_SELECTORS.get(resource))[0]
    except ApiError as exc:
        if exc.status in empty:
            return []
        if exc.status not in absent:
            raise
        return None
