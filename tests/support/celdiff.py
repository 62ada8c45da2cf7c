"""The CEL differential: each case of tests/support/celcorpus.py judged by the real kube-apiserver
(a ValidatingAdmissionPolicy and binding per case, a server-side dry-run create of the TrainJob)
and by our engine (the case as a bundle rule, policies/decide/engine.py on the same object), and
the two verdicts compared.

    oracle = Oracle(api, namespace, run)       # api: Api over the admin kubeconfig's certificates
    apiserver = oracle.judge(cases)            # {case id: Verdict}; policies removed afterwards
    ours = Ours(job, namespace_object, runtime, user).judge(cases)
    rows = compare(cases, apiserver, ours, exceptions(docs/cel-conformance.md))

A verdict is ``allow``, ``deny`` (with the message), ``error`` (the expression failed when
evaluated: VAP with failurePolicy Fail says ``expression '...' resulted in error``; ours a rule
result ``error``) or ``refused`` (the API server rejects the policy when it is created, or its
type checking, which the API server runs against the TrainJob CRD schema and reports in the
policy's status, warns about the expression: our lint error). The one-policy-per-case layout keeps
each verdict and message whole: the API server reports only the first denial of a request, and
cuts warnings at 4 KiB.
"""
from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from trainjob_admission.policies.bundle.compile import BundleError, compile_document
from trainjob_admission.policies.cel.authz import AccessCheck, AccessError
from trainjob_admission.policies.decide.decision import Result
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.k8s.clusterstate import ClusterState
from trainjob_admission.webhook.admission.access import review_body

from .celcorpus import CASE_LABEL, STATIC_MESSAGE, CelCase, trainjob

VAP_API = "/apis/admissionregistration.k8s.io/v1"
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs"
RUN_LABEL = "celdiff.trainjob-admission.io/run"
SENTINEL = "sentinel"
_ERRORS = ("expression '", "compilation error:", "failed to configure", "validation failed due to running out",
           "runtime cost could not be calculated", "failed messageExpression", "unexpected internal error")
_DENIED = re.compile(r"ValidatingAdmissionPolicy '([^']+)' with binding '[^']+' denied request: (.*)", re.S)


@dataclass(frozen=True)
class Verdict:
    kind: str  # allow | deny | error | refused | other (the harness could not tell)
    message: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}" if self.message else self.kind


class Api:
    """Plain HTTPS calls to the API server with the admin client certificate (the REST answers,
    status codes included, are what the differential reads)."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path, timeout: float = 30):
        self.server, self.timeout = server.rstrip("/"), timeout
        self.context = ssl.create_default_context(cafile=str(ca))
        self.context.load_cert_chain(str(cert), str(key))

    def call(self, method: str, path: str, body: Any = None, query: dict | None = None) -> tuple[int, dict]:
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as reply:
                return reply.status, json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            text = exc.read()
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, {"message": text.decode(errors="replace")}


def policy_name(run: str, case_id: str) -> str:
    return f"celdiff-{run}-{case_id}"


def policy(case: CelCase, run: str) -> dict:
    """The case as a ValidatingAdmissionPolicy on TrainJob creates (failurePolicy Fail)."""
    validation: dict = {"expression": case.expression, "message": STATIC_MESSAGE}
    if case.message_expression is not None:
        validation["messageExpression"] = case.message_expression
    spec: dict = {"failurePolicy": "Fail", "validations": [validation],
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["v1alpha1"],
                                                          "operations": ["CREATE"], "resources": ["trainjobs"]}]}}
    if case.variables:
        spec["variables"] = [{"name": name, "expression": text} for name, text in case.variables]
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy_name(run, case.id), "labels": {RUN_LABEL: run}}, "spec": spec}


def binding(case_id: str, run: str, namespace: str) -> dict:
    """Deny on the case's own TrainJob only: its label picks the one policy a request meets."""
    name = policy_name(run, case_id)
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": {RUN_LABEL: run}},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                     "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                                        "objectSelector": {"matchLabels": {CASE_LABEL: case_id}}}}}


def classify_denial(message: str) -> Verdict:
    """A dry-run create's refusal: the policy's denial (its message) or its evaluation error."""
    found = _DENIED.search(message)
    if not found:
        return Verdict("other", message)
    text = found.group(2)
    return Verdict("error" if text.startswith(_ERRORS) else "deny", text)


