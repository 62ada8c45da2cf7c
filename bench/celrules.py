"""CEL rule cost: 0, 10, 50 and 200 realistic ``job.*``/``object.*`` rules evaluated per review,
with the time to compile them: first in the process (no text compiled and no shape parsed before:
policies/cel/parse.py), again as a bundle reload (every text known), and the lark parse alone (what
rules of all-different shapes cost). bench/engine.py prints it for this tree; run alone, it puts
this tree side by side with a committed one (``--before``, default ``main``), each in its own
process, the processes interleaved round by round. Not a test: it asserts nothing.

    .venv/bin/python bench/celrules.py [--before REVISION] [--rounds 4] [--seconds 1.0]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and "--tree" in sys.argv:  # a committed tree's packages, imported ahead of this one's
    sys.path.insert(0, sys.argv[sys.argv.index("--tree") + 1])
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from bench.latency import percentile  # noqa: E402
from trainjob_admission.policies.bundle.compile import compile_document  # noqa: E402
from trainjob_admission.policies.bundle.schema import API_VERSION, KIND  # noqa: E402
from trainjob_admission.policies.cel import environment, parse  # noqa: E402
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate  # noqa: E402
from trainjob_admission.policies.k8s.clusterstate import ClusterState  # noqa: E402

# Realistic rules over the TrainJob and the effective job; {i} makes each one distinct.
RULE_TEMPLATES = [
    "job.totals.gpus <= {i} + 64",
    "!has(object.spec.trainer.numNodes) || object.spec.trainer.numNodes <= {i} + 100",
    "object.metadata.name.size() < 64 + {i} && !object.metadata.name.startsWith('tmp-{i}')",
    "!has(object.metadata.labels) || object.metadata.labels.all(k, !k.startsWith('forbidden.io/{i}'))",
    "object.spec.trainer.image.startsWith('quay.io/') || object.spec.trainer.image.contains('registry-{i}')",
    "!has(object.spec.trainer.command) || object.spec.trainer.command.exists(c, c == 'mpirun') || {i} < 0",
    "object.metadata.namespace in ['team-a', 'team-b', 'team-c', 'ns-{i}'] || "
    "object.metadata.namespace.endsWith('-dev')",
    "!has(object.spec.trainer.env) || object.spec.trainer.env.all(e, e.name.matches('^[A-Z_][A-Z0-9_]*$'))"
    " || {i} < 0",
    "!has(job.mpi.implementation) || job.mpi.implementation in ['OpenMPI', 'Intel', 'MPICH', 'x{i}']",
    "!has(object.spec.trainer.resourcesPerNode.limits) || "
    "object.spec.trainer.resourcesPerNode.limits.size() <= {i} + 8",
]
RULE_COUNTS = (0, 10, 50, 200)
SIDES = ("compiled", "cel-python")


def rule_bundle(count: int):
    rules = [{"name": f"rule-{i}", "expression": RULE_TEMPLATES[i % len(RULE_TEMPLATES)].format(i=i),
              "message": "bench", "severity": "warn"} for i in range(count)]
    return compile_document({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": f"rules-{count}"},
                             "spec": {"validations": rules}}, f"<{count} rules>")


def review_times(jobs, bundles, state, seconds: float, cpu: list[float] | None = None) -> list[float]:
    """Wall time per review; with ``cpu``, this thread's CPU time per review appended to it (on a
    loaded machine a review of a few ms is preempted, and only the CPU time shows its own cost)."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _, obj in jobs:
            request = AdmissionInput(copy.deepcopy(obj), username="bench")
            t0, c0 = time.perf_counter(), time.thread_time()
            evaluate(request, bundles, state)
            times.append(time.perf_counter() - t0)
            if cpu is not None:
                cpu.append(time.thread_time() - c0)
    return times


