"""Engine throughput: reviews per second for the sample jobs with the default bundle against an
empty bundle (no checks, no rules, no mutations, no injections), measured side by side in one run.

The empty bundle still matches every job, so both sides pay for building the effective job; the
ratio is what the default bundle's checks, CEL rule and mutations cost on top. Rounds alternate
between the two sides so machine noise hits both alike. Not a test: it asserts nothing. Last, the
cost of 0-200 CEL rules (bench/celrules.py; run alone, it compares this tree with a committed one).

    .venv/bin/python bench/engine.py [--seconds 12]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import celrules  # noqa: E402
from trainjob_admission.policies.bundle.compile import compile_document  # noqa: E402
from trainjob_admission.policies.bundle.load import default_bundles  # noqa: E402
from trainjob_admission.policies.bundle.schema import API_VERSION, KIND  # noqa: E402
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate  # noqa: E402
from trainjob_admission.policies.k8s.clusterstate import ClusterState, load_objects  # noqa: E402

EXAMPLES = ROOT / "examples"
STATE_FILES = ["cluster-state.yaml", "runtimes/mpi-openmpi.yaml", "runtimes/mpi-privileged.yaml"]


def sample_jobs() -> list[tuple[str, dict]]:
    jobs = []
    for path in sorted((EXAMPLES / "jobs").glob("*.yaml")):
        (obj,) = load_objects(path)
        jobs.append((path.stem, obj))
    return jobs


def empty_bundle():
    return [compile_document({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "empty"}, "spec": {}},
                             "<empty>")]


def run_round(jobs, bundles, state, seconds: float) -> tuple[int, float, dict[str, list[float]]]:
    """Review every job in turn until ``seconds`` pass; returns (reviews, elapsed, per-job latencies)."""
    count, per_job = 0, {name: [] for name, _ in jobs}
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for name, obj in jobs:
            request = AdmissionInput(copy.deepcopy(obj), username="bench")
            t0 = time.perf_counter()
            evaluate(request, bundles, state)
            per_job[name].append(time.perf_counter() - t0)
            count += 1
    return count, time.perf_counter() - start, per_job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="total measuring time (default 12)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds per side (default 6)")
    parser.add_argument("--rule-seconds", type=float, default=1.5,
                        help="measuring time per CEL rule count and side (default 1.5)")
    args = parser.parse_args()

    state = ClusterState.from_objects(base_objects())
    jobs = sample_jobs()
    sides = {"default": default_bundles(), "empty": empty_bundle()}
    # Both sides must be able to decide every sample (all runtimes are in the state) before timing.
    for name, bundles in sides.items():
        for _, obj in jobs:
            evaluate(AdmissionInput(copy.deepcopy(obj)), bundles, state)
    run_round(jobs, sides["default"], state, 0.3)  # warm-up
    run_round(jobs, sides["empty"], state, 0.3)

    slice_seconds = args.seconds / (2 * args.rounds)
    totals, rates, latencies = alternate(jobs, sides, state, args.rounds, slice_seconds)

    print(f"engine reviews/s, {len(jobs)} sample jobs round-robin, {args.rounds} alternating rounds of "
          f"{slice_seconds:.1f}s per side (python {sys.version.split()[0]})")
    print(f"{'job':<18} {'default us':>11} {'empty us':>10} {'ratio':>7}")
    for job, _ in jobs:
        d = statistics.median(latencies["default"][job]) * 1e6
        e = statistics.median(latencies["empty"][job]) * 1e6
        print(f"{job:<18} {d:>11.0f} {e:>10.0f} {d / e:>6.2f}x")
    overall = {name: count / elapsed for name, (count, elapsed) in totals.items()}
    print()
    for name in sides:
        spread = f"(rounds {min(rates[name]):.0f}-{max(rates[name]):.0f})"
        print(f"{name + ' bundle':<15} {overall[name]:>9.0f} reviews/s  {spread}")
    print(f"ratio empty/default: {overall['empty'] / overall['default']:.2f}x "
          f"(the default bundle costs {overall['empty'] / overall['default']:.2f} times an empty one)")
    nodes_case(jobs, args.rounds, slice_seconds)
    kueue_case(jobs, args.rounds, slice_seconds)
    celrules.report(jobs, state, args.rule_seconds)
    return 0


def alternate(jobs, sides: dict, state, rounds: int, slice_seconds: float):
    """``rounds`` rounds of every side in turn: (totals, per-round rates, per-job latencies) per side."""
    totals = {name: [0, 0.0] for name in sides}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    latencies: dict[str, dict[str, list[float]]] = {name: {j: [] for j, _ in jobs} for name in sides}
    for _ in range(rounds):
        for name, bundles in sides.items():
            count, elapsed, per_job = run_round(jobs, bundles, state, slice_seconds)
            totals[name][0] += count
            totals[name][1] += elapsed
            rates[name].append(count / elapsed)
            for job, values in per_job.items():
                latencies[name][job].extend(values)
    return totals, rates, latencies


# Node shapes of a mixed cluster: (allocatable, labels, taints).
GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
NODE_SHAPES = [
    ({"cpu": "32", "memory": "128Gi", "pods": "110"}, {}, []),
    ({"cpu": "96", "memory": "768Gi", "nvidia.com/gpu": "8", "pods": "110"},
     {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, GPU_TAINT),
    ({"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "4", "pods": "110"},
     {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, GPU_TAINT),
    ({"cpu": "64", "memory": "256Gi", "pods": "110"}, {"node-role": "io"}, [{"key": "io", "effect": "NoSchedule"}]),
]


def cluster_objects(nodes: int = 1000, pods_per_node: int = 3) -> list[dict]:
    """``nodes`` Nodes of NODE_SHAPES in turn, and bound Pods on them (the "now" part reads them)."""
    objects = []
    for i in range(nodes):
        allocatable, labels, taints = NODE_SHAPES[i % len(NODE_SHAPES)]
        name = f"node-{i:04d}"
        objects.append({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
                        "spec": {"taints": taints}, "status": {"allocatable": allocatable}})
        objects += [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-{p}", "namespace": "other"},
                     "spec": {"nodeName": name, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
                     "status": {"phase": "Running"}} for p in range(pods_per_node)]
    return objects


def without(check: str):
    """The default bundle with one built-in check turned off, all else the same."""
    document = yaml.safe_load((ROOT / "policies/bundle/builtin/default.yaml").read_text())
    document["spec"]["checks"][check] = {"enabled": False}
    return [compile_document(document, f"<default without {check}>")]


def added_cost(jobs, rounds: int, slice_seconds: float, state: ClusterState, check: str, title: str,
               target_us: int) -> None:
    """What one check adds per review: the default bundle with and without it, on the same state.
    The warm-up pays for what is parsed once per state version; the rounds measure the rest."""
    sides = {"with": default_bundles(), "without": without(check)}
    for bundles in sides.values():
        run_round(jobs, bundles, state, 0.3)
    _, _, latencies = alternate(jobs, sides, state, rounds, slice_seconds)
    print()
    print(f"{title}: default bundle with and without it, same state")
    print(f"{'job':<18} {'with us':>9} {'without us':>11} {'added us':>9}")
    added = []
    for job, _ in jobs:
        w = statistics.median(latencies["with"][job]) * 1e6
        wo = statistics.median(latencies["without"][job]) * 1e6
        added.append(w - wo)
        print(f"{job:<18} {w:>9.0f} {wo:>11.0f} {w - wo:>9.0f}")
    print(f"added per review: median {statistics.median(added):.0f} us, most {max(added):.0f} us "
          f"(target: at most {target_us} us)")


def base_objects(*dropped: str) -> list[dict]:
    return [o for f in STATE_FILES for o in load_objects(EXAMPLES / f) if o["kind"] not in dropped]


def nodes_case(jobs, rounds: int, slice_seconds: float) -> None:
    """The schedulability pre-check over 1,000 cached Nodes (and 3,000 bound Pods)."""
    state = ClusterState.from_objects(base_objects("Node") + cluster_objects())
    added_cost(jobs, rounds, slice_seconds, state, "schedulability",
               "schedulability pre-check, 1,000 cached nodes (4 shapes) and 3,000 bound pods", 1000)


def kueue_objects(queues: int = 50, pending: int = 500) -> list[dict]:
    """``queues`` ClusterQueues in cohorts of five (GPU flavors with borrowing and lending limits),
    a LocalQueue for each in its own namespace and team-a's ``default``, and ``pending`` waiting
    workloads spread over them (counted in the queues' status, as Kueue keeps it: the service
    caches no Workload objects)."""
    kueue = "kueue.x-k8s.io/v1beta2"
    objects: list[dict] = [{"apiVersion": kueue, "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}}]
    objects += [{"apiVersion": kueue, "kind": "ResourceFlavor", "metadata": {"name": product},
                 "spec": {"nodeLabels": {"nvidia.com/gpu.product": product}}} for product in ("h100", "a100")]
    for i in range(queues):
        gpus = [{"name": product, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "16",
                                                 "borrowingLimit": "8", "lendingLimit": "8"}]}
                for product in ("h100", "a100")]
        objects.append({"apiVersion": kueue, "kind": "ClusterQueue", "metadata": {"name": f"cq-{i:02d}"},
                        "spec": {"cohortName": f"cohort-{i // 5}", "namespaceSelector": {}, "resourceGroups": [
                            {"coveredResources": ["cpu", "memory"], "flavors": [{"name": "default-flavor", "resources": [
                                {"name": "cpu", "nominalQuota": "256"}, {"name": "memory", "nominalQuota": "2Ti"}]}]},
                            {"coveredResources": ["nvidia.com/gpu"], "flavors": gpus}]},
                        "status": {"pendingWorkloads": pending // queues, "flavorsReservation": [
                            {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": str(i % 20)}]}]}})
        objects.append({"apiVersion": kueue, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": f"ns-{i:02d}"},
                        "spec": {"clusterQueue": f"cq-{i:02d}"}})
    objects.append({"apiVersion": kueue, "kind": "LocalQueue", "metadata": {"name": "default", "namespace": "team-a"},
                    "spec": {"clusterQueue": "cq-00"}})
    return objects


def kueue_case(jobs, rounds: int, slice_seconds: float) -> None:
    """The Kueue pre-check: every sample job gets team-a's default queue and is judged against it."""
    state = ClusterState.from_objects(base_objects() + kueue_objects())
    added_cost(jobs, rounds, slice_seconds, state, "kueue",
               "Kueue pre-check, 50 ClusterQueues in 10 cohorts and 500 pending workloads", 200)


if __name__ == "__main__":
    sys.exit(main())