class Oracle:
    """The API server's verdicts, for many cases at once."""

    def __init__(self, api: Api, namespace: str, run: str, workers: int = 6):
        self.api, self.namespace, self.run, self.workers = api, namespace, run, workers
        self.seconds: dict[str, float] = {}  # each phase of the last judge(), for the test to show

    def _phase(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.seconds[name] = round(now - since, 1)
        return now

    def judge(self, cases: list[CelCase], ready_timeout: float = 120) -> tuple[dict[str, Verdict], dict]:
        """Verdicts by case id, and the TrainJob as the API server stored it for the dry run of a
        case no policy matches (the object our side judges)."""
        start = time.monotonic()
        try:
            verdicts = self._create_policies(cases)
            created = [c for c in cases if c.id not in verdicts]
            sentinel = CelCase(SENTINEL, "sentinel", "false")
            self._create_policies([sentinel])
            with ThreadPoolExecutor(self.workers) as pool:
                list(pool.map(self._bind, [c.id for c in created]))
            self._bind(SENTINEL)
            start = self._phase("create and bind", start)
            self._wait_until_enforced(ready_timeout)
            with ThreadPoolExecutor(self.workers) as pool:  # while the status controller type-checks
                evaluated = list(pool.map(lambda c: self.dry_run(c.id)[0], created))
            start = self._phase("enforced, dry runs", start)
            warnings = self._type_check_warnings(created)
            start = self._phase("type checking's rest", start)
            for case, verdict in zip(created, evaluated):
                verdicts[case.id] = (Verdict("refused", f"type checking: {warnings[case.id]} (evaluated: {verdict})")
                                     if case.id in warnings else verdict)
            stored = self.dry_run("none")[1]
        finally:
            self.cleanup()
            self._phase("cleanup", start)
        return verdicts, stored

    def _create_policies(self, cases: list[CelCase]) -> dict[str, Verdict]:
        """Create each policy; the ones the API server refuses, with its reason."""
        def create(case: CelCase) -> tuple[str, Verdict | None]:
            status, body = self.api.call("POST", f"{VAP_API}/validatingadmissionpolicies", policy(case, self.run))
            if status == 201:
                return case.id, None
            if status == 422:
                return case.id, Verdict("refused", body.get("message", ""))
            raise RuntimeError(f"creating the policy of {case.id}: HTTP {status}: {body}")

        with ThreadPoolExecutor(self.workers) as pool:
            return {case_id: verdict for case_id, verdict in pool.map(create, cases) if verdict is not None}

    def _bind(self, case_id: str) -> None:
        status, body = self.api.call("POST", f"{VAP_API}/validatingadmissionpolicybindings",
                                     binding(case_id, self.run, self.namespace))
        if status != 201:
            raise RuntimeError(f"binding {case_id}: HTTP {status}: {body}")

    def dry_run(self, case_id: str) -> tuple[Verdict, dict]:
        """The case's TrainJob created with dryRun=All: its verdict and, when admitted, the object."""
        status, body = self.api.call("POST", TRAINJOBS.format(namespace=self.namespace),
                                     trainjob(self.namespace, case_id), {"dryRun": "All"})
        if status == 201:
            return Verdict("allow"), body
        return classify_denial(body.get("message", json.dumps(body))), {}

    def _wait_until_enforced(self, timeout: float) -> None:
        """The admission plugin sees policies and bindings through informers: the sentinel,
        created last, denying means every policy and binding before it is in force."""
        deadline = time.monotonic() + timeout
        while True:
            verdict, _ = self.dry_run(SENTINEL)
            if verdict.kind == "deny" and verdict.message == STATIC_MESSAGE:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sentinel policy was not enforced after {timeout} s: {verdict}")
            time.sleep(0.5)

    def _type_check_warnings(self, created: list[CelCase], stall: float = 90) -> dict[str, str]:
        """The type checking the API server's policy status controller does against the
        TrainJob CRD schema (status.typeChecking): the warnings, by case, once every policy was
        checked. The controller checks a few policies a second on a busy machine: it is waited for
        as long as it makes progress."""
        names = {policy_name(self.run, c.id): c.id for c in created}
        deadline, done = time.monotonic() + stall, -1
        while True:
            status, body = self.api.call("GET", f"{VAP_API}/validatingadmissionpolicies",
                                         query={"labelSelector": f"{RUN_LABEL}={self.run}"})
            items = [i for i in body.get("items", []) if i["metadata"]["name"] in names] if status == 200 else []
            checked = [i for i in items if (i.get("status") or {}).get("observedGeneration") == i["metadata"].get("generation")]
            if len(checked) == len(names):
                break
            if len(checked) > done:
                deadline, done = time.monotonic() + stall, len(checked)
            if time.monotonic() > deadline:
                raise TimeoutError(f"type checking: {len(checked)} of {len(names)} policies checked, none more in {stall} s")
            time.sleep(2)
        warnings = {}
        for item in checked:
            found = ((item.get("status") or {}).get("typeChecking") or {}).get("expressionWarnings") or []
            if found:
                warnings[names[item["metadata"]["name"]]] = "; ".join(f"{w['fieldRef']}: {w['warning'].strip()}" for w in found)
        return warnings

    def cleanup(self) -> None:
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            self.api.call("DELETE", f"{VAP_API}/{kind}", query={"labelSelector": f"{RUN_LABEL}={self.run}"})


@dataclass(frozen=True)
class User:
    username: str
    groups: tuple[str, ...]
    uid: str = ""


class Access:
    """The CEL ``authorizer``'s answers as the server gets them (webhook/admission/access.py): a
    SubjectAccessReview per question, asked of the API server when ``api`` is given, else from the
    answers of a past run; ``answers`` keeps them (by the question, as text) for a replay."""

    def __init__(self, api: Api | None = None, answers: dict[str, list] | None = None):
        self.api, self.answers = api, dict(answers or {})

    def __call__(self, check: AccessCheck) -> tuple[bool, str]:
        key = repr(check)
        if key not in self.answers:
            if self.api is None:
                raise AccessError(f"no recorded answer to {key}")
            status, body = self.api.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review_body(check))
            if status != 201:
                raise AccessError(f"the SubjectAccessReview failed: HTTP {status}")
            answer = body.get("status") or {}
            self.answers[key] = [bool(answer.get("allowed")), str(answer.get("reason", ""))]
        allowed, reason = self.answers[key]
        return allowed, reason


