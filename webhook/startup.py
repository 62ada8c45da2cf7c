"""``serve``: one start-up for both ways to run the server, and one signal handling.

Without a cluster the state is a fixed set of objects and the bundles are files. With one
(a kubeconfig or the pod's service account) the state and the PolicyBundles are watched, the
injector creates Secrets and NetworkPolicies, and reconcilers adopt or remove them, and each
running TrainJob gets a Warning Event at 80% of its deadline (webhook/loops/deadlinewarnings.py); the same
TrainJob watch and a watch of JobSet pods feed the quota reservations (webhook/loops/reservationfeed.py),
which the replicas share through a ledger Lease per reconciled namespace (webhook/admission/ledger.py);
/readyz waits for the first complete list of everything watched (the Secrets and NetworkPolicies under
our names included: admission refuses planted ones from them); the namespaces' isolating
NetworkPolicies and each job's own are made by webhook/inject/isolation.py. What the cluster runs is
discovered first and again every minute (webhook/kube/discovery.py): Kueue is watched at the API
version it serves, a Trainer older than v2.2 stops the start. This is the only composition
root: the one place that builds the server, the watches, the injector and the loops together.

May import: policies, certs, webhook.kube, webhook.decisionlog, webhook.metrics, webhook.inject,
webhook.loops, webhook.admission.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

from trainjob_admission.policies.capacity.reservations import Reservations, state_of
from trainjob_admission.policies.decide.engine import injection_plan, isolated_kinds
from trainjob_admission.policies.k8s.clusterstate import ClusterState
from trainjob_admission.policies.k8s.versions import Versions

from .admission.access import SubjectAccessReviews
from .admission.config import ServerConfig
from .admission.ledger import CALL_TIMEOUT as LEDGER_TIMEOUT, Ledger
from .admission.runtimesnapshots import SnapshotReader
from .admission.server import WebhookServer
from .inject.existing import ExistingObjects
from .inject.injector import Injector
from .inject.isolation import Isolation
from .inject.provenance import Provenance
from .inject.reconciler import SYSTEM_NAMESPACES, Reconciler
from .kube.aio import AsyncApi
from .kube.calls import Calls
from .kube.client import ApiError, ClusterUnreachable, KubeApi, api_client
from .kube.discovery import Discovery, UnsupportedCluster
from .kube.resources import POLICY_BUNDLES
from .kube.statewatch import kueue_watchers, state_watchers
from .kube.watch import Watcher
from .loops.auditscan import BackgroundAudit
from .loops.bundleset import BundleRegistry
from .loops.checkpointer import LeaseStore
from .loops.clusterbundles import ClusterBundles
from .loops.deadlinewarnings import DeadlineWarnings
from .loops.reservationfeed import JobSink, pod_watcher

log = logging.getLogger("trainjob_admission.startup")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "trainjob-admission"  # manifests/base: never reconciled, whatever it is called
DISCOVERY_INTERVAL = 60.0  # seconds between two looks at what the cluster runs (three small GETs)


@dataclass(frozen=True)
class ClusterOptions:
    kubeconfig: str | None  # None: the pod's service account
    bundle_selector: str | None = None
    namespaces: tuple[str, ...] = ()  # injection and reconciliation only there (default: all)
    provenance: Provenance = field(default_factory=Provenance.ephemeral)  # signs and checks what we inject
    checkpoint_namespace: str | None = None  # the decision log's checkpoint Leases (default: our own namespace)
    audit_interval: float | None = None  # seconds between background audits (webhook/loops/auditscan.py); None: off
    context: str | None = None  # the kubeconfig's context (serve --context); None: its current-context


class ClusterSync:
    """The watchers behind one server: cluster state, and PolicyBundles into ``registry``; Kueue's
    kinds at the version the cluster serves, once it is known (:meth:`watch_kueue`)."""

    def __init__(self, api: KubeApi, state: ClusterState, registry: BundleRegistry, *,
                 bundle_selector: str | None = None):
        self.api, self.state = api, state
        self.watchers = state_watchers(api, state) + [
            Watcher(api, POLICY_BUNDLES, ClusterBundles(api, registry), label_selector=bundle_selector)]
        self.kueue: list[Watcher] = []
        self.kueue_api: str | None = None
        self.discovered = False  # the first discovery set up Kueue's watches
        self._started = False

    def start(self) -> None:
        self._started = True
        for watcher in self.watchers + self.kueue:
            watcher.start()

    def watch_kueue(self, version: str | None) -> None:
        """Watch Kueue at ``version`` (None: not served), replacing the watches of another version:
        its objects are kept as v1beta2 has them whichever version is read (policies/k8s/kueueapi.py)."""
        if self.discovered and version == self.kueue_api:
            return
        old, self.kueue = self.kueue, kueue_watchers(self.api, self.state, version)
        self.kueue_api, self.discovered = version, True
        for watcher in old:
            watcher.close()
        if self._started:
            for watcher in self.kueue:
                watcher.start()
        log.info("Kueue: %s", f"watching kueue.x-k8s.io/{version}" if version else "not served (no queues)")

    def stop(self) -> None:
        watchers = self.watchers + self.kueue
        for watcher in watchers:
            watcher.close()
        for watcher in watchers:
            watcher.stop()

    @property
    def synced(self) -> bool:
        return self.discovered and all(w.synced.is_set() for w in self.watchers + self.kueue)

    async def wait_synced(self, ready: asyncio.Event | None = None) -> None:
        while not self.synced:
            await asyncio.sleep(0.1)
        gc.freeze()  # the first lists and the compiled PolicyBundles live long too (see WebhookServer.start)
        if ready is not None:
            ready.set()
        log.info("cluster state synced: %s", ", ".join(f"{w.resource.plural}@{w.resource_version}"
                                                       for w in self.watchers + self.kueue))


class ClusterVersions:
    """Keeps ``state.versions`` (and with them Kueue's watches) equal to what the cluster runs:
    read at start, then every ``interval`` seconds; a failed read keeps the last known."""

    def __init__(self, discovery: Discovery, state: ClusterState, sync: ClusterSync,
                 interval: float = DISCOVERY_INTERVAL):
        self.discovery, self.state, self.sync, self.interval = discovery, state, sync, interval

    async def first(self) -> None:
        """One read before the server starts: a cluster the service cannot judge stops the start
        (:class:`UnsupportedCluster`); an API that does not answer yet is read again by :meth:`run`."""
        try:
            found = await asyncio.to_thread(self.discovery.read)
        except (ClusterUnreachable, ApiError) as exc:
            log.warning("cannot read the cluster's versions yet (%s); not ready until they are", exc)
            return
        problem = found.unsupported()
        if problem:
            raise UnsupportedCluster(f"{problem} (docs/deploy.md \"Supported versions\")")
        self.apply(found)

    def apply(self, found: Versions) -> None:
        if not self.sync.discovered or found != self.state.versions:
            log.info("cluster: %s", found.describe())
            for line in found.outside_matrix():
                log.warning("%s (docs/deploy.md \"Supported versions\")", line)
            if found.unsupported():
                log.error("%s: not ready, /validate answers the failure mode", found.unsupported())
        self.state.versions = found
        self.sync.watch_kueue(found.kueue_api)

    async def run(self) -> None:
        delay = 1.0
        if self.sync.discovered:
            await asyncio.sleep(self.interval)
        while True:
            try:
                found = await asyncio.to_thread(self.discovery.read)
            except Exception as exc:  # noqa: BLE001 - an API that does not answer now: keep the last known, retry
                log.warning("cannot read the cluster's versions (%s); keeping %s", exc, self.state.versions.describe())
                await asyncio.sleep(delay if not self.sync.discovered else self.interval)
                delay = min(delay * 2, 30.0)
                continue
            self.apply(found)
            await asyncio.sleep(self.interval)


async def serve(config: ServerConfig, *, objects: list[dict] | None = None, cluster: ClusterOptions | None = None) -> None:
    """Serve until SIGINT or SIGTERM: with ``cluster`` backed by the API, else by ``objects``.
    Raises :class:`~webhook.kube.client.KubeconfigError` before listening when the cluster's
    configuration cannot be loaded."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as cleanup:
        if cluster is None:
            server = WebhookServer(config, state_of(objects or []))
            cleanup.push_async_callback(server.stop)
            await server.start()
        else:
            await _start_with_cluster(config, cluster, cleanup)
        await stop.wait()
        log.info("stopping")


async def _start_with_cluster(config: ServerConfig, options: ClusterOptions,
                              cleanup: contextlib.AsyncExitStack) -> None:
    api = api_client(options.kubeconfig, options.context)
    cleanup.callback(api.close)
    cleanup.push_async_callback(AsyncApi.of(api).close)
    state, ready = ClusterState(), asyncio.Event()
    state.reservations = Reservations(state)
    jobs = JobSink(state.reservations)
    own = own_namespace()
    existing = ExistingObjects(api, options.namespaces or None)
    # both read the server's bundles when called (the server, made below, is their closure's)
    isolation = Isolation(api, options.provenance, existing,
                          planner=lambda job: injection_plan(job, list(server.registry.active), state),
                          wanted=lambda: _isolated_namespaces(server.registry, state, existing, ready, own),
                          lull=lambda quiet, limit: server.in_flight.lull(quiet, limit))
    injector = Injector(api, options.provenance, namespaces=options.namespaces or None, existing=existing,
                        isolation=isolation)
    checkpoints = (LeaseStore(api, options.checkpoint_namespace or own, config.replica)
                   if config.checkpoint_key else None)
    # Quota reservations in each reconciled namespace's ledger Lease (webhook/admission/ledger.py).
    ledger = Ledger(Calls(api, LEDGER_TIMEOUT), config.replica, options.namespaces or None)
    server = WebhookServer(config, state, injector=injector, state_ready=ready, checkpoint_store=checkpoints,
                           snapshots=SnapshotReader(api, versions=lambda: state.versions),
                           access=SubjectAccessReviews(api), ledger=ledger)
    sync = ClusterSync(api, state, server.registry, bundle_selector=options.bundle_selector)
    # admission reads what exists under our names from these: ready only once they have listed
    sync.watchers += [pod_watcher(api, state.reservations), *existing.watchers]
    versions = ClusterVersions(Discovery(api), state, sync)
    await versions.first()  # before the bundles compile: their CEL is checked at the cluster's level
    log.info("reading state and PolicyBundles%s from %s",
             f" ({options.bundle_selector})" if options.bundle_selector else "", api.describe())
    sync.start()
    cleanup.push_async_callback(asyncio.to_thread, sync.stop)
    cleanup.push_async_callback(server.stop)
    await server.start()
    reconcilers = [Reconciler(api, options.provenance, namespace=ns, own_namespace=own, lull=server.in_flight.lull,
                              isolation=isolation)
                   for ns in sorted(set(options.namespaces)) or [None]]
    tasks = [asyncio.create_task(_synced(sync, jobs, ready), name="state sync"),
             asyncio.create_task(versions.run(), name="cluster versions"),
             asyncio.create_task(DeadlineWarnings(api, also=(jobs,)).run(), name="deadline warnings"),
             asyncio.create_task(_when_ready(ready, isolation.run), name="network isolation")] + [
        asyncio.create_task(_when_ready(ready, r.run), name=f"reconciler ({r.namespace or 'all namespaces'})")
        for r in reconcilers]
    if options.audit_interval:
        scan = BackgroundAudit(api, server.registry, state, options.audit_interval)
        tasks.append(asyncio.create_task(_when_ready(ready, scan.run), name="background audit"))
    for task in tasks:
        task.add_done_callback(_report_crash)
        cleanup.push_async_callback(_cancel, task)


async def _synced(sync: ClusterSync, jobs: JobSink, ready: asyncio.Event) -> None:
    """Ready once the state and the TrainJobs (reservations) are listed: a restarted replica must
    not admit a job that other jobs' reservations leave no room for."""
    await sync.wait_synced()
    while not jobs.synced.is_set():
        await asyncio.sleep(0.1)
    ready.set()


async def _when_ready(ready: asyncio.Event, run: Callable[[], Awaitable[None]]) -> None:
    """``run`` once the state is synced: a reconciler's first lists (every job and injected
    object) would otherwise hold up /readyz after a restart, and nothing it does is urgent."""
    await ready.wait()
    await run()


def _isolated_namespaces(registry: BundleRegistry, state: ClusterState, existing: ExistingObjects,
                         ready: asyncio.Event, own: str) -> dict[str, list[str]] | None:
    """Namespace -> the kinds of job the active bundles isolate there (policies/decide/engine.py,
    isolated_kinds), among those the service injects into; None until the state is synced and a
    bundle is active (nothing is created or deleted on a partial view)."""
    active = list(registry.active)
    if not ready.is_set() or not active:
        return None
    protected = SYSTEM_NAMESPACES | {own}
    return {name: kinds for name, namespace in list(state.namespaces.items())
            if name not in protected and existing.covers(name) and (kinds := isolated_kinds(active, name, namespace))}


def own_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The namespace of the pod we run in (its service account's), else the manifests' default."""
    try:
        return path.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _report_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r; the server keeps answering without it", task.get_name(), task.exception())