def measure(jobs, state, seconds: float) -> dict[int, dict[str, list[float]]]:
    """Wall and CPU time per review at each rule count, the counts interleaved in three rounds."""
    bundles = {count: [rule_bundle(count)] for count in RULE_COUNTS}
    for value in bundles.values():  # warm-up
        review_times(jobs, value, state, 0.05)
    samples: dict = {count: {"wall": [], "cpu": []} for count in RULE_COUNTS}
    for _ in range(3):
        for count, value in bundles.items():
            samples[count]["wall"] += review_times(jobs, value, state, seconds / 3, samples[count]["cpu"])
    return samples


def report(jobs, state, seconds_per_side: float) -> None:
    """Print p50 review time, reviews/s and the cost per rule at each count, and the compile times."""
    compile_ms = {}
    for count in RULE_COUNTS:
        environment.clear_caches()
        t0 = time.perf_counter()
        rule_bundle(count)
        compile_ms[count] = (time.perf_counter() - t0) * 1e3
    samples = measure(jobs, state, seconds_per_side * 2)
    print(f"\nCEL rules: {len(RULE_TEMPLATES)} templates round-robin, {len(jobs)} sample jobs")
    print(f"{'rules':>5} | {'p50 us':>7} {'cpu us':>7} {'reviews/s':>9} {'us/rule':>7} | {'compile ms':>10}")
    base = percentile(samples[0]["wall"], 50)
    for count in RULE_COUNTS:
        wall = samples[count]["wall"]
        p50 = percentile(wall, 50)
        per_rule = (p50 - base) / count * 1e6 if count else 0.0
        print(f"{count:>5} | {p50 * 1e6:>7.0f} {percentile(samples[count]['cpu'], 50) * 1e6:>7.0f} "
              f"{len(wall) / sum(wall):>9.0f} {per_rule:>7.1f} | {compile_ms[count]:>10.1f}")
    compile_report(RULE_COUNTS[-1])
    variables_report(jobs, state, seconds_per_side)


# One costly value (the GPUs of the worker pod sets) that 20 rules need: written out in each rule,
# or computed once as a bundle variable (evaluated lazily, at most once per review).
SHARED = "job.podSets.filter(p, p.role == 'worker').map(p, p.gpus * p.count).sum()"


def shared_value_bundle(variables: bool, count: int = 20):
    value = "variables.workerGpus" if variables else SHARED
    spec: dict = {"validations": [{"name": f"r{i}", "expression": f"{value} <= {i} + 64", "message": "bench",
                                   "severity": "warn"} for i in range(count)]}
    if variables:
        spec["variables"] = [{"name": "workerGpus", "expression": SHARED}]
    return compile_document({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "shared"}, "spec": spec},
                            "<shared>")


def variables_report(jobs, state, seconds: float, rounds: int = 3) -> None:
    """p50 review time of 20 rules reading one computed value: written out in each rule against
    read from ``variables`` (the sides interleaved)."""
    sides = {"inline": [shared_value_bundle(False)], "variables": [shared_value_bundle(True)]}
    times: dict = {side: [] for side in sides}
    for _ in range(rounds):
        for side, bundles in sides.items():
            times[side] += review_times(jobs, bundles, state, seconds / rounds)
    inline, shared = (percentile(times[side], 50) * 1e6 for side in sides)
    print(f"20 rules reading one computed value: written in each rule {inline:.0f} us, a variable {shared:.0f} us "
          f"per review ({inline / shared:.2f}x)")


def compile_report(count: int) -> None:
    """The compile time of ``count`` rules as a bundle reload (every shape known) and the lark
    parse of the same texts alone (a parse per rule: what rules of all-different shapes cost)."""
    t0 = time.perf_counter()
    rule_bundle(count)
    reload_ms = (time.perf_counter() - t0) * 1e3
    texts = [r.expression.source for r in rule_bundle(count).rules]
    t0 = time.perf_counter()
    for text in texts:
        parse.lark_parse(text)
    parse_ms = (time.perf_counter() - t0) * 1e3
    print(f"compile {count} rules: {reload_ms:.1f} ms as a reload; the lark parse alone {parse_ms:.1f} ms "
          f"({parse_ms / count:.2f} ms per rule of a new shape)")


