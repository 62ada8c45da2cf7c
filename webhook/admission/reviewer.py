"""One AdmissionReview from bytes to response: parse, decide (bounded in time), log, answer.

The HTTP layer stays thin: it hands the body here and writes back what comes out. Every
request, including the malformed and the failed, is logged before the response is returned.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

from trainjob_admission.policies.cel.environment import Abandoned, Budget
from trainjob_admission.policies.decide import injections
from trainjob_admission.policies.decide.decision import Decision, Result
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.decide.stored import evaluate_stored
from trainjob_admission.policies.k8s.clusterstate import ClusterState

from ..decisionlog import DecisionLog, DecisionLogError
from ..inject import early
from ..inject.early import EarlyInjections
from ..kube import deadline
from ..loops.bundleset import BundleRegistry
from ..metrics import Metrics
from . import protocol
from .access import SubjectAccessReviews
from .callers import UNKNOWN, AddressLimit, Caller
from .config import ReviewerConfig
from .ledger import Ledger, LedgerError
from .quotagate import Hold, QuotaGate
from .record import DecisionRecord, Unrecorded

log = logging.getLogger("trainjob_admission.reviewer")

# A request body up to this size is parsed, and its decision tried, on the event loop (see _evaluate).
INLINE_PARSE_BYTES = 64 * 1024
INLINE_SLICE = 0.005  # seconds of CPU an evaluation may take on the event loop before it starts over on a worker thread
# The job's runtime snapshot ConfigMap on an UPDATE, or None (webhook/admission/runtimesnapshots.py); never raises.
SnapshotFn = Callable[[AdmissionInput], Awaitable["dict | None"]]
# The caller of the request being reviewed, for its record (set by review() and refuse()).
_caller: contextvars.ContextVar[Caller] = contextvars.ContextVar("caller", default=UNKNOWN)
# The (bundle, rule) of the denial for an existing object the injector refused to use.
EXISTING_OBJECTS = ("trainjob-admission", "existing-objects")


@dataclass
class Submission:
    """What /validate learns of a submission, for withdrawing what it took when the answer is not
    an admission: the admission id and owner (webhook/inject/early.py), the injection records, the
    quota reservation (webhook/admission/quotagate.py)."""

    admission_id: str = ""
    owner: early.Owner = ("", "", "", "", "")
    injected: list[dict] | None = None
    reservation: Hold | None = None


class Reviewer:
    def __init__(self, registry: BundleRegistry, state: ClusterState, decision_log: DecisionLog, metrics: Metrics,
                 config: ReviewerConfig, injector: early.Injector | None = None,
                 policy_gaps: Callable[[], list[str]] = list, snapshots: SnapshotFn | None = None,
                 access: SubjectAccessReviews | None = None, ledger: Ledger | None = None, replica: str = ""):
        """``policy_gaps``: what is missing to decide by policy (no bundle, no cluster sync yet);
        while it names anything, no job is judged (see :meth:`_no_policy`). ``snapshots``: reads
        an updated job's runtime snapshot, which ``state`` does not watch. ``access``: answers the
        CEL authorizer's checks (webhook/admission/access.py); None: they fail, as offline.
        ``ledger``: the namespaces' reservation ledgers (None: this replica's reservations only)."""
        self.registry, self.state, self.log, self.metrics = registry, state, decision_log, metrics
        self.config, self.policy_gaps = config, policy_gaps
        # The injections of allowed CREATEs: started on /mutate, finished on /validate (webhook/inject/early.py).
        self.injections = EarlyInjections(injector) if injector is not None else None
        self.snapshots, self.access = snapshots, access
        self.creations = AddressLimit(config.creation_rate, config.creation_burst)
        self.quota = QuotaGate(state, metrics, ledger, replica)
        # Evaluation has its own threads: API calls and SSH key generation (an RSA-4096 pair is
        # about a second of CPU) must never queue in front of a decision.
        self._evaluators = ThreadPoolExecutor(max_workers=4, thread_name_prefix="evaluate")
        # Set on close: every evaluation still running stops at its next budget check (policies.cel.environment.Budget),
        # so no thread outlives the server and SIGTERM ends the process.
        self._stopping = threading.Event()
        # So do decision-log appends (with per-record fsync, several at once share one: group commit).
        self._log_writers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="decision-log")

    def stop_evaluations(self) -> None:
        """Stop every evaluation still running at its next budget check; their requests get the
        failure mode's answer (logged)."""
        self._stopping.set()

    def close(self) -> None:
        self.stop_evaluations()
        self._evaluators.shutdown(wait=False, cancel_futures=True)
        self._log_writers.shutdown(wait=True)  # every decision already answered is on disk

    async def refuse(self, endpoint: str, status: int, error: str, caller: Caller = UNKNOWN) -> tuple[int, dict]:
        """A request refused before its body could be read (too large, too slow): still logged."""
        _caller.set(caller)
        decision_id = str(uuid.uuid4())
        await self._record(DecisionRecord.refused(decision_id, endpoint, status, error), time.perf_counter(),
                           required=False)
        return status, {"error": error, "decisionId": decision_id}

    async def review(self, body: bytes, endpoint: str, caller: Caller = UNKNOWN) -> tuple[int, dict]:
        """Returns (HTTP status, JSON body). 200 for every AdmissionReview we could answer."""
        submission = Submission()
        answer: dict = {}
        try:
            status, answer = await self._review(body, endpoint, caller, submission)
        except Unrecorded as exc:  # the answer could not be recorded: it must not stand
            status, answer = await self._unrecorded(exc)
        finally:
            # Whatever /validate answers but an admission (a denial, a failure, no answer at all),
            # the objects this submission's /mutate or /validate created go (webhook/inject/early.py),
            # and so does its quota reservation.
            admitted = (answer.get("response") or {}).get("allowed")
            if submission.admission_id and self.injections is not None and not admitted:
                self.injections.withdraw(submission.admission_id, submission.owner, submission.injected)
            if submission.reservation is not None and not admitted:
                self.quota.release(submission.reservation)
        return status, answer

    async def _review(self, body: bytes, endpoint: str, caller: Caller, submission: Submission) -> tuple[int, dict]:
        _caller.set(caller)
        started = time.perf_counter()
        deadline.start(self.config.webhook_timeout_seconds - deadline.MARGIN)
        decision_id = str(uuid.uuid4())
        try:
            # A large body takes ~100 ms to parse and check: on a worker thread, so /healthz and the
            # other answers go on meanwhile; a small one is parsed here, cheaper than a thread hop.
            parsed = (protocol.parse(body) if len(body) <= INLINE_PARSE_BYTES else
                      await asyncio.get_running_loop().run_in_executor(self._evaluators, protocol.parse, body))
        except protocol.ReviewError as exc:
            await self._record(DecisionRecord.malformed(decision_id, endpoint, exc.uid, str(exc)), started)
            if exc.uid:  # an AdmissionReview we can answer: refuse it in its own terms
                return 200, protocol.denied(exc.uid, decision_id, f"invalid AdmissionReview: {exc}", code=400)
            return 400, {"error": str(exc), "decisionId": decision_id}
        if parsed.passthrough:  # a deletion's record says who deleted the job and where it stood
            record = (DecisionRecord.deleted if parsed.deletion else DecisionRecord.passthrough)(decision_id, endpoint,
                                                                                                   parsed)
            await self._record(record, started, required=not parsed.deletion)
            return 200, protocol.allowed(parsed.uid, decision_id)
        mutate = endpoint == "mutate"
        if not mutate and parsed.request.operation == "CREATE" and not parsed.request.dry_run:
            submission.admission_id = early.admission_id(parsed.request.object)
            submission.owner = early.owner(parsed.request)
        gaps = self.policy_gaps()
        if gaps:
            return await self._no_policy(parsed, decision_id, endpoint, started, gaps)
        if self.access is not None:
            parsed.request.access = self.access.for_caller(caller)
        try:
            state = self.state if mutate else await self._with_snapshot(parsed.request)
            small = len(body) <= INLINE_PARSE_BYTES
            if mutate:
                decision = await self._evaluate(parsed, state, mutate, caller, small=small)
            else:  # a job that takes quota takes its reservation with the decision (webhook/admission/quotagate.py)
                decision, submission.reservation = await self.quota.decide(
                    parsed.request, lambda: self._evaluate(parsed, state, mutate, caller, small=small))
        except LedgerError as exc:
            log.warning("no quota reservation for %s (decision %s): %s", parsed.uid, decision_id, exc)
            return await self._undecided(parsed, decision_id, endpoint, started,
                                         f"its quota reservation could not be taken ({exc})", f"LedgerError: {exc}")
        except Exception as exc:  # noqa: BLE001 - a timeout or any failure must still be answered and logged
            return await self._failure(parsed, decision_id, endpoint, started, exc)
        if mutate:
            return await self._mutated(parsed, decision_id, started, decision, caller)
        injected: list[dict] = []
        if decision.allowed and decision.injections and not parsed.request.dry_run and self.injections is not None:
            if injections.made_at_admission(decision.injections) and not caller.authenticated \
                    and not self.injections.started(submission.admission_id, submission.owner) \
                    and not self.creations.take(caller.address):
                return await self._rate_limited(parsed, decision_id, endpoint, started, decision, caller)
            injected = submission.injected = await self._inject(parsed, decision, submission)
            for record in injected:
                self.metrics.injections.labels(record["kind"], record["status"]).inc()
            failed = [i for i in injected if i["status"] == "failed"]
            # A planted object denies whatever the failure mode: it is policy, not trouble.
            refused = [i for i in injected if i["status"] == "refused"]
            if failed and not refused:
                return await self._injection_failure(parsed, decision_id, endpoint, started, decision, injected, failed)
            decision = decision.with_warnings(
                [f"{i['kind']} {i['namespace']}/{i['name']} {i['reason']}" for i in injected if i["status"] == "kept"]
            ).with_denial(*EXISTING_OBJECTS, [f"{i['kind']} {i['namespace']}/{i['name']} {i['reason']}" for i in refused],
                          [i["fix"] for i in refused])
        self._count_rules(decision)
        await self._record(DecisionRecord.decided(decision_id, parsed, decision, injected), started)
        if decision.allowed and decision.injections and not parsed.request.dry_run and self.injections is not None:
            self.injections.admitted(decision, parsed.request.object)  # before the job can be stored
        return 200, protocol.from_decision(parsed.uid, decision, decision_id)

    async def _evaluate(self, parsed: protocol.ParsedReview, state: ClusterState, mutate: bool, caller: Caller,
                        *, small: bool) -> Decision:
        """The engine's decision, within the answer's deadline. A small request's is tried on the
        event loop first, for at most INLINE_SLICE: most take about a millisecond, less than handing
        it to a worker thread and back costs once the server has idled. One that needs longer, or a
        permission check not answered yet (WouldWait: the loop must not wait on the API server),
        starts over on a worker thread, where past its deadline it stops instead of holding the thread."""
        engine = evaluate if mutate else evaluate_stored
        bundles = list(self.registry.active)
        started, limit = time.monotonic(), deadline.bound(self.config.timeout_seconds)
        if small and limit > 4 * INLINE_SLICE:
            request = (replace(parsed.request, access=self.access.for_caller(caller, wait=False))
                       if self.access is not None else parsed.request)
            # the loop's own CPU: a slice measured on the wall clock would also count waits for the
            # GIL (5 ms each while another thread computes) and send sound decisions to a worker
            slice_budget = Budget(deadline=time.thread_time() + INLINE_SLICE, cancelled=self._stopping,
                                  clock=time.thread_time)
            try:
                decision = engine(request, bundles, state, slice_budget)
            except Abandoned:
                if self._stopping.is_set():
                    raise
            else:
                self.metrics.evaluations.labels("loop").inc()
                return decision
        self.metrics.evaluations.labels("worker").inc()
        budget = Budget(deadline=started + limit, cancelled=self._stopping)
        return await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(self._evaluators, engine, parsed.request, bundles, state, budget),
            timeout=started + limit - time.monotonic())

    async def _mutated(self, parsed: protocol.ParsedReview, decision_id: str, started: float, decision: Decision,
                       caller: Caller) -> tuple[int, dict]:
        """The /mutate answer: the patch only (refusals and warnings come from /validate, once). An
        allowed CREATE's injections start here, once its record is written, tagged with this
        decision's id (webhook/inject/early.py); whatever it answers, an id the submitter wrote goes."""
        request = parsed.request
        made = injections.made_at_admission(decision.injections)
        starting = bool(decision.allowed and made and request.operation == "CREATE"
                        and not request.dry_run and self.injections is not None and self.injections.room()
                        # a generated name is given after the mutating webhooks: /validate injects then
                        and (request.object.get("metadata") or {}).get("name")
                        and (caller.authenticated or self.creations.take(caller.address)))
        tag = early.tag(decision.mutated if decision.allowed else request.object,
                        decision_id if starting else None) if request.operation == "CREATE" else []
        patch = decision.patch + tag if decision.allowed else tag
        begun = [{"kind": p["kind"], "name": p["name"], "namespace": decision.job.namespace, "status": "started"}
                 for p in made] if starting else []
        await self._record(DecisionRecord.mutated(decision_id, parsed, decision, patch, begun), started)
        if starting:
            self.injections.start(replace(decision, patch=patch), decision_id, early.owner(request))
        return 200, protocol.allowed(parsed.uid, decision_id, patch=patch)

    async def _with_snapshot(self, request: AdmissionInput) -> ClusterState:
        """The state with the job's runtime snapshot, when an UPDATE's job has one (policies/job/snapshot.py
        decides whether it is used). /mutate does not ask: it patches only on CREATE."""
        configmap = await self.snapshots(request) if self.snapshots is not None else None
        return self.state.with_snapshot(configmap) if configmap else self.state

    async def _failure(self, parsed: protocol.ParsedReview, decision_id: str, endpoint: str, started: float,
                       exc: BaseException) -> tuple[int, dict]:
        if isinstance(exc, (asyncio.TimeoutError, Abandoned)):
            left = deadline.remaining()
            reason = ("evaluation " + self._deadline_passed() if left is not None and left <= 0.05
                      else f"evaluation timed out after {self.config.timeout_seconds:g} s")
        else:
            reason = f"evaluation failed ({type(exc).__name__})"
        detail = f"{type(exc).__name__}: {str(exc)[:200]}"
        # One line per failure: a hostile client sending ill-typed objects must not flood the log
        # with tracebacks (they are kept at debug level).
        log.warning("%s for %s (decision %s): %s", reason, parsed.uid, decision_id, detail)
        log.debug("evaluation failure for %s", parsed.uid, exc_info=exc)
        return await self._undecided(parsed, decision_id, endpoint, started, reason, detail)

    async def _no_policy(self, parsed: protocol.ParsedReview, decision_id: str, endpoint: str, started: float,
                         gaps: list[str]) -> tuple[int, dict]:
        """No active bundle, or the cluster not read yet: the failure mode, never allow-all."""
        what = "; ".join(gaps)
        log.error("no policy to decide %s (decision %s): %s", parsed.uid, decision_id, what)
        return await self._undecided(parsed, decision_id, endpoint, started, f"no policy to decide with: {what}",
                                     f"no policy: {what}")

    async def _undecided(self, parsed: protocol.ParsedReview, decision_id: str, endpoint: str, started: float,
                         reason: str, detail: str) -> tuple[int, dict]:
        """The answer when no decision was made: /validate the failure mode, /mutate allowed unpatched."""
        allow = self._failure_mode_allows(endpoint)
        # /mutate never blocks (validation decides), so it must not claim the failure mode.
        outcome = ("it continues unpatched (no Istio, queue or security defaults) to validation" if endpoint == "mutate"
                   else f"failure mode is {'allow' if allow else 'deny'}")
        message = (f"trainjob-admission could not evaluate this job: {reason}; {outcome}. "
                   f"Retry, and tell your admin the decision id {decision_id}")
        await self._record(DecisionRecord.failed(decision_id, endpoint, parsed, allowed=allow, message=message,
                                                 error=detail), started)
        return 200, protocol.failure_mode(parsed.uid, decision_id, message, allow=allow)

    def _failure_mode_allows(self, endpoint: str) -> bool:
        """Whether an answer without a decision admits: /mutate never blocks (validation decides),
        /validate answers the failure mode."""
        return endpoint == "mutate" or self.config.failure_mode == "allow"

    def _deadline_passed(self) -> str:
        timeout = self.config.webhook_timeout_seconds
        return (f"ran out of the request's {timeout - deadline.MARGIN:g} s (the webhook's "
                f"timeoutSeconds {timeout:g} minus {deadline.MARGIN:g} s to answer before the API server gives up)")

    async def _unrecorded(self, exc: Unrecorded) -> tuple[int, dict]:
        """The decision log could not take the record of an answer, so that answer is not given:
        /validate answers the failure mode (a denial stays a denial), /mutate allows unpatched.
        That answer is recorded as well as can be: stdout always, the file if it works again."""
        record = exc.record
        allow = record.allowed and self._failure_mode_allows(record.endpoint)
        outcome = "allowed unpatched" if record.endpoint == "mutate" else "failure mode " + self.config.failure_mode
        message = (f"trainjob-admission could not record its decision ({exc.cause}), and answers nothing it cannot "
                   f"record: {outcome}. Retry later, and tell your admin the decision id {record.id}: the decision "
                   "log's volume is full or read-only")
        answered = DecisionRecord.unrecorded(record, allowed=allow, message=message, error=f"DecisionLogError: {exc.cause}")
        await self._write(answered, required=False)
        if not isinstance(record.uid, str) or not record.uid:  # not an AdmissionReview we could answer in its own terms
            return 500, {"error": message, "decisionId": record.id}
        return 200, protocol.failure_mode(record.uid, record.id, message, allow=allow)

    async def _inject(self, parsed: protocol.ParsedReview, decision: Decision, submission: Submission) -> list[dict]:
        """The injector's records, within the request's deadline (its calls check it too, and send
        nothing once it has passed); an injector that raises or runs out of time fails every plan
        rather than the request."""
        try:
            return await asyncio.wait_for(self.injections.finish(decision, submission.admission_id, submission.owner),
                                          timeout=deadline.remaining())
        except TimeoutError:
            reason = f"not created: the injection {self._deadline_passed()}"
            log.warning("injection for %s %s", parsed.uid, reason)
        except Exception as exc:  # noqa: BLE001 - answered through the failure mode below
            log.exception("injector failed for %s", parsed.uid)
            reason = f"injector failed ({type(exc).__name__})"
        namespace = (parsed.request.object.get("metadata") or {}).get("namespace", "")
        return [{"kind": p["kind"], "name": p["name"], "namespace": namespace, "status": "failed", "reason": reason}
                for p in decision.injections]

    async def _injection_failure(self, parsed: protocol.ParsedReview, decision_id: str, endpoint: str,
                                 started: float, decision: Decision, injected: list[dict],
                                 failed: list[dict]) -> tuple[int, dict]:
        """An allowed job whose objects could not be created: the failure mode decides, and says so."""
        allow = self._failure_mode_allows(endpoint)
        by_reason: dict[str, list[str]] = {}
        for i in failed:
            by_reason.setdefault(i["reason"], []).append(f"{i['kind']} {i['namespace']}/{i['name']}")
        what = "; ".join(f"{' and '.join(names)} ({reason})" for reason, names in by_reason.items())
        if allow:  # a warning: short, the API server cuts warnings at 256 characters
            message = f"trainjob-admission failure mode allow: admitted without {what}"
        else:
            message = (f"trainjob-admission could not prepare {what}; the job was not admitted (failure mode deny). "
                       f"Retry in a minute; if it keeps failing, tell your admin (decision id {decision_id}): the "
                       f"webhook needs create, get and delete on secrets and networkpolicies in this namespace and "
                       f"a reachable API server")
        log.warning("injection failed for %s: %s", parsed.uid, what)
        await self._record(DecisionRecord.injection_failed(decision_id, endpoint, parsed, decision, allowed=allow,
                                                           message=message, injected=injected), started)
        return 200, protocol.failure_mode(parsed.uid, decision_id, message, allow=allow, warnings=decision.warnings)

    async def _rate_limited(self, parsed: protocol.ParsedReview, decision_id: str, endpoint: str, started: float,
                            decision: Decision, caller: Caller) -> tuple[int, dict]:
        """An unauthenticated address past its creation budget: nothing is created, the failure mode decides."""
        allow = self._failure_mode_allows(endpoint)
        what = " and ".join(f"{i['kind']} {i['name']}" for i in decision.injections)
        reason = (f"more requests that create objects from {caller.address} than {self.creations.describe()} "
                  f"(callers without a client certificate are limited; the service runs without --client-ca)")
        message = (f"trainjob-admission failure mode allow: admitted without {what}: rate limited" if allow else
                   f"trainjob-admission did not create {what}: {reason}; the job was not admitted (failure mode "
                   f"deny). Retry later; decision id {decision_id}")
        log.warning("rate limited %s for %s (decision %s): %s", caller.address, parsed.uid, decision_id, reason)
        namespace = (parsed.request.object.get("metadata") or {}).get("namespace", "")
        skipped = [{**i, "namespace": namespace, "status": "rate-limited", "reason": reason} for i in decision.injections]
        await self._record(DecisionRecord.injection_failed(decision_id, endpoint, parsed, decision, allowed=allow,
                                                           message=message, injected=skipped), started)
        return 200, protocol.failure_mode(parsed.uid, decision_id, message, allow=allow, warnings=decision.warnings)

    def _count_rules(self, decision: Decision) -> None:
        """The rules that did not pass, once per submission: its /validate decision (the /mutate
        evaluation of the same job would count them twice)."""
        for result in decision.results:
            if result.result is not Result.PASS:
                self.metrics.rule_results.labels(result.bundle, result.rule, result.effect).inc()

    async def _record(self, record: DecisionRecord, started: float, *, required: bool = True) -> None:
        """Log ``record`` before its answer leaves. When the file cannot take it, :class:`Unrecorded`
        (review() then answers the failure mode); ``required=False`` for answers that are a
        refusal anyway: stdout has them, the file may miss them."""
        latency = time.perf_counter() - started
        record = replace(record, caller=_caller.get().as_record(), latencyMs=round(latency * 1000, 3))
        try:
            await self._write(record, required=required)
        except DecisionLogError as exc:
            raise Unrecorded(record, exc) from None
        self.metrics.latency.labels(record.endpoint).observe(latency)

    async def _write(self, record: DecisionRecord, *, required: bool) -> None:
        """In the file and on stdout before the response leaves (fsynced too in strict mode): a
        crashed or killed server loses no answered decision. The log adds the time and the chain."""
        fields = record.as_log_fields()
        # On a thread, never the loop: a write can block (stdout's pipe full behind a slow log
        # collector, a rotation's fsync, the strict mode's fsync), and the loop must go on answering
        # probes meanwhile.
        await asyncio.get_running_loop().run_in_executor(
            self._log_writers, functools.partial(self.log.append, fields, required=required))
        self.metrics.requests.labels(record.endpoint, record.decision, fields.get("kind", ""),
                                     fields.get("operation", "")).inc()
