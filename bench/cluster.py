"""Added latency of our webhook on TrainJob creation, through the real API server.

On the test control plane (started if it is not up), `trainjob-admission serve --kubeconfig`
runs on the host and is registered for one namespace ("with"); a second namespace is not
selected by its namespaceSelector ("without"). Both get the same TrainJob (4 nodes x 1 GPU on
examples/runtimes/mpi-openmpi.yaml, suspended so no pods start), created alternately in the same
run, so both see the same API server, etcd, Trainer webhooks and machine load. Latency is the
client's create call, start to response. The service enforces the built-in default bundle,
injections included (an ECDSA P-521 key per admitted job); --key-type rsa-4096 shows what an
RSA key costs (about a second of CPU here, beyond the server's pool of ready keys).

    .venv/bin/python bench/cluster.py [-n 30] [--warmup 3] [--key-type TYPE] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from latency import percentile  # bench/, the script's own directory
from webhook.keys import KEY_TYPES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.objects import trainjob  # noqa: E402
from tests.support.service import cluster, register, start_service, unregister  # noqa: E402

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
SELECTOR_LABEL = "trainjob-admission.io/bench"


def summary(ms: list[float]) -> dict:
    return {"n": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95), "mean": statistics.fmean(ms)}


def ensure_cluster() -> None:
    if cluster.is_up():
        return
    if cluster.find_go() is None and not cluster.built():
        raise SystemExit("bench/cluster: no Go toolchain to build the control plane (set GO= or PATH)")
    if cluster.cmd_build() != 0:
        raise SystemExit("bench/cluster: building the control plane failed")
    cluster.up()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="measured creations per side (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured creations per side first (default 3)")
    ap.add_argument("--key-type", choices=KEY_TYPES,
                    help="SSH key type of the injected Secret (default: the default bundle's)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)

    from kubernetes import client, config

    ensure_cluster()
    run = uuid.uuid4().hex[:6]
    with_ns, without_ns = f"bench-{run}-with", f"bench-{run}-without"
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                           for n in (with_ns, without_ns)])
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", ROOT / "examples/runtimes/mpi-openmpi.yaml")
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(cluster.ADMIN_KUBECONFIG)))
    hook = f"bench-{run}"
    svc = None
    try:
        bundle = "builtin:default"
        doc = yaml.safe_load((ROOT / "policies/bundles/default.yaml").read_text())
        if args.key_type:
            doc["spec"]["injections"]["sshKey"]["type"] = args.key_type
            (work / "bundle.yaml").write_text(yaml.safe_dump(doc))
            bundle = str(work / "bundle.yaml")
        # a bundle selector no PolicyBundle carries: only this bundle applies
        svc = start_service(work, cluster.ADMIN_KUBECONFIG,
                            cluster.issue_serving_cert(work / "certs", name="bench-webhook"),
                            namespaces=[with_ns], args=("--bundle", bundle, "--bundle-selector", f"{SELECTOR_LABEL}={run}"))
        register(svc, hook, [with_ns])
        samples: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(args.warmup + args.n):
            order = (("with", with_ns), ("without", without_ns))
            for side, ns in (order if i % 2 == 0 else order[::-1]):  # alternate who goes first
                obj = trainjob(f"j{i}", image=None, command=None, suspend=True)  # 4 nodes x 1 GPU, no pods start
                t0 = time.perf_counter()
                api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, obj, _request_timeout=60)
                dt = (time.perf_counter() - t0) * 1000
                if i >= args.warmup:
                    samples[side].append(dt)
        served = {e: [r["latencyMs"] for r in svc.records() if r.get("namespace") == with_ns and r["endpoint"] == e]
                  for e in ("mutate", "validate")}
    finally:
        unregister(hook)
        if svc:
            svc.stop()
        cluster.kubectl("delete", "namespace", with_ns, without_ns, "--wait=false", check=False)

    w, wo = summary(samples["with"]), summary(samples["without"])
    added = {k: w[k] - wo[k] for k in ("p50", "p95", "mean")}
    result = {"key_type": doc["spec"]["injections"]["sshKey"]["type"], "with": w, "without": wo, "added": added,
              "ratio_mean": w["mean"] / wo["mean"],
              "server_ms": {e: summary(v) for e, v in served.items() if v}}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"TrainJob create through the API server, {args.n} per side, interleaved (ms); "
          f"SSH key {result['key_type']}")
    print(f"  {'':18s} {'p50':>8s} {'p95':>8s} {'mean':>8s}")
    rows = [("without webhook", wo), ("with webhook", w), ("added", added)]
    rows += [(f"  in /{e}", row) for e, row in result["server_ms"].items()]
    for label, row in rows:
        print(f"  {label:18s} {row['p50']:8.1f} {row['p95']:8.1f} {row['mean']:8.1f}")
    print(f"  ratio (mean with / without): {result['ratio_mean']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
