"""Added latency of our webhook on TrainJob creation, through the real API server.

On the test control plane (started if it is not up), `trainjob-admission serve --kubeconfig`
runs on the host and is registered for one namespace ("with"); a second namespace is not
selected by its namespaceSelector ("without"). Both get the same TrainJob (4 nodes x 1 GPU on
examples/runtimes/mpi-openmpi.yaml, suspended so no pods start), created alternately in the same
run, so both see the same API server, etcd, Trainer webhooks and machine load. Latency is the
client's create call, start to response. The service enforces the built-in default bundle,
injections included (Trainer makes the ECDSA P-521 key, the service the job's NetworkPolicy once
it is stored: no write during admission); --key-type rsa-4096 has the service create the Secret
at admission and shows what an RSA key costs (about a second of CPU here, beyond the server's
pool of ready keys).

    .venv/bin/python bench/cluster.py [-n 30] [--warmup 3] [--key-type TYPE] [--quota] [--json]

--quota puts a ResourceQuota (requests.nvidia.com/gpu, room for every job) in both namespaces and
creates the jobs running instead of suspended, so each admission in "with" takes its quota
reservation in the namespace's ledger Lease (webhook/admission/ledger.py): the cost of that write
beside the same run's figures, and the ledger writes per admitted job (from the service's metrics).

--peers compares, in the same way and run, no policy, a ValidatingAdmissionPolicy, our webhook, our
webhook without injections (a second service: the webhook calls and checks alone), Kyverno
(bench/peers.py: the default bundle's checks each peer can express) and Kyverno adding the patch
our /mutate gives the same job as well (called twice per create, as ours), sequentially and in bursts
of 20, counts each one's webhook calls per create (the API server's metrics), and shows each one's
verdict on the same good and bad TrainJobs:

    flock /work/cluster.lock .venv/bin/python bench/cluster.py --peers [-n 30] [--bursts 3] [--pause S] [--build-kyverno]

Our webhook is registered under a name that sorts where the installed configuration's does
(`trainjob-admission...`, after Kueue's and Trainer's): the API server calls mutating webhooks in
the order of their configurations' names, so the work between our /mutate and /validate is what an
install sees. Each admitted job sets off work in the controllers (Trainer builds a JobSet and the
SSH key Secret, JobSet its Jobs, the service the job's NetworkPolicy), which on 2 cores overlaps
the next create: --pause S waits S seconds after each sequential create, so each meets a settled
cluster, as one user's submission does; without it the creates queue behind the previous jobs' work.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from latency import percentile  # bench/, the script's own directory
from trainjob_admission.policies.job.runtimepatch import OWN_MANAGER
from trainjob_admission.webhook.inject.keys import KEY_TYPES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.objects import trainjob  # noqa: E402
from tests.support.service import cluster, ensure_cluster, register, start_service, unregister  # noqa: E402

import peers as peers_mod  # noqa: E402  (bench/)

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
SELECTOR_LABEL = "trainjob-admission.io/bench"


def summary(ms: list[float]) -> dict:
    return {"n": len(ms), "p50": percentile(ms, 50), "p95": percentile(ms, 95), "mean": statistics.fmean(ms)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="measured creations per side (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured creations per side first (default 3)")
    ap.add_argument("--key-type", choices=KEY_TYPES,
                    help="SSH key type of the injected Secret (default: the default bundle's)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--quota", action="store_true",
                    help="a ResourceQuota in both namespaces and running jobs: each admission writes the ledger")
    ap.add_argument("--peers", action="store_true",
                    help="compare no policy, ValidatingAdmissionPolicy, our webhook and Kyverno (if built)")
    ap.add_argument("--bursts", type=int, default=3, help=f"with --peers: bursts of {BURST} per configuration")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="with --peers: seconds to wait after each sequential create (and x20 after a burst) "
                         "so the next meets a settled cluster (default 0: back to back)")
    ap.add_argument("--build-kyverno", action="store_true",
                    help="with --peers: build Kyverno first if it is not (tens of minutes, one CPU)")
    args = ap.parse_args(argv)
    if args.peers:
        return peers(args)

    from kubernetes import client, config

    ensure_cluster()
    run = uuid.uuid4().hex[:6]
    with_ns, without_ns = f"bench-{run}-with", f"bench-{run}-without"
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                           for n in (with_ns, without_ns)])
    if args.quota:  # room for every job: 4 GPUs each
        cluster.apply_objects([{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": n},
                                "spec": {"hard": {"requests.nvidia.com/gpu": str(4 * (args.warmup + args.n))}}}
                               for n in (with_ns, without_ns)])
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", ROOT / "examples/runtimes/mpi-openmpi.yaml")
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(cluster.ADMIN_KUBECONFIG)))
    hook = f"trainjob-admission-bench-{run}"  # sorts where the installed configuration does (module doc)
    svc = None
    try:
        bundle = "builtin:default"
        doc = yaml.safe_load((ROOT / "policies/bundle/builtin/default.yaml").read_text())
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
                # 4 nodes x 1 GPU; suspended, no pods start (with --quota they do: it takes quota)
                obj = trainjob(f"j{i}", image=None, command=None, suspend=not args.quota)
                t0 = time.perf_counter()
                api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, obj, _request_timeout=60)
                dt = (time.perf_counter() - t0) * 1000
                if i >= args.warmup:
                    samples[side].append(dt)
        served = {e: [r["latencyMs"] for r in svc.records() if r.get("namespace") == with_ns and r["endpoint"] == e]
                  for e in ("mutate", "validate")}
        metrics = svc.call("/metrics", base=svc.probe_url)[1]
        ledger = {result: sum(float(x.rsplit(" ", 1)[1]) for x in metrics.splitlines() if x.startswith(
            f'trainjob_admission_reservation_writes_total{{result="{result}"}}')) for result in ("written", "conflict")}
        admitted = sum(1 for r in svc.records() if r.get("namespace") == with_ns and r["endpoint"] == "validate"
                       and r.get("allowed"))
    finally:
        unregister(hook)
        if svc:
            svc.stop()
        cluster.kubectl("delete", "namespace", with_ns, without_ns, "--wait=false", check=False)

    w, wo = summary(samples["with"]), summary(samples["without"])
    added = {k: w[k] - wo[k] for k in ("p50", "p95", "mean")}
    result = {"key_type": doc["spec"]["injections"]["sshKey"]["type"], "with": w, "without": wo, "added": added,
              "ratio_mean": w["mean"] / wo["mean"],
              "server_ms": {e: summary(v) for e, v in served.items() if v},
              "quota": args.quota, "admitted": admitted, "ledger_writes": ledger}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"TrainJob create through the API server, {args.n} per side, interleaved (ms); "
          f"SSH key {result['key_type']}" + ("; a quota in both namespaces, jobs running" if args.quota else
                                             "; jobs suspended"))
    print(f"  {'':18s} {'p50':>8s} {'p95':>8s} {'mean':>8s}")
    rows = [("without webhook", wo), ("with webhook", w), ("added", added)]
    rows += [(f"  in /{e}", row) for e, row in result["server_ms"].items()]
    for label, row in rows:
        print(f"  {label:18s} {row['p50']:8.1f} {row['p95']:8.1f} {row['mean']:8.1f}")
    print(f"  ratio (mean with / without): {result['ratio_mean']:.2f}x")
    print(f"  reservation ledger writes: {ledger['written']:.0f} for {admitted} admitted jobs "
          f"({ledger['conflict']:.0f} conflicts)")
    return 0


# ---------------------------------------------------------------------------------------------
# --peers: no policy, ValidatingAdmissionPolicy, our webhook and Kyverno (bench/peers.py), each
# in its own namespace selected by only its own policy or webhook; the same TrainJobs created in
# turn across them (the order rotates), one at a time and then in bursts of BURST at once.
# ---------------------------------------------------------------------------------------------
BURST = 20
PEER_LABELS = {"none": "no policy", "vap": "ValidatingAdmissionPolicy", "webhook": "our webhook",
               "checks": "our webhook, no injections",
               "kyverno": f"Kyverno {cluster.OWN_MODULES['kyverno']['version']}",
               "kyverno-patch": "Kyverno, our patch too"}


def _create(api, ns: str, obj: dict) -> float:
    t0 = time.perf_counter()
    api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, obj, _request_timeout=60)
    return (time.perf_counter() - t0) * 1000


def _burst(api, ns: str, prefix: str) -> list[float]:
    """BURST creations released together; each one's own latency."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    start = Barrier(BURST)

    def one(k: int) -> float:
        obj = trainjob(f"{prefix}-{k}", image=None, command=None, suspend=True)
        start.wait()
        return _create(api, ns, obj)

    with ThreadPoolExecutor(BURST) as pool:
        return list(pool.map(one, range(BURST)))


