"""Quantity parsing: the time to turn one cpu quantity into millicores, ordinary ("2", "500m",
"8Gi") next to absurd ("1e300000", "1e600000", "9"*1000), for our parser (policies/k8s/quantity.py)
and for the kubernetes client's parse_quantity it replaced, as ratios.

Both sides do what to_number("cpu", ...) does, without the cache: the new side is to_number with
its lru_cache bypassed; the old side is what policies/k8s/quantity.py did before (parse_quantity,
* 1000, math.ceil). A refusal counts as a parse. The old side runs in a child process stopped
after --limit seconds per input, since "1e600000" holds it for minutes. Not a test: it asserts
nothing.

    .venv/bin/python bench/quantity.py [--seconds 0.5] [--limit 5]
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes.utils.quantity import parse_quantity  # noqa: E402

from trainjob_admission.policies.k8s import quantity  # noqa: E402

ORDINARY = ["2", "500m", "8Gi", "1.5"]
ABSURD = ["1e3000", "1e300000", "1e600000", "9" * 1000, "1_000"]


def new_side(text: str) -> str:
    try:
        return str(quantity.to_number("cpu", text))
    except quantity.QuantityError:
        return "refused"


def old_side(text: str) -> str:
    try:
        return f"{len(str(math.ceil(parse_quantity(text) * 1000)))} digits"
    except (ValueError, ArithmeticError):
        return "refused"


def per_call(side: Callable[[str], str], text: str, seconds: float, rounds: int = 5) -> tuple[float, str]:
    """Median seconds per call over ``rounds`` batches of about seconds/rounds each, and the outcome."""
    outcome = side(text)  # warm-up, and at least one call however slow
    times = []
    for _ in range(rounds):
        count, start = 0, time.perf_counter()
        deadline = start + seconds / rounds
        while count == 0 or time.perf_counter() < deadline:
            side(text)
            count += 1
        times.append((time.perf_counter() - start) / count)
    return statistics.median(times), outcome


def _old_in_child(text: str, seconds: float, conn) -> None:
    conn.send(per_call(old_side, text, seconds))


def old_with_limit(text: str, seconds: float, limit: float) -> tuple[float, str] | None:
    """per_call of the old side in a child process; None if it is still busy after ``limit`` s."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_old_in_child, args=(text, seconds, sender), daemon=True)
    child.start()
    result = receiver.recv() if receiver.poll(limit) else None
    if result is None:
        child.terminate()
    child.join()
    return result


def label(text: str) -> str:
    return repr(text) if len(text) <= 12 else f"'{text[0]}'*{len(text)}" if len(set(text)) == 1 else repr(text[:12])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="measuring time per input and side (default 0.5)")
    parser.add_argument("--limit", type=float, default=5.0, help="seconds before the old side is stopped (default 5)")
    args = parser.parse_args()
    quantity._parse_cached = quantity._parse  # time the parse, not the cache

    print(f"cpu quantity -> millicores, per call, no cache (python {sys.version.split()[0]}); "
          f"old: kubernetes client parse_quantity, stopped after {args.limit:g} s")
    print(f"{'input':<14} {'new us':>8} {'vs 2':>7} {'new result':>11} {'old us':>12} {'old/new':>10}  old result")
    base = None
    for text in ORDINARY + ABSURD:
        new, outcome = per_call(new_side, text, args.seconds)
        base = base or new
        old = old_with_limit(text, args.seconds, args.limit)
        old_us, ratio, old_outcome = ((f"{old[0] * 1e6:.1f}", f"{old[0] / new:.1f}x", old[1]) if old else
                                      (f"> {args.limit * 1e6:.0f}", f"> {args.limit / new:.0f}x", "stopped"))
        print(f"{label(text):<14} {new * 1e6:>8.1f} {new / base:>6.2f}x {outcome:>11} {old_us:>12} {ratio:>10}  {old_outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
