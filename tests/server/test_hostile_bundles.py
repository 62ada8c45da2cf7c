"""Hostile bundles against the real server: a bundle file that stops compiling (deep CEL, a YAML
bomb) never stops the certificate reloads, and a 3000-rule bundle compiles while the server answers."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from trainjob_admission.certs.issue import issue, renew
from trainjob_admission.policies.bundle.schema import API_VERSION, KIND
from tests.support.net import served_serial
from tests.support.objects import example_job
from trainjob_admission.webhook.cli.demo import admission_review

from .conftest import start_server, stop_server

pytestmark = pytest.mark.server

BOMB = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
    f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefghi", "bcdefghij"))


def with_rules(rules: list[dict], name: str = "rules") -> str:
    return yaml.safe_dump({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
                           "spec": {"validations": rules}})


def wait_for(condition, what: str, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_bundle_that_stops_compiling_never_stops_certificate_reloads(tmp_path: Path):
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(with_rules([{"name": "fine", "expression": "true", "message": "m"}]))
    running, thread = start_server(tmp_path, [str(bundle)], reload_interval=0.2)
    try:
        good = [b.digest for b in running.server.registry.active]
        issued = issue("trainjob-admission", "trainjob-admission", running.cert_dir, ip_addresses=["127.0.0.1"])
        serial = x509.load_pem_x509_certificate(issued.cert.read_bytes()).serial_number
        wait_for(lambda: served_serial(running.port) == serial, "the issued certificate was never served")
        for broken in (with_rules([{"name": "deep", "expression": "!" * 3000 + "true", "message": "m"}]), BOMB):
            bundle.write_text(broken)
            wait_for(lambda: str(bundle) in running.server.registry.errors, "the broken bundle was not rejected")
            renewed = renew(running.cert_dir)
            serial = x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number
            wait_for(lambda: served_serial(running.port) == serial, "certificate reloads stopped")
            assert [b.digest for b in running.server.registry.active] == good  # the last good bundle stays
            bundle.write_text(with_rules([{"name": "fine", "expression": "true", "message": "m"}]))
            wait_for(lambda: not running.server.registry.errors, "the fixed bundle was not taken")
    finally:
        stop_server(running, thread)


def test_a_3000_rule_bundle_compiles_off_the_request_path(tmp_path: Path):
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(with_rules([{"name": "fine", "expression": "true", "message": "m"}], name="big"))
    running, thread = start_server(tmp_path, [str(bundle), "builtin:default"], reload_interval=0.2)
    try:
        # a field of its own per rule, so no two rules share a parse (policies/cel/parse.py caches
        # the tree per shape): seconds of compiling, during which the service must keep answering
        rules = [{"name": f"r{i}", "expression": f"object.spec.trainer.numNodes <= {i + 100} || "
                                                 f"has(object.metadata.labels.l{i})", "message": "m"} for i in range(3000)]
        bundle.write_text(with_rules(rules, name="big"))
        answered = 0
        review = admission_review(example_job("allowed.yaml"))
        while not any(len(b.rules) == 3000 for b in running.server.registry.active):
            status, body = running.post("/validate", review)
            assert status == 200 and body["response"]["allowed"] is True, body
            assert running.get("/healthz") == (200, "ok")
            answered += 1
        print(f"\n{answered} reviews answered while 3000 rules compiled")
        assert answered >= 5  # compiled on the event loop, it would have answered at most one or two
        assert running.review(example_job("allowed.yaml"))["allowed"] is True  # and it now runs them all
    finally:
        stop_server(running, thread)