# --- this tree against a committed one, each in its own process ---------------------------------

ROOT = Path(__file__).resolve().parents[1]


def child(tree: str | None, seconds: float) -> None:
    """Measure in this process (the packages of ``tree`` ahead of this one's) and print JSON."""
    from bench.engine import base_objects, sample_jobs
    rule_bundle(1)  # what a process pays once (imports, tables) is not the compile's
    environment.clear_caches()
    times = []
    for _ in range(2):  # a first compile of the rules (no text or shape seen), then a reload
        t0 = time.perf_counter()
        rule_bundle(RULE_COUNTS[-1])
        times.append((time.perf_counter() - t0) * 1e3)
    samples = measure(sample_jobs(), ClusterState.from_objects(base_objects()), seconds)
    json.dump({"compile": times} | {str(count): value for count, value in samples.items()}, sys.stdout)


def unpack(revision: str, scratch: str) -> str:
    """``git archive REVISION`` of the packages, where ``import trainjob_admission`` finds them first."""
    tree = Path(scratch, "before")
    into = tree / "trainjob_admission"
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision, "webhook", "policies", "certs"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return str(tree)


def side_by_side(revision: str, rounds: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-celrules-") as scratch:
        sides = {"this tree": None, revision: unpack(revision, scratch)}
        merged: dict = {side: {count: {"wall": [], "cpu": []} for count in RULE_COUNTS} for side in sides}
        compiles: dict = {side: [] for side in sides}
        for _ in range(rounds):
            for side, tree in sides.items():
                argv = [sys.executable, __file__, "--child", "--seconds", str(seconds)] + (["--tree", tree] if tree else [])
                found = json.loads(subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True).stdout)
                compiles[side].append(found["compile"])
                for count in RULE_COUNTS:
                    for key in ("wall", "cpu"):
                        merged[side][count][key] += found[str(count)][key]
    print(f"CEL rules, {rounds} rounds of one process per side, interleaved; p50 per review (us) and per rule")
    print(f"{'rules':>5} | {'this tree':>9} {'cpu':>6} {'us/rule':>7} | {revision[:9]:>9} {'cpu':>6} {'us/rule':>7} | "
          f"{'ratio':>5}")
    base = {side: percentile(merged[side][0]["cpu"], 50) for side in sides}
    for count in RULE_COUNTS:
        cells, cpu = [], {}
        for side in sides:
            wall, cpu[side] = (percentile(merged[side][count][key], 50) for key in ("wall", "cpu"))
            per_rule = (cpu[side] - base[side]) / count * 1e6 if count else 0.0
            cells.append(f"{wall * 1e6:>9.0f} {cpu[side] * 1e6:>6.0f} {per_rule:>7.1f}")
        mine, theirs = (cpu[side] for side in sides)
        print(f"{count:>5} | {cells[0]} | {cells[1]} | {theirs / mine:>5.2f}")
    print("(us/rule from CPU time, the 0-rule review taken off; ratio: the committed tree's CPU time over this one's)")
    first, reload = ({side: statistics.median(t[i] for t in compiles[side]) for side in sides} for i in (0, 1))
    mine, theirs = sides
    print(f"compile {RULE_COUNTS[-1]} rules, median ms: first {first[mine]:.0f} here, {first[theirs]:.0f} {theirs} "
          f"({first[mine] / first[theirs]:.2f}x); reload {reload[mine]:.0f} here, {reload[theirs]:.0f} {theirs} "
          f"({reload[mine] / reload[theirs]:.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="main", metavar="REVISION", help="the committed tree to compare with")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=1.0, help="per rule count, side and round")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.tree, args.seconds)
    else:
        side_by_side(args.before, args.rounds, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