def _verdict(api, ns: str, obj: dict) -> str:
    """'admit', or 'deny: <the API server's message>' for a dry-run create."""
    from kubernetes.client.exceptions import ApiException

    try:
        api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, obj, dry_run="All", _request_timeout=30)
        return "admit"
    except ApiException as e:
        if e.status not in (400, 403, 422):
            raise
        try:
            return "deny: " + json.loads(e.body)["message"]
        except (TypeError, ValueError, KeyError):
            return f"deny: {e.reason}"


def _our_patch(api, svc, ns: str, timeout: float = 90) -> list[dict]:
    """The JSON patch our /mutate gives the bench's job in ``ns`` (a dry run, read back from the
    service's decision log), once the service answers for that namespace."""
    job = trainjob("patch-probe", image=None, command=None, suspend=True)
    deadline = time.monotonic() + timeout
    while True:
        if _verdict(api, ns, job) == "admit":
            patches = [r.get("patch") for r in svc.records()
                       if r.get("endpoint") == "mutate" and r.get("namespace") == ns and r.get("name") == "patch-probe"]
            if patches and patches[-1]:
                return patches[-1]
        if time.monotonic() > deadline:
            raise SystemExit(f"bench/cluster: no patch from our /mutate for {ns} within {timeout:.0f} s")
        time.sleep(0.5)


