"""CEL as the API server evaluates it: every expression of tests/support/celcorpus.py judged by the
real kube-apiserver (a ValidatingAdmissionPolicy per expression, a dry-run TrainJob create) and by
our engine (the expression as a bundle rule on the object the API server built), verdicts and
denial messages compared (tests/support/celdiff.py says how).

The test prints the agreement table by category and writes the latest disagreements to
/tmp/cel-differential-latest.txt (or $CEL_DIFFERENTIAL_REPORT; every verdict in the .json beside it). It fails on any disagreement that
docs/cel-conformance.md does not list as a justified exception, and on any fail-open one (the API
server denies or errs where we admit) whatever the document says.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from tests.support import celcorpus, celdiff

pytestmark = pytest.mark.cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "cel-conformance.md"
REPORT = Path(os.environ.get("CEL_DIFFERENTIAL_REPORT", "/tmp/cel-differential-latest.txt"))


def test_corpus_is_large_and_covers_every_category():
    found = {c.category for c in celcorpus.cases()}
    assert len(celcorpus.cases()) >= 500
    assert found == set(celcorpus.CATEGORIES), set(celcorpus.CATEGORIES) ^ found
    assert len({c.id for c in celcorpus.cases()}) == len(celcorpus.cases())


def test_the_api_server_and_our_engine_agree_on_every_expression(control_plane, kubectl, namespace, get_json):
    kubectl("label", "namespace", namespace, *(f"{k}={v}" for k, v in celcorpus.NAMESPACE_LABELS.items()))
    assert celcorpus.RUNTIME in control_plane.runtimes
    module = control_plane.module
    api = celdiff.Api(control_plane.apiserver, control_plane.ca_cert, module.RUN / "pki" / "admin.crt",
                      module.RUN / "pki" / "admin.key")
    whoami = json.loads(kubectl("auth", "whoami", "-o", "json").stdout)["status"]["userInfo"]
    cases = celcorpus.cases()

    oracle = celdiff.Oracle(api, namespace, uuid.uuid4().hex[:6])
    apiserver, stored = oracle.judge(cases)
    assert stored.get("kind") == "TrainJob", "the dry run no policy matches was refused"
    user = celdiff.User(whoami["username"], tuple(whoami.get("groups", ())), whoami.get("uid", ""))
    namespace_object, runtime = get_json("namespace", namespace), get_json("clustertrainingruntime", celcorpus.RUNTIME)
    access = celdiff.Access(api)
    ours = celdiff.Ours(stored, namespace_object, runtime, user, access).judge(cases)

    rows = celdiff.compare(cases, apiserver, ours, celdiff.exceptions(DOC))
    text = celdiff.report(rows)
    REPORT.write_text(text)
    REPORT.with_suffix(".json").write_text(json.dumps({  # what both sides saw and said, to work on ours between runs
        "stored": stored, "namespace": namespace_object, "runtime": runtime, "user": vars(user), "access": access.answers,
        "verdicts": {c.id: {"case": c.describe(), "apiserver": vars(apiserver[c.id]), "ours": vars(ours[c.id])}
                     for c in cases}}, indent=1))
    print("\n" + celdiff.table(rows) + f"\n(disagreements in {REPORT}; the API server's phases: {oracle.seconds} s)")
    assert not [r for r in rows if r.apiserver.kind == "other"], "the API server refused a dry run for another reason"
    failing = [r for r in rows if not r.agree and (r.fail_open or not r.excepted)]
    assert not failing, "\n".join(r.line() for r in failing[:40])