class Ours:
    """Our verdicts: each case as a bundle rule, judged by the engine on ``stored`` (the object the
    API server built for the dry run), with the namespace and runtime the cluster has, and
    ``access`` answering the authorizer's questions."""

    def __init__(self, stored: dict, namespace_object: dict, runtime: dict, user: User, access: Access):
        self.stored, self.user, self.access = stored, user, access
        self.state = ClusterState.from_objects([namespace_object, runtime])

    def judge(self, cases: Iterable[CelCase]) -> dict[str, Verdict]:
        return {case.id: self.verdict(case) for case in cases}

    def verdict(self, case: CelCase) -> Verdict:
        try:
            bundle = compile_document(bundle_document(case), f"{case.id}.yaml")
        except BundleError as exc:
            return Verdict("refused", "; ".join(p.message for p in exc.problems))
        obj = json.loads(json.dumps(self.stored))
        obj["metadata"].setdefault("labels", {})[CASE_LABEL] = case.id
        request = AdmissionInput(obj, username=self.user.username, groups=list(self.user.groups),
                                 user_uid=self.user.uid, dry_run=True, access=self.access)
        decision = evaluate(request, [bundle], self.state, mutate=False)
        result = next((r for r in decision.results if r.rule == "case"), None)
        if result is None:
            return Verdict("other", "; ".join(m for r in decision.results for m in r.messages) or "no result")
        if result.result is Result.PASS:
            return Verdict("allow")
        if result.result is Result.ERROR:
            return Verdict("error", "; ".join(result.messages))
        return Verdict("deny", "; ".join(result.messages))


def bundle_document(case: CelCase) -> dict:
    rule: dict = {"name": "case", "expression": case.expression, "message": STATIC_MESSAGE}
    if case.message_expression is not None:
        rule["messageExpression"] = case.message_expression
    spec: dict = {"validations": [rule], "match": {"kinds": ["TrainJob"]}}
    if case.variables:
        spec["variables"] = [{"name": name, "expression": text} for name, text in case.variables]
    return {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
            "metadata": {"name": "celdiff"}, "spec": spec}


