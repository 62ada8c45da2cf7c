"""What the service costs at a cluster's scale: idle CPU, memory, time to ready, and how long a
job's pods wait for their NetworkPolicy.

On the test control plane (started if it is not up): ``--namespaces`` namespaces, each with a
ResourceQuota and a LimitRange, and `trainjob-admission serve --kubeconfig` on the host with the
default bundle, registered for those namespaces only and reconciling cluster-wide (as a
deployment without --reconcile-namespace). Then ``--jobs`` suspended TrainJobs (no pods start)
are created in a burst, ``--concurrency`` at a time; Trainer makes each one's SSH key Secret
(the default bundle's key type is its own) and the service its NetworkPolicy once it is stored.
Printed: the service's CPU per minute of idling (from /proc/<pid>/stat) before and after the
burst, its RSS, the job's NetworkPolicy delay (from the moment the create call returned, the job
stored, to the moment a watch of NetworkPolicies run here sees the job's own: until then its
pods are isolated by the namespace's policy), and the time to /readyz after a restart with every
job in place. ``--key-type rsa-4096`` (or another type Trainer does not make) has the service
create the Secrets too, and prints how long after each job its Secret carried the job's
ownerReference (the reconciler's adoption delay).

``--source DIR`` runs the service from another checkout (e.g. a ``git worktree`` of HEAD) to
compare before and after on the same machine, one run after the other:

    flock /work/cluster.lock .venv/bin/python bench/scale.py [--namespaces 500] [--jobs 2000]
        [--idle 60] [--key-type TYPE] [--source DIR] [--json]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from cluster import SELECTOR_LABEL, ensure_cluster  # bench/, the script's own directory
from latency import percentile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainjob_admission.policies.decide import injections  # noqa: E402
from trainjob_admission.webhook.inject.keys import KEY_TYPES  # noqa: E402
from tests.support.objects import trainjob  # noqa: E402
from tests.support.serve import Serve  # noqa: E402
from tests.support.service import cert_dir, cluster, unregister  # noqa: E402

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process so far (fields 14 and 15 of /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def idle_cpu(pid: int, seconds: float) -> float:
    """CPU seconds per minute while nothing is submitted."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) * 60 / seconds


def namespace_objects(name: str, run: str) -> list[dict]:
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {SELECTOR_LABEL: run}}},
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": name},
             "spec": {"hard": {"requests.cpu": "1000", "requests.memory": "4Ti", "requests.nvidia.com/gpu": "64",
                               "count/trainjobs.trainer.kubeflow.org": "100"}}},
            {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults", "namespace": name},
             "spec": {"limits": [{"type": "Container", "default": {"cpu": "2", "memory": "4Gi"},
                                  "defaultRequest": {"cpu": "500m", "memory": "512Mi"}}]}}]


class Cluster:
    """The few calls the bench makes, through the admin kubeconfig (a pool as large as the burst)."""

    def __init__(self, pool: int):
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cluster.ADMIN_KUBECONFIG), client_configuration=cfg)
        cfg.connection_pool_maxsize = pool
        self.api = client.ApiClient(cfg)
        self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)

    def create(self, obj: dict) -> None:
        ns, kind = obj["metadata"].get("namespace"), obj["kind"]
        if kind == "Namespace":
            self.core.create_namespace(obj)
        elif kind == "ResourceQuota":
            self.core.create_namespaced_resource_quota(ns, obj)
        elif kind == "LimitRange":
            self.core.create_namespaced_limit_range(ns, obj)
        else:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, obj, _request_timeout=60)

    def watch_policies(self, prefix: str, seen: dict[tuple[str, str], float], stop: threading.Event) -> None:
        """Record in ``seen`` when each job's own NetworkPolicy (ours, ``<job>-mpi-isolation``) first
        shows in a watch, as (namespace, job) -> epoch seconds, until ``stop``."""
        from kubernetes import client, watch

        api = client.NetworkingV1Api(self.api)
        version = api.list_network_policy_for_all_namespaces(
            label_selector=f"{injections.MANAGED_BY_LABEL}={injections.MANAGED_BY}", limit=1).metadata.resource_version
        while not stop.is_set():
            stream = watch.Watch()
            for event in stream.stream(api.list_network_policy_for_all_namespaces, resource_version=version,
                                       label_selector=f"{injections.MANAGED_BY_LABEL}={injections.MANAGED_BY}",
                                       timeout_seconds=5):
                meta = event["object"].metadata
                version = meta.resource_version
                name = meta.name.removesuffix(injections.NETWORK_POLICY_SUFFIX)
                if event["type"] == "ADDED" and meta.namespace.startswith(prefix) and name != meta.name:
                    seen.setdefault((meta.namespace, name), time.time())
                if stop.is_set():
                    stream.stop()

    def adoptions(self, prefix: str) -> dict[tuple[str, str], float]:
        """(namespace, job) -> when its injected Secret got the job's ownerReference, in epoch
        seconds: the time of the managedFields entry of the reconciler's patch (whole seconds)."""
        listed = self.core.list_secret_for_all_namespaces(
            label_selector=f"{injections.MANAGED_BY_LABEL}={injections.MANAGED_BY}", _preload_content=False)
        adopted = {}
        for item in json.loads(listed.data)["items"]:
            meta = item["metadata"]
            owner = next((r["name"] for r in meta.get("ownerReferences") or [] if r["kind"] == "TrainJob"), None)
            if owner and meta["namespace"].startswith(prefix):
                adopted[(meta["namespace"], owner)] = max(_epoch(f["time"]) for f in meta.get("managedFields") or [])
        return adopted

    def job_writes(self) -> float:
        """Writes the API server has served so far to TrainJobs, JobSets and Jobs and their status
        (its own counters): what Trainer, JobSet and the Job controller still do after a burst."""
        text = cluster.kubectl("get", "--raw", "/metrics").stdout
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("apiserver_request_total{") and any(
                       f'resource="{r}"' in line for r in ("trainjobs", "jobsets", "jobs"))
                   and any(f'verb="{v}"' in line for v in ("POST", "PUT", "PATCH", "APPLY", "DELETE")))

    def job_times(self, prefix: str) -> dict[tuple[str, str], float]:
        listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return {(j["metadata"]["namespace"], j["metadata"]["name"]): _epoch(j["metadata"]["creationTimestamp"])
                for j in listed["items"] if j["metadata"]["namespace"].startswith(prefix)}


