"""The CLI's start time: wall time of whole processes of the console script (`--help`, every
command's `--help`, `review` of a sample job), interleaved round by round with baselines started
the same way: `python -c pass` from the venv and `kubectl version --client` (hack/cluster/bin).
Medians of wall time (the goals) and of CPU time (user + system: less moved by other work on a
busy machine), and each command's ratio to the baselines. Not a test: it asserts nothing.

The processes keep their bytecode (in a temporary PYTHONPYCACHEPREFIX) as an installed package
does (pip compiles it at install); with PYTHONDONTWRITEBYTECODE, as in some CI shells, every
module of this tree would be compiled again at every start. The CEL parser cache is a temporary
XDG_CACHE_HOME, filled by the warm-up round.

    .venv/bin/python bench/cli.py [--rounds 15] [--before [REVISION]]

--before also times `--help` and `review` of a committed tree (``git archive REVISION``, default
HEAD, imported ahead of this one by ``python -c``), in the same rounds.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "trainjob-admission"
KUBECTL = sorted((ROOT / "hack" / "cluster" / "bin").glob("kubectl-*"))
REVIEW = ["review", "-f", "examples/jobs/allowed.yaml", "--cluster-state", "examples/cluster-state.yaml",
          "--cluster-state", "examples/runtimes/mpi-openmpi.yaml"]
HELPS = [[], ["review"], ["policy"], ["policy", "lint"], ["policy", "test"], ["policy", "explain"], ["serve"],
         ["demo"], ["decisions"], ["decisions", "query"], ["decisions", "report"], ["decisions", "verify"], ["certs"],
         ["certs", "issue"], ["certs", "checkpoint-key"]]
GOALS = {"--help": 0.2, "review": 0.3}  # seconds, issue 16


def baselines() -> dict[str, list[str]]:
    """Name -> argv of the processes the CLI is compared with."""
    found = {"python -c pass": [sys.executable, "-c", "pass"]}
    if KUBECTL:
        found["kubectl version --client"] = [str(KUBECTL[-1]), "version", "--client"]
    return found


def commands() -> dict[str, list[str]]:
    """Name -> argv of the CLI's processes: every --help, and review."""
    found = {" ".join([*words, "--help"]): [str(SCRIPT), *words, "--help"] for words in HELPS}
    # /proc takes no directory: the parser cache is neither read nor written, its tables are built each time
    return found | {"review": [str(SCRIPT), *REVIEW],
                    "review, no CEL parser cache": ["env", "XDG_CACHE_HOME=/proc/no-cache", str(SCRIPT), *REVIEW]}


def cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one process, fork to exit; an unexpected exit status stops the bench
    (it would time an error)."""
    start, used = time.perf_counter(), cpu()
    result = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed, used = time.perf_counter() - start, cpu() - used
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.decode()[-500:]}")
    return elapsed, used


def committed(scratch: str, revision: str) -> dict[str, list[str]]:
    """`--help` and `review` of a committed tree, unpacked under ``scratch``. Trees from before the
    packages moved under the ``trainjob_admission`` namespace (webhook/cli.py at the top) are
    imported as they were then, so the bench compares across the move."""
    tree = Path(scratch, "before")
    flat = subprocess.run(["git", "cat-file", "-e", f"{revision}:webhook/cli.py"], cwd=ROOT,
                          capture_output=True).returncode == 0
    into = tree if flat else tree / "trainjob_admission"
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision, "webhook", "policies", "certs"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    module = "webhook.cli" if flat else "trainjob_admission.webhook.cli.main"
    launch = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tree)!r}); from {module} import main; "
                                    "sys.exit(main())"]
    return {f"--help ({revision})": [*launch, "--help"], f"review ({revision})": [*launch, *REVIEW]}


def measure(runs: dict[str, list[str]], env: dict[str, str], rounds: int) -> tuple[dict, dict]:
    """Wall and CPU seconds of each command, ``rounds`` times, interleaved: a busy moment slows
    every command alike."""
    for argv in runs.values():  # warm: bytecode written, the parser cache filled, files in the page cache
        run(argv, env)
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, argv in runs.items():
            elapsed, used = run(argv, env)
            times[name].append(elapsed)
            cpus[name].append(used)
    return times, cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--before", nargs="?", const="HEAD", metavar="REVISION",
                        help="also time a committed tree (default HEAD), e.g. the commit before a change")
    args = parser.parse_args()
    bases, ours = baselines(), commands()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as scratch:
        runs = bases | ours | (committed(scratch, args.before) if args.before else {})
        env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
        env |= {"PYTHONPYCACHEPREFIX": f"{scratch}/pyc", "XDG_CACHE_HOME": f"{scratch}/cache"}
        times, cpus = measure(runs, env, args.rounds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{args.rounds} rounds, interleaved; medians (ms) of wall and CPU time, wall-time ratios to the baselines")
    print(f"{'command':42} {'wall':>6} {'max':>6} {'cpu':>6}  " + "  ".join(f"x {b.split()[0]:>7}" for b in bases))
    for name, values in times.items():
        ratios = "  ".join(f"{medians[name] / medians[b]:9.1f}" for b in bases)
        print(f"{name:42} {medians[name] * 1e3:6.0f} {max(values) * 1e3:6.0f} "
              f"{statistics.median(cpus[name]) * 1e3:6.0f}  {ratios}")
    helps = [medians[name] for name in ours if name.endswith("--help")]
    print(f"slowest --help median {max(helps) * 1e3:.0f} ms (goal {GOALS['--help'] * 1e3:.0f}); "
          f"review median {medians['review'] * 1e3:.0f} ms (goal {GOALS['review'] * 1e3:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