@dataclass(frozen=True)
class Row:
    case: CelCase
    apiserver: Verdict
    ours: Verdict
    agree: bool
    fail_open: bool  # the API server denies or errs (or refuses the policy) where we admit
    excepted: str = ""  # the justification docs/cel-conformance.md gives

    def line(self) -> str:
        flag = " FAIL-OPEN" if self.fail_open else ""
        return (f"[{self.case.id}]{flag} {self.case.describe()}\n    apiserver: {_short(self.apiserver)}\n"
                f"    ours:      {_short(self.ours)}")


def _short(verdict: Verdict, limit: int = 400) -> str:
    text = str(verdict).replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit] + "..."


def agree(apiserver: Verdict, ours: Verdict) -> bool:
    """Same verdict; for a denial also the same message."""
    if apiserver.kind != ours.kind:
        return False
    return apiserver.kind != "deny" or apiserver.message == ours.message


def compare(cases: list[CelCase], apiserver: dict[str, Verdict], ours: dict[str, Verdict],
            excepted: dict[str, str]) -> list[Row]:
    rows = []
    for case in cases:
        theirs, mine = apiserver[case.id], ours[case.id]
        same = agree(theirs, mine)
        fail_open = mine.kind == "allow" and theirs.kind in ("deny", "error")
        rows.append(Row(case, theirs, mine, same, fail_open,
                        "" if same or fail_open else excepted.get(case.describe(), "")))
    return rows


def exceptions(conformance_doc: Path) -> dict[str, str]:
    """The justified exceptions: the rows of the "Differential exceptions" table of
    docs/cel-conformance.md, ``| `case` | why |`` (the case as CelCase.describe() prints it)."""
    text = conformance_doc.read_text()
    if "## Differential exceptions" not in text:
        return {}
    section = text.split("## Differential exceptions", 1)[1].split("\n## ", 1)[0]
    found = {}
    for line in section.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[0].endswith("`"):
            found[cells[0][1:-1]] = cells[-1]
    return found


def table(rows: list[Row]) -> str:
    """The agreement table by category, then the total."""
    by_category: dict[str, Counter] = {}
    for row in rows:
        count = by_category.setdefault(row.case.category, Counter())
        count["cases"] += 1
        count["agree" if row.agree else "excepted" if row.excepted else "disagree"] += 1
        count["fail-open"] += row.fail_open
    total = sum(by_category.values(), Counter())
    lines = [f"{'category':<16} {'cases':>6} {'agree':>6} {'disagree':>9} {'fail-open':>10} {'excepted':>9}"]
    for name, count in [*sorted(by_category.items()), ("total", total)]:
        lines.append(f"{name:<16} {count['cases']:>6} {count['agree']:>6} {count['disagree']:>9} "
                     f"{count['fail-open']:>10} {count['excepted']:>9}")
    return "\n".join(lines)


def report(rows: list[Row]) -> str:
    """The table, then one entry per disagreement (what part A fixes semantics from)."""
    wrong = [r for r in rows if not r.agree]
    return "\n".join([table(rows), "", f"{len(wrong)} disagreements:", *(r.line() for r in wrong)]) + "\n"


def replay(path: Path) -> list[Row]:
    """The API server's verdicts of a past run (the .json the cluster test writes) against ours
    now: work on our side between cluster runs (``python -m tests.support.celdiff FILE``)."""
    from .celcorpus import cases as all_cases

    saved = json.loads(path.read_text())
    judged = {v["case"]: Verdict(**v["apiserver"]) for v in saved["verdicts"].values()}
    cases = [c for c in all_cases() if c.describe() in judged]  # the cases of then that are still in the corpus
    user = User(saved["user"]["username"], tuple(saved["user"]["groups"]), saved["user"]["uid"])
    ours = Ours(saved["stored"], saved["namespace"], saved["runtime"], user, Access(answers=saved["access"])).judge(cases)
    apiserver = {c.id: judged[c.describe()] for c in cases}
    docs = Path(__file__).resolve().parents[2] / "docs" / "cel-conformance.md"
    return compare(cases, apiserver, ours, exceptions(docs))


if __name__ == "__main__":
    import sys

    print(report(replay(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/cel-differential-latest.json"))), end="")