def _epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namespaces", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=20, help="creations in flight during the burst")
    ap.add_argument("--idle", type=float, default=60, help="seconds of each idle CPU measurement (default 60)")
    ap.add_argument("--settle", type=float, default=600,
                    help="at most this long (seconds) for every job's NetworkPolicy (and Secret, with --key-type) "
                         "and the controllers to settle")
    ap.add_argument("--key-type", choices=KEY_TYPES, help="the default bundle with this SSH key type "
                    "(default: its own, ecdsa-p521, which Trainer makes)")
    ap.add_argument("--source", type=Path, help="run the service from this checkout (default: this one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    ensure_cluster()
    run = uuid.uuid4().hex[:6]
    names = [f"scale-{run}-{i:03d}" for i in range(args.namespaces)]
    kube = Cluster(args.concurrency + 4)
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(lambda n: [kube.create(o) for o in namespace_objects(n, run)], names))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", ROOT / "examples/runtimes/mpi-openmpi.yaml")
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    if args.source:
        os.environ["PYTHONPATH"] = str(args.source.resolve())  # Serve passes its environment on
    bundle = "builtin:default"
    if args.key_type:
        doc = yaml.safe_load((ROOT / "policies/bundle/builtin/default.yaml").read_text())
        doc["spec"]["injections"]["sshKey"]["type"] = args.key_type
        (work / "bundle.yaml").write_text(yaml.safe_dump(doc))
        bundle = str(work / "bundle.yaml")
    crt, key, ca_pem = cluster.issue_serving_cert(work / "certs", name="bench-webhook")
    serve_args = (work, cert_dir(crt, key, work / "tls"), ca_pem, "--kubeconfig", str(cluster.ADMIN_KUBECONFIG),
                  "--client-ca", str(cluster.WEBHOOK_CLIENT_CA), "--bundle", bundle,
                  "--bundle-selector", f"{SELECTOR_LABEL}={run}")
    hook, result = f"scale-{run}", {"namespaces": args.namespaces, "jobs": args.jobs,
                                    "source": str(args.source or ROOT), "key_type": args.key_type or "ecdsa-p521"}
    svc, prefix, stop_watch = None, f"scale-{run}-", threading.Event()
    policies: dict[tuple[str, str], float] = {}
    try:
        svc = Serve(*serve_args, timeout=120)
        cluster.register_webhook(hook, svc.url, ca_pem, side_effects="NoneOnDryRun", timeout_seconds=10,
                                 namespace_selector={"matchLabels": {SELECTOR_LABEL: run}})
        pid = svc.process.pid
        result["idle_cpu_empty"] = idle_cpu(pid, args.idle)
        result["rss_empty_mib"] = rss_mib(pid)
        watcher = threading.Thread(target=kube.watch_policies, args=(prefix, policies, stop_watch), daemon=True)
        watcher.start()

        failed: list[str] = []
        stored: dict[tuple[str, str], float] = {}

        def submit(i: int) -> None:
            ns, name = names[i % len(names)], f"job-{i:05d}"
            try:
                kube.create(trainjob(name, ns, image=None, command=None, suspend=True))
                stored[(ns, name)] = time.time()
            except Exception as exc:  # noqa: BLE001 - counted and shown, the burst goes on
                failed.append(f"{ns}/{name}: {str(getattr(exc, 'body', None) or exc)[:400]}")

        t0 = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(submit, range(args.jobs)))
        result["burst_seconds"], result["failed"] = time.monotonic() - t0, failed[:3]
        cpu0, settle_end = cpu_seconds(pid), time.monotonic() + args.settle
        while time.monotonic() < settle_end and (len(policies) < len(stored) or (
                args.key_type and len(kube.adoptions(prefix)) < len(stored))):
            time.sleep(5)
        result["cpu_after_burst_s"] = cpu_seconds(pid) - cpu0
        delays = [policies[k] - stored[k] for k in stored if k in policies]
        result["policies"] = len(delays)
        result["policy_delay_s"] = ({"p50": percentile(delays, 50), "p99": percentile(delays, 99),
                                     "max": max(delays)} if delays else None)
        if args.key_type:
            adopted, created = kube.adoptions(prefix), kube.job_times(prefix)
            waits = [adopted[k] - created[k] for k in created if k in adopted]
            result["adopted"] = len(waits)
            result["adoption_delay_s"] = ({"p50": percentile(waits, 50), "p95": percentile(waits, 95),
                                           "max": max(waits)} if waits else None)
        # Idle means the cluster is: Trainer, JobSet and the Job controller work through the burst for
        # minutes after it (a JobSet, Jobs, a snapshot ConfigMap and status updates per job), and
        # every TrainJob update is an event to our watches. Measured once none of them has written
        # a TrainJob, JobSet or Job for 10 s.
        writes, quiet_since = kube.job_writes(), time.monotonic()
        while time.monotonic() - quiet_since < 10 and time.monotonic() < settle_end:
            time.sleep(2)
            if (now := kube.job_writes()) != writes:
                writes, quiet_since = now, time.monotonic()
        result["trainer_settled_s"] = time.monotonic() - t0 - result["burst_seconds"]
        result["idle_cpu_full"] = idle_cpu(pid, args.idle)
        result["rss_full_mib"] = rss_mib(pid)
        svc.stop()
        t0 = time.monotonic()
        svc = Serve(*serve_args, timeout=120)
        result["ready_after_restart_s"] = time.monotonic() - t0
        result["loadavg"] = os.getloadavg()
    finally:
        stop_watch.set()
        unregister(hook)
        if svc:
            svc.stop()
        cluster.kubectl("delete", "namespace", "-l", f"{SELECTOR_LABEL}={run}", "--wait=false", check=False)

    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    nan = {"p50": float("nan"), "p95": float("nan"), "p99": float("nan"), "max": float("nan")}
    delay = result["policy_delay_s"] or nan
    print(f"trainjob-admission at {args.namespaces} namespaces (ResourceQuota + LimitRange each), "
          f"{args.jobs} suspended TrainJobs created {args.concurrency} at a time in {result['burst_seconds']:.0f} s; "
          f"SSH key {result['key_type']}; service from {result['source']}; "
          f"load average {' '.join(f'{x:.2f}' for x in result['loadavg'])}")
    print(f"  idle CPU, no jobs:          {result['idle_cpu_empty']:6.2f} s/min   RSS {result['rss_empty_mib']:.0f} MiB")
    print(f"  idle CPU, {args.jobs} jobs:      {result['idle_cpu_full']:6.2f} s/min   RSS {result['rss_full_mib']:.0f} MiB"
          f"   (from {result['trainer_settled_s']:.0f} s after the burst: 10 s without a TrainJob, JobSet or Job write)")
    print(f"  job's NetworkPolicy, from the job stored to the policy seen (its pods isolated meanwhile): "
          f"p50 {delay['p50']:.2f} s, p99 {delay['p99']:.2f} s, max {delay['max']:.2f} s; "
          f"{result['policies']}/{args.jobs} made")
    if args.key_type:
        adoption = result["adoption_delay_s"] or nan
        print(f"  adoption delay (job creation to ownerReference on its Secret, whole seconds): p50 "
              f"{adoption['p50']:.1f} s, p95 {adoption['p95']:.1f} s, max {adoption['max']:.1f} s; "
              f"{result['adopted']}/{args.jobs} adopted")
    print(f"  CPU from the burst's end until all were made: {result['cpu_after_burst_s']:.1f} s")
    for line in result["failed"]:
        print(f"  failed: {line}")
    print(f"  ready after a restart: {result['ready_after_restart_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
