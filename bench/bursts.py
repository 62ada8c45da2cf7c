"""Bursts of TrainJobs against ResourceQuotas, decided by 1, 2 or 3 replicas of the service, on the
test control plane (started if it is not up): how many are admitted, how many gangs are left
half-created, and what a create costs.

Two namespaces, each with a ResourceQuota of 8 GPUs (`requests.nvidia.com/gpu: 8`) and the
default bundle; each job is 2 pods x 1 GPU (examples/runtimes/mpi-openmpi.yaml), so 4 fit per
namespace. A burst of B jobs (B/2 per namespace) is released at once from B threads; KWOK keeps
the pods running so they hold the quota. The replicas run as installed (their own user with the
manifests' roles) and the API server splits the requests between them by a matchCondition on the
job name's last digit, as a Service would spread them. After each round the admitted jobs' pods
are counted (a gang is half-created when it has fewer pods than it needs once the others are
whole, or after 60 s), then every job is deleted and the round ends when the quotas count
nothing again.

    flock /work/cluster.lock .venv/bin/python bench/bursts.py [--replicas 1 2 3] [--bursts 16 64] [--rounds 5] [--json]

Each configuration's line: rounds, admitted per round (mean, max; the quotas hold 8), rounds with
more admitted than fit, half-created gangs in all, and the create latency seen by the client
(p50, p95, max; refusals included). Not a test: the figures go to docs/architecture.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

from latency import percentile  # bench/, the script's own directory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.bursts import (  # noqa: E402
    FITS, PODS_PER_JOB, QUOTA, QUOTA_GPUS, SETTLE_SECONDS, burst, free, gangs, namespace_objects, split, user_api,
)
from tests.support.install import CRD, CRD_FILE  # noqa: E402
from tests.support.objects import runtime  # noqa: E402
from tests.support.service import cluster, default_bundle_for, ensure_cluster, replicas_as_installed  # noqa: E402

LABEL = "trainjob-admission.io/bench-bursts"
WRITES = "trainjob_admission_reservation_writes_total"


def configuration(api, work: Path, replicas: int, bursts: list[int], rounds: int, run: str) -> list[dict]:
    namespaces = [f"bursts-{run}-r{replicas}-{i}" for i in range(2)]
    cluster.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {LABEL: run}}}
                           for ns in namespaces])
    cluster.apply_objects([obj for ns in namespaces for obj in (*namespace_objects(ns), default_bundle_for(ns, LABEL, run))])
    rows = []
    (work / f"r{replicas}").mkdir(parents=True)
    try:
        with replicas_as_installed(work / f"r{replicas}", f"bursts-{run}-r{replicas}", namespaces, f"{LABEL}={run}",
                                   split(replicas)) as services:
            for size in bursts:
                before = {r: metric(services, f'{WRITES}{{result="{r}"}}') for r in ("written", "released", "conflict")}
                row = {"replicas": replicas, "burst": size, "rounds": rounds, "admitted": [], "over": 0,
                       "half_created": 0, "latency_ms": [], "refusals": Counter()}
                for rnd in range(rounds):
                    # tens to one namespace, then the other: each sees every last digit, so every replica
                    results = burst(api, [(namespaces[i // 10 % 2], f"b{size}-{rnd}-{i:03d}") for i in range(size)])
                    admitted = [job for job, created in results.items() if created.admitted]
                    pods = gangs(namespaces, admitted)
                    row["admitted"].append(len(admitted))
                    row["over"] += any(sum(1 for ns, _ in admitted if ns == n) > FITS for n in namespaces)
                    row["half_created"] += sum(1 for job in admitted if pods[job] != PODS_PER_JOB)
                    row["latency_ms"] += [created.ms for created in results.values()]
                    row["refusals"].update("quota" if f'quota "{QUOTA}"' in created.refusal else created.refusal[:80]
                                           for created in results.values() if not created.admitted)
                    free(namespaces)
                row.update({f"ledger_{r}": metric(services, f'{WRITES}{{result="{r}"}}') - n for r, n in before.items()})
                rows.append(row)
                print(line(row), flush=True)
    finally:
        cluster.kubectl("delete", "namespace", *namespaces, "--wait=false", check=False)
        for ns in namespaces:
            cluster.kubectl("delete", "policybundle", ns, "--ignore-not-found", check=False)
    return rows


def metric(services, prefix: str) -> float:
    """The sum over the replicas of a counter so far."""
    total = 0.0
    for svc in services:
        _, text = svc.call("/metrics", base=svc.probe_url)
        total += sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefix))
    return total


def line(row: dict) -> str:
    ms = row["latency_ms"]
    other = sum(n for why, n in row["refusals"].items() if why != "quota")
    return (f"  {row['replicas']:>8} {row['burst']:>5} {row['rounds']:>6} {statistics.fmean(row['admitted']):>9.1f} "
            f"{max(row['admitted']):>4} {row['over']:>9} {row['half_created']:>12} {other:>7} {percentile(ms, 50):>7.0f} "
            f"{percentile(ms, 95):>7.0f} {max(ms):>7.0f} {row['ledger_written']:>8.0f} {row['ledger_released']:>8.0f} "
            f"{row['ledger_conflict']:>9.0f}")


HEADER = (f"  {'replicas':>8} {'burst':>5} {'rounds':>6} {'admitted':>9} {'max':>4} {'over-runs':>9} "
          f"{'half-created':>12} {'other':>7} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7} {'written':>8} {'released':>8} "
          f"{'conflicts':>9}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3], help="replica counts (default 1 2 3)")
    ap.add_argument("--bursts", type=int, nargs="+", default=[16, 64], help="jobs per burst (default 16 64)")
    ap.add_argument("--rounds", type=int, default=5, help="bursts per configuration (default 5)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON at the end")
    args = ap.parse_args(argv)

    ensure_cluster()
    api = user_api(max(args.bursts))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(runtime()))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", CRD_FILE)  # the bundles the replicas serve
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD}")
    run = uuid.uuid4().hex[:6]
    work = Path(tempfile.mkdtemp(prefix="bench-bursts-"))
    print(f"Bursts of TrainJobs (2 pods x 1 GPU) across 2 namespaces, each quota {QUOTA_GPUS} GPUs ({FITS} jobs fit "
          f"per namespace, {2 * FITS} in all); per configuration {args.rounds} rounds")
    print(HEADER)
    rows = []
    for replicas in args.replicas:
        rows += configuration(api, work, replicas, args.bursts, args.rounds, run)
    print("  admitted: per round, mean and max (quotas hold 8); over-runs: rounds where a namespace got more than "
          f"{FITS}; half-created: admitted gangs without all their pods after {SETTLE_SECONDS} s; other: refusals "
          "not for quota (failure mode: the API server too slow); latency: the client's create, refusals included; "
          "written, released, conflicts: reservation ledger writes of all replicas")
    if args.json:
        print(json.dumps([{**r, "refusals": dict(r["refusals"]), "latency_ms": None,
                           "p50": percentile(r["latency_ms"], 50), "p95": percentile(r["latency_ms"], 95)}
                          for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