def _wait_patching(api, ns: str, timeout: float = 90) -> None:
    """Until a job created in ``ns`` (a dry run) comes back with our runtimePatches entry: Kyverno
    registers its mutating webhook on its own time, after its validating one."""
    from kubernetes.client.exceptions import ApiException

    job = trainjob("patch-wait", image=None, command=None, suspend=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stored = api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job, dry_run="All",
                                                         _request_timeout=30)
        except ApiException as e:  # its webhook registered before its serving certificate is (500)
            if e.status < 500:
                raise
            stored = {"spec": {}}
        if any(p.get("manager") == OWN_MANAGER for p in stored["spec"].get("runtimePatches") or []):
            return
        time.sleep(0.5)
    raise SystemExit(f"bench/cluster: the policy for {ns} does not patch within {timeout:.0f} s")


def _wait_enforcing(api, ns: str, timeout: float = 90) -> None:
    """Until the namespace's policy denies a job it must deny: policies take effect asynchronously,
    and Kyverno registers its webhooks before its serving certificate exists (the API server then
    answers 500 for a few seconds)."""
    from kubernetes.client.exceptions import ApiException

    bad = next(obj for obj, admitted in peers_mod.CASES.values() if not admitted)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _verdict(api, ns, bad) != "admit":
                return
        except ApiException as e:
            if e.status < 500 or time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise SystemExit(f"bench/cluster: the policy for {ns} does not deny within {timeout:.0f} s")
        time.sleep(0.5)


