"""trainjob_admission_bundle_reloads_total counts every compile: bundle files the server polls and
PolicyBundles a watch thread hands to the registry (as webhook/loops/clusterbundles.py does)."""
from __future__ import annotations

import threading

import yaml

from tests.support.metrics import reloads

from .conftest import start_server, stop_server

POLICY_BUNDLE = {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
                 "metadata": {"name": "cluster-cap"},
                 "spec": {"version": "1.0.0", "validations": [{"name": "cap", "expression": "job.totals.gpus <= 64"}]}}


def from_watch_thread(fn, *args) -> None:
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    thread.join(10)


def test_policybundle_reloads_and_failures_are_counted(tmp_path):
    bundle = tmp_path / "file.yaml"
    bundle.write_text(yaml.safe_dump({**POLICY_BUNDLE, "metadata": {"name": "file-cap"}}))
    running, thread = start_server(tmp_path, bundle_specs=[str(bundle)])
    try:
        assert reloads(running.get("/metrics")[1]) == {"success": 1.0}  # the file, loaded at start
        registry = running.server.registry
        from_watch_thread(registry.update_documents, "cluster:cluster-cap", [POLICY_BUNDLE])
        assert reloads(running.get("/metrics")[1]) == {"success": 2.0}
        broken = {**POLICY_BUNDLE, "spec": {**POLICY_BUNDLE["spec"], "validations": [{"name": "cap", "expression": "job.totals.gpus <="}]}}
        from_watch_thread(registry.update_documents, "cluster:cluster-cap", [broken])
        assert reloads(running.get("/metrics")[1]) == {"success": 2.0, "failure": 1.0}
        assert sorted(b.name for b in registry.active) == ["cluster-cap", "file-cap"]  # the last good stays
    finally:
        stop_server(running, thread)
