"""CEL rule cost for bench/engine.py: 0, 10, 50 and 200 realistic ``job.*``/``object.*`` rules
evaluated by the compiled closures (policies/cel/compiled.py) and by cel-python's interpreter (the
baseline), the sides interleaved in the same run, with the time to compile the rules: first in the
process (no text compiled and no shape parsed before: policies/cel/parse.py), again as a bundle
reload (every text known), and cel-python's parse alone (what rules of all-different shapes cost)."""
from __future__ import annotations

import copy
import dataclasses
import time

import celpy

from bench.latency import percentile
from trainjob_admission.policies.bundle.compile import compile_document
from trainjob_admission.policies.bundle.schema import API_VERSION, KIND
from trainjob_admission.policies.cel import environment
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate

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


def on_cel_python(bundle):
    """``bundle`` with every rule on cel-python's interpreter (the compiled closures dropped)."""
    def reference(expression):
        return expression and dataclasses.replace(expression, fast=None)
    return dataclasses.replace(bundle, rules=tuple(
        dataclasses.replace(r, expression=reference(r.expression), message_expression=reference(r.message_expression))
        for r in bundle.rules))


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


def report(jobs, state, seconds_per_side: float, rounds: int = 3) -> None:
    """Print p50 review time, reviews/s and the cost per rule at each count, both sides."""
    compile_ms = {}
    bundles = {}
    for count in RULE_COUNTS:
        environment.clear_caches()
        t0 = time.perf_counter()
        bundles[count] = rule_bundle(count)
        compile_ms[count] = (time.perf_counter() - t0) * 1e3
    sides = {(count, "compiled"): [bundles[count]] for count in RULE_COUNTS}
    sides.update({(count, "cel-python"): [on_cel_python(bundles[count])] for count in RULE_COUNTS})
    for value in sides.values():  # warm-up
        review_times(jobs, value, state, 0.05)
    samples: dict = {key: [] for key in sides}
    cpu: dict = {key: [] for key in sides}
    for _ in range(rounds):
        for key, value in sides.items():
            samples[key] += review_times(jobs, value, state, seconds_per_side / rounds, cpu[key])
    print(f"\nCEL rules: {len(RULE_TEMPLATES)} templates round-robin, {len(jobs)} sample jobs, sides interleaved")
    print(f"{'rules':>5} | {'compiled p50 us':>15} {'cpu us':>7} {'reviews/s':>9} {'us/rule':>7} | "
          f"{'cel-python p50 us':>17} {'cpu us':>7} {'reviews/s':>9} {'us/rule':>7} | {'compile ms':>10}")
    base = {side: percentile(samples[(0, side)], 50) for side in SIDES}
    for count in RULE_COUNTS:
        cells = []
        for side, width in zip(SIDES, (15, 17)):
            p50 = percentile(samples[(count, side)], 50)
            rate = len(samples[(count, side)]) / sum(samples[(count, side)])
            per_rule = (p50 - base[side]) / count * 1e6 if count else 0.0
            cpu_p50 = percentile(cpu[(count, side)], 50)
            cells.append(f"{p50 * 1e6:>{width}.0f} {cpu_p50 * 1e6:>7.0f} {rate:>9.0f} {per_rule:>7.1f}")
        print(f"{count:>5} | {cells[0]} | {cells[1]} | {compile_ms[count]:>10.1f}")
    top, low = RULE_COUNTS[-1], RULE_COUNTS[1]
    marginal = [(percentile(samples[(top, side)], 50) - percentile(samples[(low, side)], 50)) / (top - low) * 1e6
                for side in SIDES]
    print(f"per rule from {low} to {top} rules (the variables' conversion, paid once per review, left out): "
          f"compiled {marginal[0]:.1f} us, cel-python {marginal[1]:.1f} us")
    compile_report(top)
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
    """The compile time of ``count`` rules as a bundle reload (every shape known) and cel-python's
    parse of the same texts alone (a lark parse per rule: what rules of all-different shapes cost)."""
    t0 = time.perf_counter()
    rule_bundle(count)
    reload_ms = (time.perf_counter() - t0) * 1e3
    texts = [r.expression.source for r in rule_bundle(count).rules]
    environment = celpy.Environment()
    t0 = time.perf_counter()
    for text in texts:
        environment.compile(text)
    parse_ms = (time.perf_counter() - t0) * 1e3
    print(f"compile {count} rules: {reload_ms:.1f} ms as a reload; cel-python's parse alone {parse_ms:.1f} ms "
          f"({parse_ms / count:.2f} ms per rule of a new shape)")
