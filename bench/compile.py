"""Bundle compile time, this tree against a committed one, side by side: 10, 50 and 200 of
bench/celrules.py's realistic rules compiled into a bundle (the first compile in a fresh process,
no text or shape seen before, then again as a reload), each round in new processes of both trees,
interleaved. Lint's type checking and cost estimation are part of a compile. Not a test: it
asserts nothing.

    .venv/bin/python bench/compile.py [--before main] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.celrules import RULE_TEMPLATES  # noqa: E402

COUNTS = (10, 50, 200)
# Run in a fresh process with the tree to time first on sys.path; prints {count: [first ms, reload ms]}.
PROBE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from trainjob_admission.policies.bundle.compile import compile_document
from trainjob_admission.policies.cel import environment
templates, counts = json.loads(sys.argv[2]), json.loads(sys.argv[3])
def bundle(count):
    rules = [{"name": f"rule-{i}", "expression": templates[i % len(templates)].format(i=i), "message": "bench"}
             for i in range(count)]
    return {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
            "metadata": {"name": f"rules-{count}"}, "spec": {"validations": rules}}
compile_document(bundle(1), "<warm-up>")  # imports and one-time tables, as a server has them
out = {}
for count in counts:
    environment.clear_caches()
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        compile_document(bundle(count), "<bench>")
        times.append((time.perf_counter() - t0) * 1e3)
    out[count] = times
print(json.dumps(out))
"""


def unpack(revision: str, scratch: str) -> Path:
    tree = Path(scratch, revision.replace("/", "_"))
    (tree / "trainjob_admission").mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision, "policies", "webhook", "certs"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree / "trainjob_admission")], input=archive, check=True)
    return tree


def probe(tree: Path) -> dict[str, list[float]]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(tree), json.dumps(RULE_TEMPLATES), json.dumps(COUNTS)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="the committed tree to compare with (default main)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"this tree": ROOT, args.before: unpack(args.before, scratch)}
        samples: dict = {(side, str(c), phase): [] for side in trees for c in COUNTS for phase in (0, 1)}
        for _ in range(args.rounds):
            for side, tree in trees.items():
                for count, times in probe(tree).items():
                    for phase, ms in enumerate(times):
                        samples[(side, count, phase)].append(ms)
    print(f"bundle compile, median of {args.rounds} rounds (ms), the trees interleaved")
    print(f"{'rules':>5} | {'first: this':>11} {args.before:>8} {'ratio':>6} | {'reload: this':>12} {args.before:>8} {'ratio':>6}")
    for count in COUNTS:
        cells = []
        for phase in (0, 1):
            ours = statistics.median(samples[("this tree", str(count), phase)])
            theirs = statistics.median(samples[(args.before, str(count), phase)])
            cells.append(f"{ours:>{11 if phase == 0 else 12}.1f} {theirs:>8.1f} {ours / theirs:>5.2f}x")
        print(f"{count:>5} | {cells[0]} | {cells[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