def peers(args) -> int:
    from kubernetes import client, config

    ensure_cluster()
    if args.build_kyverno:
        cluster.build_own_module("kyverno")
    kyverno_built = cluster.own_module_binary("kyverno").exists()
    configs = ["none", "vap", "webhook", "checks"] + (["kyverno", "kyverno-patch"] if kyverno_built else [])
    run = uuid.uuid4().hex[:6]
    ns = {c: f"bench-{run}-{c}" for c in configs}
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cluster.ADMIN_KUBECONFIG), client_configuration=cfg)
    cfg.connection_pool_maxsize = BURST + 4
    api = client.CustomObjectsApi(client.ApiClient(cfg))
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in ns.values()])
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", ROOT / "examples/runtimes/mpi-openmpi.yaml")
    name, hook = f"bench-{run}", f"trainjob-admission-bench-{run}"  # hook: sorts as installed (module doc)
    vap = peers_mod.vap_objects(name, ns["vap"])
    # The same service and bundle without its Secret and NetworkPolicy: what the two webhook calls
    # and the checks cost, apart from the creations (a second process and registration of its own).
    doc = yaml.safe_load((ROOT / "policies/bundle/builtin/default.yaml").read_text())
    doc["spec"]["injections"] = {"sshKey": {"enabled": False}, "networkPolicy": {"template": "none"}}
    (work / "checks.yaml").write_text(yaml.safe_dump(doc))
    svc = checks = kyverno = None
    try:
        cluster.apply_objects(vap)
        cert = cluster.issue_serving_cert(work / "certs", name="bench-webhook")
        svc = start_service(work, cluster.ADMIN_KUBECONFIG, cert, namespaces=[ns["webhook"]],
                            args=("--bundle", "builtin:default", "--bundle-selector", f"{SELECTOR_LABEL}={run}"))
        register(svc, hook, [ns["webhook"]])
        (work / "checks").mkdir()
        checks = start_service(work / "checks", cluster.ADMIN_KUBECONFIG, cert, namespaces=[ns["checks"]],
                               args=("--bundle", str(work / "checks.yaml"),
                                     "--bundle-selector", f"{SELECTOR_LABEL}={run}"))
        register(checks, f"{hook}-checks", [ns["checks"]])
        if "kyverno" in ns:
            # the second policy also mutates, with the patch our /mutate gave the bench's job: two calls
            # per create, as ours (our webhook is registered, so its dry run records that patch)
            patch = _our_patch(api, svc, ns["webhook"])
            kyverno = peers_mod.Kyverno(work, [peers_mod.kyverno_policy(name, ns["kyverno"]),
                                               peers_mod.kyverno_policy(f"{name}-patch", ns["kyverno-patch"], patch)])
            kyverno.start()
        for c in configs[1:]:
            _wait_enforcing(api, ns[c])
        if "kyverno-patch" in ns:
            _wait_patching(api, ns["kyverno-patch"])
        verdicts = {case: {c: _verdict(api, ns[c], obj) for c in configs}
                    for case, (obj, _) in peers_mod.CASES.items()}
        seq: dict[str, list[float]] = {c: [] for c in configs}
        ours = {"webhook": svc, "checks": checks}
        calls_before = _webhook_calls()
        cpu = {c: _cpu_seconds(service.process.pid) for c, service in ours.items()}
        for i in range(args.warmup + args.n):
            for c in configs[i % len(configs):] + configs[:i % len(configs)]:
                dt = _create(api, ns[c], trainjob(f"s{i}", image=None, command=None, suspend=True))
                if i >= args.warmup:
                    seq[c].append(dt)
                time.sleep(args.pause)
        # our processes' CPU per created job, all it did meanwhile included (watch events, the job's NetworkPolicy)
        cpu_per_job = {"sequential": {c: (_cpu_seconds(service.process.pid) - cpu[c]) * 1000 / (args.warmup + args.n)
                                      for c, service in ours.items()}}
        served = _served(svc, ns["webhook"])
        burst: dict[str, list[float]] = {c: [] for c in configs}
        cpu = {c: _cpu_seconds(service.process.pid) for c, service in ours.items()}
        for r in range(args.bursts):
            for c in configs[r % len(configs):] + configs[:r % len(configs)]:
                burst[c] += _burst(api, ns[c], f"b{r}")
                time.sleep(args.pause * BURST)
        cpu_per_job[f"concurrent{BURST}"] = {c: (_cpu_seconds(service.process.pid) - cpu[c]) * 1000
                                             / (args.bursts * BURST) for c, service in ours.items()}
        served_burst = {e: ms[len(served[e]):] for e, ms in _served(svc, ns["webhook"]).items()}
        calls = _webhook_calls()
        creates = args.warmup + args.n + args.bursts * BURST  # per configuration
        calls_per_create = {f"{name} ({kind})": round((count - calls_before.get((name, kind), 0)) / creates, 2)
                            for (name, kind), count in sorted(calls.items())
                            if count > calls_before.get((name, kind), 0) and not name.endswith(".kb.io")}
        load = os.getloadavg()
    finally:
        try:
            unregister(hook)
            unregister(f"{hook}-checks")
            cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name,
                            "--ignore-not-found", check=False)
            cluster.kubectl("delete", "namespace", *ns.values(), "--wait=false", check=False)
        finally:
            for service in (svc, checks):
                if service:
                    service.stop()
            if kyverno:
                kyverno.stop()

    def figures(ms: list[float], base: list[float]) -> dict:
        p50, p90 = percentile(ms, 50), percentile(ms, 90)
        return {"n": len(ms), "p50": p50, "p90": p90, "ratio_p50": p50 / percentile(base, 50),
                "ratio_p90": p90 / percentile(base, 90)}

    result = {"loadavg": load, "pause": args.pause,
              "sequential": {c: figures(seq[c], seq["none"]) for c in configs},
              f"concurrent{BURST}": {c: figures(burst[c], burst["none"]) for c in configs},
              "webhook_server_ms": {"sequential": {e: summary(ms) for e, ms in served.items() if ms},
                                    f"concurrent{BURST}": {e: summary(ms) for e, ms in served_burst.items() if ms}},
              "cpu_ms_per_job": cpu_per_job, "webhook_calls_per_create": calls_per_create, "verdicts": verdicts}
    print(json.dumps(result, indent=1) if args.json else "\n".join(peers_table(result, configs, args)))
    return 0


