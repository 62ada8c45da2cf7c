"""PolicyBundle custom resources -> the bundle registry, with an honest status written back.

Each object is the registry source ``cluster:<name>``. A generation that does not compile leaves
the last good generation enforced, and the status says so: ``compiled`` is about the newest
generation (``observedGeneration``), ``active``/``activeGeneration``/``digest`` about the one
being enforced, ``errors`` lists file/rule/position problems, and the Ready condition is True only
when the newest generation is the enforced one.

With several replicas each writes only when its own view changes, so two replicas that briefly
disagree (one restarted while a broken generation is current and has no last good version) do
not overwrite each other in a loop; the last change wins.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from trainjob_admission.policies.bundle.compile import Bundle, BundleError, compile_document
from trainjob_admission.policies.k8s.versions import NEWEST, Versions

from ..kube.client import ApiError, ClusterUnreachable, KubeApi, api_client, call_json, list_all
from ..kube.resources import POLICY_BUNDLES
from .bundleset import CLUSTER_SOURCE_PREFIX, BundleRegistry

log = logging.getLogger("trainjob_admission.clusterbundles")

MAX_ERRORS = 20  # in status; the count is always complete
PATCH_ATTEMPTS = 3


@dataclass(frozen=True)
class Seen:
    """The newest generation we compiled."""

    uid: str
    generation: int
    compiled: bool
    errors: tuple[str, ...]


@dataclass(frozen=True)
class Enforced:
    """The last generation that compiled: what the registry enforces for this object."""

    generation: int
    version: str
    digest: str


def source_name(name: str) -> str:
    return CLUSTER_SOURCE_PREFIX + name


def bundle_document(obj: dict) -> dict:
    """The bundle a PolicyBundle object holds, with its name and labels as written (not the
    server's uid, annotations, ...): its digest then equals the one `policy lint` prints for the
    file that was applied."""
    meta = obj["metadata"]
    written = {key: meta[key] for key in ("name", "labels") if meta.get(key)}
    return {key: obj.get(key) for key in ("apiVersion", "kind", "spec")} | {"metadata": written}


@dataclass(frozen=True)
class ReadBundles:
    bundles: tuple[Bundle, ...]  # in force, in evaluation order
    problems: tuple[str, ...]  # PolicyBundles that do not compile
    server: str


def read_bundles(kubeconfig: str, specs: list[str], *, label_selector: str | None = None,
                 context: str | None = None, versions: Versions = NEWEST) -> ReadBundles:
    """Read once what ``serve --kubeconfig`` with the same ``--bundle`` and ``--bundle-selector``
    would enforce: the bundle files, then every PolicyBundle compiled as the watch compiles it
    (for the cluster's ``versions``). A PolicyBundle that does not compile is left out and named
    (a running service keeps its last good generation, which only it knows)."""
    registry = BundleRegistry(list(specs), versions=lambda: versions)
    registry.poll()
    api = api_client(kubeconfig, context)
    try:
        try:
            objects = list_all(api, POLICY_BUNDLES, label_selector=label_selector)[0]
        except ApiError as exc:
            if exc.status != 404:
                raise ClusterUnreachable(
                    f"the Kubernetes API server at {api.describe()} refused to list PolicyBundles: {exc}. Use a "
                    "kubeconfig whose user may list policybundles.policy.trainjob-admission.io, or pass the "
                    "bundle files with --bundle and the state with --cluster-state") from None
            objects = []  # the CRD is not installed: no PolicyBundles
        server = api.describe()
    finally:
        api.close()
    problems = []
    for obj in objects:
        meta, source = obj["metadata"], source_name(obj["metadata"]["name"])
        try:
            compile_document(bundle_document(obj), source, versions=versions)  # checked first: the registry would log it as a reload
        except BundleError as exc:
            active = (obj.get("status") or {}).get("activeGeneration")
            problems.append(f"PolicyBundle {meta['name']} generation {meta.get('generation')} does not compile "
                            f"({len(exc.problems)} error(s), the first: {exc.problems[0] if exc.problems else exc}); "
                            "decided without it" + (f" (the service still enforces generation {active})" if active else ""))
            continue
        registry.update_documents(source, [bundle_document(obj)])
    return ReadBundles(registry.active, tuple(problems), server)


class ClusterBundles:
    """A watch sink (see kube.watch.Watcher): compiles each new generation into ``registry`` and
    patches ``/status``."""

    def __init__(self, api: KubeApi, registry: BundleRegistry):
        self.api, self.registry = api, registry
        self.seen: dict[str, Seen] = {}
        self.enforced: dict[str, Enforced] = {}
        self.written: dict[str, dict] = {}  # the status we last wrote, without timestamps

    # --- sink -----------------------------------------------------------------------------------
    def replace(self, objects: list[dict]) -> None:
        names = {obj["metadata"]["name"] for obj in objects}
        for name in list(self.seen):
            if name not in names:
                self._forget(name)
        for obj in objects:
            self.apply("ADDED", obj)

    def apply(self, event: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        if event == "DELETED":
            self._forget(name)
            return
        try:
            self._compile(obj)
            self._write_status(obj)
        except Exception:  # noqa: BLE001 - raising would stop the watch, which would get this event again, forever
            log.exception("PolicyBundle %s could not be processed; the last good bundles stay active and the watch "
                          "goes on", name)

    # --- compile --------------------------------------------------------------------------------
    def _forget(self, name: str) -> None:
        self.registry.remove_source(source_name(name))
        for known in (self.seen, self.enforced, self.written):
            known.pop(name, None)
        log.info("PolicyBundle %s removed", name)

    def _compile(self, obj: dict) -> None:
        meta = obj["metadata"]
        name, uid, generation = meta["name"], meta.get("uid", ""), int(meta.get("generation") or 0)
        known = self.seen.get(name)
        if known is not None and (known.uid, known.generation) == (uid, generation):
            return  # a status write or a label change: nothing to compile
        if known is not None and known.uid != uid:
            self._forget(name)  # deleted and created again while we were not watching
        source = source_name(name)
        compiled = self.registry.update_documents(source, [bundle_document(obj)])
        if compiled.compiled:
            bundle = compiled.bundles[0]
            self.enforced[name] = Enforced(generation, bundle.version, bundle.digest)
            self.seen[name] = Seen(uid, generation, True, ())
            log.info("PolicyBundle %s generation %d enforced (version %s, %s)", name, generation, bundle.version, bundle.digest)
        else:
            self.seen[name] = Seen(uid, generation, False, tuple(str(p) for p in compiled.problems))

    # --- status ---------------------------------------------------------------------------------
    def desired_status(self, obj: dict) -> dict:
        name = obj["metadata"]["name"]
        seen, enforced = self.seen[name], self.enforced.get(name)
        winner = next((b for b in self.registry.active if b.name == name), None)
        shadowed = enforced is not None and winner is not None and winner.source != source_name(name)
        status: dict = {"observedGeneration": seen.generation, "compiled": seen.compiled,
                        "active": enforced is not None and not shadowed,
                        "errorCount": len(seen.errors), "errors": list(seen.errors[:MAX_ERRORS])}
        if enforced:
            status |= {"activeGeneration": enforced.generation, "activeVersion": enforced.version,
                       "digest": enforced.digest}
        fix = "fix the errors listed in status.errors and apply again"
        if seen.compiled:
            compiled = ("True", "Compiled", f"generation {seen.generation} compiled")
        else:
            compiled = ("False", "CompileError", f"generation {seen.generation} has {len(seen.errors)} error(s): "
                                                 f"{seen.errors[0] if seen.errors else 'unknown'}")
        if shadowed:
            ready = ("False", "Shadowed", f"bundle name {name} is also defined by {winner.source}, which takes "
                                          "precedence; rename one of them")
        elif enforced and enforced.generation == seen.generation:
            ready = ("True", "Enforced", f"generation {seen.generation} (version {enforced.version}) is enforced")
        elif enforced:
            ready = ("False", "LastGoodEnforced", f"generation {seen.generation} did not compile; generation "
                                                  f"{enforced.generation} (version {enforced.version}) is still "
                                                  f"enforced; {fix}")
        else:
            ready = ("False", "NotEnforced", f"generation {seen.generation} did not compile and no earlier "
                                             f"generation did; nothing of this bundle is enforced; {fix}")
        status["conditions"] = [
            {"type": kind, "status": value, "reason": reason, "message": message, "observedGeneration": seen.generation}
            for kind, (value, reason, message) in (("Ready", ready), ("Compiled", compiled))]
        return status

    def _write_status(self, obj: dict) -> None:
        name = obj["metadata"]["name"]
        current = obj.get("status") or {}
        desired = _with_transition_times(self.desired_status(obj), current)
        if desired == current or _untimed(desired) == self.written.get(name):
            return
        body = {"status": desired | {key: None for key in current if key not in desired}}
        for attempt in range(1, PATCH_ATTEMPTS + 1):
            try:
                call_json(self.api, "PATCH", POLICY_BUNDLES.path(name=name, subresource="status"), body=body,
                          content_type="application/merge-patch+json")
                self.written[name] = _untimed(desired)
                return
            except ApiError as exc:
                if exc.status == 404:
                    return  # deleted meanwhile; the DELETED event follows
                problem: Exception = exc
            except ClusterUnreachable as exc:
                problem = exc
            log.warning("cannot write the status of PolicyBundle %s (attempt %d of %d): %s",
                        name, attempt, PATCH_ATTEMPTS, problem)
            time.sleep(0.5 * attempt)


def _untimed(status: dict) -> dict:
    return status | {"conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                                    for c in status.get("conditions", [])]}


def _with_transition_times(status: dict, current: dict) -> dict:
    """lastTransitionTime changes only when a condition's status does."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    before = {c.get("type"): c for c in current.get("conditions") or []}
    for condition in status["conditions"]:
        old = before.get(condition["type"])
        same = old is not None and old.get("status") == condition["status"] and old.get("lastTransitionTime")
        condition["lastTransitionTime"] = old["lastTransitionTime"] if same else now
    return status
