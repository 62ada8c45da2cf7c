"""Prometheus metrics, on a registry of our own so tests can run several servers in one process.

May import: policies.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from trainjob_admission.policies.capacity.reservations import Reservations
    from trainjob_admission.policies.k8s.versions import Versions

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # One count per answer, as its decision record says it: /mutate's are allow (or error), so
        # endpoint="validate" counts submissions (operation CREATE, UPDATE) and deletions (DELETE) once
        self.requests = Counter("trainjob_admission_requests",
                                "AdmissionReviews answered, by endpoint, decision, kind and operation",
                                ["endpoint", "decision", "kind", "operation"], registry=self.registry)
        self.rule_results = Counter("trainjob_admission_rule_results",
                                    "Rules that failed, by bundle, rule and effect (once per submission: /validate)",
                                    ["bundle", "rule", "effect"], registry=self.registry)
        self.latency = Histogram("trainjob_admission_request_duration_seconds", "Time to decide and log one review",
                                 ["endpoint"], registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.evaluations = Counter("trainjob_admission_evaluations",
                                   "Engine evaluations by where they ran: loop (a small request, within 5 ms of CPU) or "
                                   "worker (a large request, one that needed longer or waited on a permission check)",
                                   ["where"], registry=self.registry)
        self.bundle_reloads = Counter("trainjob_admission_bundle_reloads", "Bundle reloads by result",
                                      ["result"], registry=self.registry)
        self.bundles_active = Gauge("trainjob_admission_bundles_active", "Bundles in force", registry=self.registry)
        self.cert_expiry = Gauge("trainjob_admission_certificate_expiry_timestamp_seconds",
                                 "notAfter of the serving certificate (unix time)", registry=self.registry)
        self.injections = Counter("trainjob_admission_injections", "Objects injected by kind and result",
                                  ["kind", "result"], registry=self.registry)
        self.connections = Gauge("trainjob_admission_connections", "Connections open, by port (admission, probe)",
                                 ["port"], registry=self.registry)
        self.connections_closed = Counter(
            "trainjob_admission_connections_closed",
            "Connections the service closed to keep its bounds, by port and reason: refused (at a cap, with none "
            "that could be cut), cut (to make room at a cap), header-timeout (a request's headers too slow)",
            ["port", "reason"], registry=self.registry)

        self.decision_log_fsync = Histogram(
            "trainjob_admission_decision_log_fsync_seconds",
            "Time to flush the decision-log file to disk (with --log-fsync-interval 0 every answer waits for it)",
            registry=self.registry, buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))
        self.decision_log_write_failures = Counter(
            "trainjob_admission_decision_log_write_failures",
            "Records the decision-log file could not take (disk full, read-only); each such request got the "
            "failure mode's answer", registry=self.registry)
        # The chain's head: seq as a value, digest as the label of a one-series info metric (replaced,
        # not added to, as the head moves), so a scrape shows what the log ended with at that moment.
        self.head_seq = Gauge("trainjob_admission_decision_log_head_seq", "seq of the newest decision-log record",
                              registry=self.registry)
        self.head_digest = Gauge("trainjob_admission_decision_log_head_digest_info",
                                 "digest of the newest decision-log record (label), value 1",
                                 ["replica", "digest"], registry=self.registry)
        self.checkpoints = Counter("trainjob_admission_decision_log_checkpoints",
                                   "Signed decision-log checkpoints written, by result", ["result"],
                                   registry=self.registry)
        self.checkpoint_seq = Gauge("trainjob_admission_decision_log_checkpoint_seq",
                                    "seq of the last checkpoint written (head minus this: records not yet anchored)",
                                    registry=self.registry)

        self.cluster = Gauge("trainjob_admission_cluster_info",
                             "What the service judges the cluster as (value 1): the API server's version, Trainer's "
                             "release by its TrainJob schema, the Kueue API read, where they came from "
                             "(discovered, default) and whether that is in the tested matrix",
                             ["kubernetes", "trainer", "kueue", "source", "tested"], registry=self.registry)
        self.reserved = Gauge("trainjob_admission_reserved",
                              "Quota that admitted TrainJobs will take but whose pods do not exist yet, by namespace "
                              "and quota key (the largest over the namespace's quotas with that key)",
                              ["namespace", "resource"], registry=self.registry)

        self.reservation_writes = Counter(
            "trainjob_admission_reservation_writes",
            "Writes of a namespace's reservation ledger (Lease trainjob-admission-reservations), by result: written "
            "(an admitted job's entry), released (the entry of a job whose answer was not an admission after all), "
            "or conflict (another replica wrote it first: read again, decided again)", ["result"], registry=self.registry)
        self.reservation_failures = Counter(
            "trainjob_admission_reservation_failures",
            "Requests answered with the failure mode because a quota reservation could not be taken, by reason: "
            "unreachable, forbidden, invalid (a ledger this version cannot read), full, conflict (other replicas "
            "kept writing until the deadline), busy (too many decisions queued for the namespace), error",
            ["reason"], registry=self.registry)

    def set_cluster(self, versions: "Versions") -> None:
        """The one series of the info metric: what the service models the cluster as now."""
        self.cluster.clear()
        self.cluster.labels(versions.kubernetes_text, versions.trainer_text, versions.kueue_text,
                            versions.source.get("kubernetes", ""),
                            "false" if versions.outside_matrix() or versions.unsupported() else "true").set(1)

    def set_reserved(self, reservations: "Reservations", quotas: Callable[[str], list[dict]]) -> None:
        """The gauge as the reservations stand now (read at scrape time: no timer while idle)."""
        self.reserved.clear()
        for namespace in reservations.namespaces():
            largest: dict[str, int] = {}
            for (_, key), held in reservations.of(namespace, quotas(namespace)).items():
                largest[key] = max(largest.get(key, 0), held.total)
            for key, amount in largest.items():
                self.reserved.labels(namespace, key).set(amount)

    def set_head(self, replica: str, seq: int, digest: str) -> None:
        self.head_seq.set(seq)
        self.head_digest.clear()
        self.head_digest.labels(replica, digest).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
