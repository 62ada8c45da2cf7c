"""One AdmissionReview from bytes to response: parse, decide (bounded in time), log, answer.

The HTTP layer stays thin: it hands the body here and writes back what comes out. Every
request, including the malformed and the failed, is logged before the response is returned.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

from policies.decision import Decision, Result
from policies.engine import evaluate
from policies.state import ClusterState

from . import admission
from .bundles import BundleRegistry
from .decisionlog import DecisionLog
from .metrics import Metrics
from .record import DecisionRecord

log = logging.getLogger("trainjob_admission.reviewer")

# What /validate calls for an allowed job: one record per planned object (webhook/injector.py).
InjectFn = Callable[[admission.ParsedReview, Decision], Awaitable[list[dict]]]


@dataclass
class ReviewerConfig:
    failure_mode: str = "deny"  # what /validate answers when a request cannot be evaluated
    timeout_seconds: float = 5.0


class Reviewer:
    def __init__(self, registry: BundleRegistry, state: ClusterState, decision_log: DecisionLog, metrics: Metrics,
                 config: ReviewerConfig, injector: InjectFn | None = None):
        self.registry, self.state, self.log, self.metrics = registry, state, decision_log, metrics
        self.config, self.injector = config, injector
        # Evaluation has its own threads: API calls and SSH key generation (an RSA-4096 pair is
        # about a second of CPU) must never queue in front of a decision.
        self._evaluators = ThreadPoolExecutor(max_workers=4, thread_name_prefix="evaluate")
        # So do decision-log appends (with per-record fsync, several at once share one: group commit).
        self._log_writers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="decision-log")

    def close(self) -> None:
        self._evaluators.shutdown(wait=False, cancel_futures=True)
        self._log_writers.shutdown(wait=True)  # every decision already answered is on disk

    async def refuse(self, endpoint: str, status: int, error: str) -> tuple[int, dict]:
        """A request refused before its body could be read (too large, too slow): still logged."""
        decision_id = str(uuid.uuid4())
        await self._record(DecisionRecord.refused(decision_id, endpoint, status, error), time.perf_counter())
        return status, {"error": error, "decisionId": decision_id}

    async def review(self, body: bytes, endpoint: str) -> tuple[int, dict]:
        """Returns (HTTP status, JSON body). 200 for every AdmissionReview we could answer."""
        started = time.perf_counter()
        decision_id = str(uuid.uuid4())
        try:
            parsed = admission.parse(body)
        except admission.ReviewError as exc:
            await self._record(DecisionRecord.malformed(decision_id, endpoint, exc.uid, str(exc)), started)
            if exc.uid:  # an AdmissionReview we can answer: refuse it in its own terms
                return 200, admission.response(exc.uid, allowed=False, message=f"invalid AdmissionReview: {exc}",
                                               decision_id=decision_id, code=400)
            return 400, {"error": str(exc), "decisionId": decision_id}
        if parsed.passthrough:
            await self._record(DecisionRecord.passthrough(decision_id, endpoint, parsed), started)
            return 200, admission.response(parsed.uid, allowed=True, decision_id=decision_id)
        mutate = endpoint == "mutate"
        try:
            decision = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(
                    self._evaluators, evaluate, parsed.request, list(self.registry.active), self.state),
                timeout=self.config.timeout_seconds,
            )
        except Exception as exc:  # noqa: BLE001 - a timeout or any failure must still be answered and logged
            return await self._failure(parsed, decision_id, endpoint, started, exc)
        injected: list[dict] = []
        if not mutate and decision.allowed and decision.injections and not parsed.request.dry_run and self.injector:
            injected = await self._inject(parsed, decision)
            for record in injected:
                self.metrics.injections.labels(record["kind"], record["status"]).inc()
            failed = [i for i in injected if i["status"] == "failed"]
            if failed:
                return await self._injection_failure(parsed, decision_id, endpoint, started, decision, injected, failed)
            decision = decision.with_warnings(
                [f"{i['kind']} {i['namespace']}/{i['name']} {i['reason']}" for i in injected if i["status"] == "kept"])
        await self._record_decision(decision_id, endpoint, started, parsed, decision, injected)
        if mutate:
            # The mutating call only patches; refusals and warnings come from /validate, once.
            return 200, admission.response(parsed.uid, allowed=True,
                                           patch=decision.patch if decision.allowed else None,
                                           decision_id=decision_id)
        return 200, admission.from_decision(parsed.uid, decision, decision_id)

    async def _failure(self, parsed: admission.ParsedReview, decision_id: str, endpoint: str, started: float,
                       exc: BaseException) -> tuple[int, dict]:
        reason = (f"timed out after {self.config.timeout_seconds:g} s" if isinstance(exc, asyncio.TimeoutError)
                  else f"failed ({type(exc).__name__})")
        detail = f"{type(exc).__name__}: {str(exc)[:200]}"
        # One line per failure: a hostile client sending ill-typed objects must not flood the log
        # with tracebacks (they are kept at debug level).
        log.warning("evaluation %s for %s (decision %s): %s", reason, parsed.uid, decision_id, detail)
        log.debug("evaluation failure for %s", parsed.uid, exc_info=exc)
        allow = endpoint == "mutate" or self.config.failure_mode == "allow"
        # /mutate never blocks (validation decides), so it must not claim the failure mode.
        outcome = ("it continues unpatched (no Istio, queue or security defaults) to validation" if endpoint == "mutate"
                   else f"failure mode is {'allow' if allow else 'deny'}")
        message = (f"trainjob-admission could not evaluate this job: evaluation {reason}; {outcome}. "
                   f"Retry, and tell your admin the decision id {decision_id}")
        await self._record(DecisionRecord.failed(decision_id, endpoint, parsed, allowed=allow, message=message,
                                                 error=detail), started)
        return 200, admission.response(parsed.uid, allowed=allow, message=message, decision_id=decision_id,
                                       warnings=[message] if allow else None)

    async def _inject(self, parsed: admission.ParsedReview, decision: Decision) -> list[dict]:
        """The injector's records; an injector that raises fails every plan rather than the request."""
        try:
            return await self.injector(parsed, decision)
        except Exception as exc:  # noqa: BLE001 - answered through the failure mode below
            log.exception("injector failed for %s", parsed.uid)
            namespace = (parsed.request.object.get("metadata") or {}).get("namespace", "")
            return [{"kind": p["kind"], "name": p["name"], "namespace": namespace, "status": "failed",
                     "reason": f"injector failed ({type(exc).__name__})"} for p in decision.injections]

    async def _injection_failure(self, parsed: admission.ParsedReview, decision_id: str, endpoint: str,
                                 started: float, decision: Decision, injected: list[dict],
                                 failed: list[dict]) -> tuple[int, dict]:
        """An allowed job whose objects could not be created: the failure mode decides, and says so."""
        allow = self.config.failure_mode == "allow"
        by_reason: dict[str, list[str]] = {}
        for i in failed:
            by_reason.setdefault(i["reason"], []).append(f"{i['kind']} {i['namespace']}/{i['name']}")
        what = "; ".join(f"{' and '.join(names)} ({reason})" for reason, names in by_reason.items())
        if allow:  # a warning: short, the API server cuts warnings at 256 characters
            message = f"trainjob-admission failure mode allow: admitted without {what}"
        else:
            message = (f"trainjob-admission could not create {what}; the job was not admitted (failure mode deny). "
                       f"Retry in a minute; if it keeps failing, tell your admin (decision id {decision_id}): the "
                       f"webhook needs create, get and delete on secrets and networkpolicies in this namespace and "
                       f"a reachable API server")
        log.warning("injection failed for %s: %s", parsed.uid, what)
        await self._record(DecisionRecord.injection_failed(decision_id, endpoint, parsed, decision, allowed=allow,
                                                           message=message, injected=injected), started)
        return 200, admission.response(parsed.uid, allowed=allow, message=message, decision_id=decision_id,
                                       warnings=decision.warnings + [message] if allow else decision.warnings or None)

    async def _record_decision(self, decision_id: str, endpoint: str, started: float, parsed: admission.ParsedReview,
                               decision: Decision, injected: list[dict]) -> None:
        for result in decision.results:
            if result.result is not Result.PASS:
                self.metrics.rule_results.labels(result.bundle, result.rule, result.effect).inc()
        await self._record(DecisionRecord.decided(decision_id, endpoint, parsed, decision, injected), started)

    async def _record(self, record: DecisionRecord, started: float) -> None:
        latency = time.perf_counter() - started
        fields = replace(record, latencyMs=round(latency * 1000, 3)).as_log_fields()  # the log adds the time
        # In the file and on stdout before the response leaves (fsynced too in strict mode): a
        # crashed or killed server loses no answered decision.
        await asyncio.get_running_loop().run_in_executor(self._log_writers, self.log.append, fields)
        self.metrics.requests.labels(record.endpoint, record.decision, fields.get("kind", "")).inc()
        self.metrics.latency.labels(record.endpoint).observe(latency)