def _webhook_calls() -> dict[tuple[str, str], float]:
    """The API server's admission webhook calls so far on CREATE, by webhook name and type (admit:
    mutating, validating), from its apiserver_admission_webhook_admission_duration_seconds_count."""
    counts: dict[tuple[str, str], float] = {}
    metric = "apiserver_admission_webhook_admission_duration_seconds_count{"
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith(metric):
            labels = dict(item.split("=", 1) for item in line[len(metric):line.index("}")].split(","))
            labels = {k: v.strip('"') for k, v in labels.items()}
            if labels.get("operation") == "CREATE":
                key = (labels.get("name", ""), labels.get("type", ""))
                counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (fields 14 and 15 of /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _served(svc, namespace: str) -> dict[str, list[float]]:
    """Our service's own latency per endpoint so far (its decision log), for the namespace's jobs."""
    records = [r for r in svc.records() if r.get("namespace") == namespace]
    return {e: [r["latencyMs"] for r in records if r["endpoint"] == e] for e in ("mutate", "validate")}


def peers_table(result: dict, configs: list[str], args) -> list[str]:
    load, verdicts = result["loadavg"], result["verdicts"]
    out = [f"TrainJob create through the API server, same TrainJobs, interleaved (ms); "
           f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
           f"  {'':27s} {'sequential':>26s}   {f'{BURST} concurrent':>26s}",
           f"  {'':27s}" + f" {'p50':>7s} {'p90':>7s} {'x none':>10s}  " * 2]
    for c in configs:
        row = "".join(f" {f['p50']:7.1f} {f['p90']:7.1f} {f['ratio_p50']:4.2f}/{f['ratio_p90']:4.2f}  "
                      for f in (result["sequential"][c], result[f"concurrent{BURST}"][c]))
        out.append(f"  {PEER_LABELS[c]:27s}{row}")
    out += [f"  (n = {args.n} sequential and {args.bursts} x {BURST} concurrent per configuration; "
            f"x none = p50/p90 over no policy's; {args.pause:g} s pause after each sequential create)"]
    for mode, endpoints in result["webhook_server_ms"].items():
        out.append(f"  inside our webhook, {mode}: " + ", ".join(
            f"/{e} p50 {f['p50']:.1f} p95 {f['p95']:.1f}" for e, f in endpoints.items()))
    for mode, by_config in result["cpu_ms_per_job"].items():
        out.append(f"  our process's CPU per created job, {mode}: " + ", ".join(
            f"{PEER_LABELS[c]} {ms:.1f} ms" for c, ms in by_config.items()))
    out.append("  webhook calls per create, Trainer's and JobSet's (*.kb.io) apart, from the API server's metrics: " + ", ".join(
        f"{name} {n:.2f}" for name, n in result["webhook_calls_per_create"].items()))
    out += ["Same inputs, dry-run: admitted (A) or denied (D); the default bundle's verdict first",
            f"  {'':24s} {'bundle':>7s}" + "".join(f" {c:>8s}" for c in configs)]
    differ = []
    for case, (_, admitted) in peers_mod.CASES.items():
        marks = ["A" if verdicts[case][c] == "admit" else "D" for c in configs]
        out.append(f"  {case:24s} {'A' if admitted else 'D':>7s}" + "".join(f" {m:>8s}" for m in marks))
        differ += [f"  differs: {case} / {c}: {verdicts[case][c]}" for c, m in zip(configs, marks)
                   if c != "none" and (m == "A") != admitted]
    if "kyverno" not in configs:
        differ.append(f"  Kyverno: not built ({cluster.own_module_binary('kyverno')}); --build-kyverno builds it")
    return out + differ

if __name__ == "__main__":
    sys.exit(main())
