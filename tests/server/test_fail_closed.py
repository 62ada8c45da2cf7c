"""Fail closed: no policy, no cluster sync yet, or a /validate that /mutate never changed, and the
answer is the failure mode's (or the stored object's own), never an allow-all."""
from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path

import jsonpatch
import pytest

from tests.support.objects import example_job, runtime

from .conftest import decode_patch, start_server, stop_server

pytestmark = pytest.mark.server

SECURITY_DEFAULTS = """\
apiVersion: policy.trainjob-admission.io/v1alpha1
kind: PolicyBundle
metadata: {name: restricted}
spec:
  mode: enforce
  checks:
    podSecurity: {defaultLevel: restricted}
  mutations:
    securityDefaults: {enabled: true}
"""


@pytest.fixture
def server_with(tmp_path: Path):
    """server_with(bundle_text, failure_mode="deny") -> (Running, bundle path): one server per test, serving
    the bundle file written from the text."""
    started = []

    def _start(text: str, failure_mode: str = "deny"):
        bundle = tmp_path / "bundle.yaml"
        bundle.write_text(text)
        running, thread = start_server(tmp_path, [str(bundle)])
        running.server.config.reviewer.failure_mode = failure_mode
        started.append((running, thread))
        return running, bundle

    yield _start
    for running, thread in started:
        stop_server(running, thread)


def record_of(running, response: dict) -> dict:
    return next(r for r in running.records() if r["id"] == response["auditAnnotations"]["decision-id"])


@pytest.mark.parametrize("failure_mode", ["deny", "allow"])
def test_no_bundle_compiling_at_start_is_the_failure_mode_not_allow_all(server_with, failure_mode):
    running, _ = server_with("spec: [not a bundle", failure_mode)
    validated = running.review(example_job("over-quota.yaml"))  # a job any bundle would refuse
    assert validated["allowed"] is (failure_mode == "allow")
    told = validated["status"]["message"] if failure_mode == "deny" else validated["warnings"][0]  # cut at 256
    assert "could not evaluate this job: no policy to decide with: no policy bundle loaded" in told
    record = record_of(running, validated)
    message = record["messages"][0]
    assert "fix or restore the bundle (`trainjob-admission policy lint`" in message
    assert f"failure mode is {failure_mode}" in message
    assert record["decision"] == "error" and record["allowed"] is (failure_mode == "allow")
    assert record["error"].startswith("no policy: no policy bundle loaded")
    mutated = running.review(example_job("over-quota.yaml"), "mutate")
    assert mutated["allowed"] is True and "patch" not in mutated  # never blocks, never patches without policy
    assert record_of(running, mutated)["decision"] == "error"
    status, text = running.get("/readyz")
    assert status == 503 and "no policy bundle loaded" in text


def test_a_deleted_bundle_file_denies_until_a_bundle_is_back(server_with):
    running, bundle = server_with(SECURITY_DEFAULTS)
    assert running.review(example_job("allowed.yaml"))["allowed"] is True
    bundle.unlink()
    wait_for(lambda: not running.server.registry.active)
    denied = running.review(example_job("allowed.yaml"))
    assert denied["allowed"] is False and "no policy bundle loaded" in denied["status"]["message"]
    bundle.write_text(SECURITY_DEFAULTS)
    wait_for(lambda: bool(running.server.registry.active))
    assert running.review(example_job("allowed.yaml"))["allowed"] is True


def test_an_emptied_bundle_file_keeps_its_last_good_version(server_with):
    """Emptied is what a poll sees while an editor or `cp` rewrites the file: refused, the last
    good version decides on (never "no policy", never nothing enforced)."""
    running, bundle = server_with(SECURITY_DEFAULTS)
    good = running.server.registry.active
    bundle.write_text("")
    wait_for(lambda: running.server.registry.errors)
    assert running.server.registry.active == good
    assert "holds no bundle" in next(iter(running.server.registry.errors.values()))
    assert running.review(example_job("allowed.yaml"))["allowed"] is True
    assert running.review(example_job("privileged.yaml"))["allowed"] is False  # still enforced


def test_before_the_first_cluster_sync_validate_denies(webhook_server):
    webhook_server.server.state_ready = asyncio.Event()  # as serve --kubeconfig starts: not synced yet
    response = webhook_server.review(example_job("allowed.yaml"))
    assert response["allowed"] is False
    assert "not synced yet from the API server: wait for the first sync" in response["status"]["message"]
    status, text = webhook_server.get("/readyz")
    assert status == 503 and "not synced yet" in text
    webhook_server.loop.call_soon_threadsafe(webhook_server.server.state_ready.set)
    wait_for(lambda: webhook_server.server.state_ready.is_set())
    assert webhook_server.review(example_job("allowed.yaml"))["allowed"] is True


def silent_runtime() -> dict:
    """mpi-openmpi without any securityContext: restricted only once securityDefaults fill it in."""
    obj = runtime("mpi-silent")
    for replicated in obj["spec"]["template"]["spec"]["replicatedJobs"]:
        pod_spec = replicated["template"]["spec"]["template"]["spec"]
        pod_spec.pop("securityContext", None)
        for container in pod_spec["containers"]:
            container.pop("securityContext", None)
    return obj


def test_validate_without_mutate_judges_the_object_as_it_will_be_stored(server_with):
    running, _ = server_with(SECURITY_DEFAULTS)
    running.server.state.upsert(silent_runtime())
    job = example_job("allowed.yaml", runtime="mpi-silent")

    # As the API server calls them: /mutate's patch applied, then /validate: admitted.
    patch = decode_patch(running.review(copy.deepcopy(job), "mutate"))
    assert any(op["path"] == "/spec/runtimePatches" for op in patch)
    assert running.review(jsonpatch.apply_patch(job, patch))["allowed"] is True

    # /mutate skipped (it timed out, a fail-open configuration, a later webhook undid it): the
    # stored pods would lack the defaults, so the job is refused, saying why.
    skipped = running.review(copy.deepcopy(job))
    assert skipped["allowed"] is False
    message = skipped["status"]["message"]
    assert "mutating webhook did not run for this job" in message and "/spec/runtimePatches" in message
    assert "runAsNonRoot" in message  # the stored object's own violation is reported too
    rules = {f"{r['bundle']}/{r['rule']}" for r in record_of(running, skipped)["rules"] if r["effect"] == "deny"}
    assert "trainjob-admission/mutating-webhook" in rules and "restricted/pod-security" in rules


def test_validate_without_mutate_admits_what_passes_without_the_mutations(webhook_server):
    """The default bundle's mutations (Istio off, a queue label) are not needed to pass."""
    response = webhook_server.review(example_job("allowed.yaml"))
    assert response["allowed"] is True
    assert record_of(webhook_server, response)["decision"] == "allow"


def wait_for(condition, timeout: float = 10.0) -> None:
    """Poll ``condition`` (bundle reloads and the event loop run on their own threads)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
