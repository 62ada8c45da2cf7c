"""Auditor tools' throughput: records/s of `decisions verify` and `decisions query` over a log of
60,000 demo-sized records (about 1.8 KB each, some 105 MB), this tree's code side by side with
the committed one (``git show HEAD:webhook/decisionlog/...``, loaded as a module of its own).

The log is written once by the real writer (no fsync per record). `verify` walks the whole chain;
`query` is what the command does: filter (here: refusals of one user, a few hundred records),
render the table and verify what it read. Not a test: it asserts nothing.

    .venv/bin/python bench/decisionlog.py [--records 60000] [--rounds 3] [--no-baseline]
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainjob_admission.webhook import decisionlog  # noqa: E402
from trainjob_admission.webhook.decisionlog import DecisionLog  # noqa: E402

MODULES = ("__init__", "lines", "query", "verify", "writer", "anchor", "checkpoint")
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]


def record(i: int) -> dict:
    """A record shaped like the demo's (a validate or mutate review of a TrainJob, six rules)."""
    user, denied = USERS[i % len(USERS)], i % 7 == 0
    message = f"job needs 32 nvidia.com/gpu (7 workers x 4 + 1 launcher x 4); quota \"compute\" in team-{i % 13} " \
              "allows 32 and 24 are in use"
    rules = [{"bundle": "default", "effect": "deny" if denied and rule == "quota" else "allow",
              "messages": [message] if denied and rule == "quota" else [],
              "result": "fail" if denied and rule == "quota" else "pass", "rule": rule}
             for rule in ("quota", "gpu-limits", "job-shape", "pod-security", "limit-range", "max-job-gpus")]
    return {
        "allowed": not denied, "decision": "deny" if denied else "allow",
        "bundles": [{"digest": "sha256:" + "7d" * 32, "name": "default", "version": "1.0.0"}],
        "caller": {"address": "10.0.0.1", "authenticated": True, "subject": "kube-apiserver"},
        "dryRun": False, "endpoint": "validate" if i % 2 else "mutate",
        "groups": ["system:authenticated", f"team-{i % 13}"], "id": str(uuid.UUID(int=i)),
        "injections": [], "kind": "TrainJob", "latencyMs": 1.12, "messages": [message] if denied else [],
        "name": f"bert-large-{i}", "namespace": f"team-{i % 13}", "operation": "CREATE",
        "patch": [] if i % 2 else [{"op": "add", "path": "/spec/runtimePatches"}],
        "job": {"cpu": 32000, "cpuLimits": 0, "gpus": 32, "gpusByResource": {"nvidia.com/gpu": 32},
                "limits": {"nvidia.com/gpu": 32}, "memory": 274877906944, "memoryLimits": 0, "pods": 8,
                "requests": {"cpu": 32000, "memory": 274877906944, "nvidia.com/gpu": 32}},
        "rules": rules, "uid": str(uuid.UUID(int=i + 1 << 64)), "user": user, "warnings": [],
    }


def write_log(path: Path, count: int) -> None:
    with DecisionLog(path, stdout=None, max_bytes=1 << 40, fsync_interval=3600, replica="bench") as log:
        for i in range(count):
            log.append(record(i))


def baseline() -> ModuleType:
    """The committed webhook/decisionlog as the package ``decisionlog_head``."""
    package = Path(tempfile.mkdtemp(prefix="bench-decisionlog-")) / "decisionlog_head"
    package.mkdir()
    for name in MODULES:
        source = subprocess.run(["git", "show", f"HEAD:webhook/decisionlog/{name}.py"], cwd=ROOT, check=True,
                                capture_output=True).stdout
        (package / f"{name}.py").write_bytes(source)
    sys.path.insert(0, str(package.parent))
    return importlib.import_module("decisionlog_head")


def best(rounds: int, run: Callable[[], object]) -> float:
    """The fastest of ``rounds`` runs, in CPU seconds of this process (the least disturbed by
    whatever else the machine runs)."""
    times = []
    for _ in range(rounds):
        started = time.process_time()
        run()
        times.append(time.process_time() - started)
    return min(times)


def tools(module: ModuleType, files: list[Path]) -> dict[str, Callable[[], object]]:
    def verify() -> None:
        assert module.verify(files).ok

    def query() -> None:
        if hasattr(module, "scan"):  # one pass: filter while the chain is walked
            records: list[dict] = []
            report = module.scan(files, module.Filters(user="alice", decision="deny"), records.append)
            module.render(records, "table")
            assert report.ok
        else:  # the command before: filter, render, then verify in a second read
            module.render(module.query(files, user="alice", decision="deny"), "table")
            assert module.verify(files).ok

    return {"verify": verify, "query": query}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3, help="runs per tool; the fastest counts (default 3)")
    parser.add_argument("--no-baseline", action="store_true", help="time this tree's code only")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-decisionlog-") as tmp:
        path = Path(tmp) / "decisions.jsonl"
        started = time.perf_counter()
        write_log(path, args.records)
        size = path.stat().st_size
        print(f"{args.records} records, {size / 1e6:.0f} MB, written in {time.perf_counter() - started:.1f}s "
              f"(python {sys.version.split()[0]}); records per CPU second, fastest of {args.rounds} runs")
        files = decisionlog.log_files(path)
        sides = {"this tree": tools(decisionlog, files)}
        if not args.no_baseline:
            sides["HEAD"] = tools(baseline(), files)
        print(f"{'tool':<8}" + "".join(f"{side + ' rec/s':>18}" for side in sides) + f"{'speed-up':>10}")
        for tool in ("verify", "query"):
            rates = [args.records / best(args.rounds, side[tool]) for side in sides.values()]
            ratio = f"{rates[0] / rates[1]:>9.1f}x" if len(rates) > 1 else ""
            print(f"{tool:<8}" + "".join(f"{rate:>18,.0f}" for rate in rates) + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
