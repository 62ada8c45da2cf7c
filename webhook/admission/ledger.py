"""A namespace's reservation ledger: the entries of the jobs admitted there whose pods do not
exist yet (policies/capacity/reservations.py Entry), in one Lease every replica reads and writes
with optimistic concurrency, so the API server (etcd) arbitrates between replicas as it does for
ResourceQuota admission: a write names the resourceVersion it was decided against, and a second
writer of that version gets 409 and decides again with what the first one wrote.

The Lease (coordination.k8s.io/v1) ``trainjob-admission-reservations`` in the job's namespace
holds the entries as JSON in one annotation; its spec says which replica wrote last and when. Why a
Lease and not a ConfigMap: docs/architecture.md "Decisions". Anyone who may write the Lease may
write nonsense: it is read strictly (an unreadable ledger is the failure mode, never a guess),
an entry can only take room, and one that claims to last longer than an entry can is ignored.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from trainjob_admission.policies.capacity.reservations import Entry

from .. import ServiceError
from ..kube import deadline
from ..kube.calls import Calls
from ..kube.client import ApiError, ClusterUnreachable
from ..kube.resources import LEASES

NAME = "trainjob-admission-reservations"
ANNOTATION = "trainjob-admission.io/reservations"
FORMAT = 1  # the annotation's {"format": 1, "entries": [...]}; a replica reads no other
MAX_ENTRIES = 512  # ~100 KiB of the 256 KiB the API server allows a Lease's annotations
CALL_TIMEOUT = 5.0  # as the injector's: an API server busy with a burst answers in seconds; the deadline bounds it too
# The calls a ledger makes, in each namespace the service reconciles: the injector ClusterRole in
# manifests/base/rbac.yaml grants exactly these (get and update on this name only).
LEDGER_VERBS = ("get", "create", "update")
MANAGED_BY = {"app.kubernetes.io/managed-by": "trainjob-admission"}


class LedgerError(ServiceError):
    """The ledger could not be read or written: the request gets the failure mode. ``reason`` is a
    metric label (unreachable, forbidden, invalid, full, error)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Copy:
    """The ledger of one namespace as last read or written: the Lease (None: there is none yet)
    and its entries."""

    namespace: str
    lease: dict | None
    entries: tuple[Entry, ...]

    @property
    def version(self) -> str:
        return str(((self.lease or {}).get("metadata") or {}).get("resourceVersion", ""))

    def describe(self) -> str:
        return f"Lease {self.namespace}/{NAME}"


class Ledger:
    """Reads and writes the ledgers of the namespaces it ``serves`` (None: all), as ``replica``."""

    def __init__(self, calls: Calls, replica: str, namespaces: Iterable[str] | None = None):
        self.calls, self.replica = calls, replica
        self.namespaces = frozenset(namespaces) if namespaces is not None else None

    def serves(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    async def read(self, namespace: str) -> Copy:
        lease = await self._api(self.calls.get(LEASES, namespace, NAME), f"read Lease {namespace}/{NAME}")
        return Copy(namespace, lease, parse(lease, namespace))

    async def write(self, copy: Copy, entries: list[Entry]) -> Copy | None:
        """``entries`` as the ledger's whole content, if it is still ``copy``: the new copy, or None
        when another replica wrote first (read it again and decide again)."""
        if len(entries) > MAX_ENTRIES:
            raise LedgerError("full", f"{copy.describe()} holds {len(entries)} jobs whose pods do not exist yet, "
                                      f"more than the {MAX_ENTRIES} it keeps")
        lease = render(copy, entries, self.replica)
        what = f"write {copy.describe()}"
        stored = await self._api(self.calls.replace(LEASES, lease) if copy.lease is not None
                                 else self.calls.create(LEASES, copy.namespace, lease), what)
        return None if stored is None else Copy(copy.namespace, stored, tuple(entries))

    @staticmethod
    async def _api(call, what: str):
        try:
            return await call
        except ApiError as exc:
            reason = "forbidden" if exc.status == 403 else "error"
            raise LedgerError(reason, f"could not {what}: HTTP {exc.status} {exc.message[:200]}") from None
        except deadline.DeadlineExceeded:
            raise LedgerError("unreachable", f"could not {what} before the request's deadline") from None
        except (ClusterUnreachable, TimeoutError) as exc:
            raise LedgerError("unreachable", f"could not {what}: the API server did not answer "
                                             f"({getattr(exc, 'reason', '') or 'timed out'})") from None


def parse(lease: dict | None, namespace: str) -> tuple[Entry, ...]:
    """The entries a Lease holds; LedgerError for anything this version did not write."""
    if lease is None:
        return ()
    text = ((lease.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if text is None:
        return ()
    where = f"Lease {namespace}/{NAME} annotation {ANNOTATION}"
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        raise LedgerError("invalid", f"{where} is not JSON") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise LedgerError("invalid", f"{where} is not format {FORMAT} (written by another version of "
                                     "trainjob-admission, or by hand)")
    if len(data["entries"]) > MAX_ENTRIES:
        raise LedgerError("invalid", f"{where} holds more than {MAX_ENTRIES} entries")
    try:
        return tuple(Entry.from_json(e) for e in data["entries"])
    except ValueError as exc:
        raise LedgerError("invalid", f"{where}: {exc}") from None


def render(copy: Copy, entries: list[Entry], replica: str) -> dict:
    """The Lease holding ``entries``, as ``copy``'s version (its resourceVersion is the write's
    precondition) or new; what else it holds (an admin's labels) is kept."""
    lease = json.loads(json.dumps(copy.lease)) if copy.lease is not None else {
        "apiVersion": LEASES.api_version, "kind": LEASES.kind,
        "metadata": {"name": NAME, "namespace": copy.namespace, "labels": dict(MANAGED_BY)}}
    meta = lease.setdefault("metadata", {})
    meta.setdefault("annotations", {})[ANNOTATION] = json.dumps(
        {"format": FORMAT, "entries": [e.as_json() for e in entries]}, separators=(",", ":"), sort_keys=True)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease["spec"] = {**(lease.get("spec") or {}), "holderIdentity": replica[:253], "renewTime": now}
    return lease
