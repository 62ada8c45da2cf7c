"""Server latency: p50/p95/p99 and achieved throughput of the real webhook over TLS at fixed
open-loop request rates, for the default bundle and an allow-all bundle side by side in one run.

Each side is its own ``trainjob-admission serve`` process (real TLS from ``certs issue``, the
decision log written to a file with serve's default periodic fsync and copied to stdout, which
goes to /dev/null), so the load generator here never shares a GIL with the server. Both sides run the same code path; the
allow-all bundle matches every job but has no checks, rules, mutations or injections, so the
ratio is what the default bundle's policy work costs on top of parsing, the effective job,
logging and TLS.

The request is what the API server sends for a 4-worker MPI TrainJob on
examples/runtimes/mpi-openmpi.yaml in team-a (examples/cluster-state.yaml): /mutate gets the
submitted object, /validate gets the object with the default bundle's patch applied (as the API
server calls validating webhooks after mutation). The two endpoints are measured separately,
each at the full rate; one submission through the API server costs one of each.

Open loop: request i is due at start + i/rate whatever happened before, and its latency runs
from that due time to the last byte of the answer, so a slow server's queue shows in the
figures (no coordinated omission). Clients keep connections alive, as the API server does.

At 200 req/s a third server runs the default bundle with ``--log-fsync-interval 0`` (each record
fsynced before its answer): what the strict durability mode costs on this disk.

    .venv/bin/python bench/server.py [--rates 50,200,500] [--duration 8] [--json]
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import jsonpatch  # noqa: E402
import yaml  # noqa: E402

from trainjob_admission.certs.issue import IssuedCerts, issue  # noqa: E402
from trainjob_admission.policies.bundle.schema import API_VERSION, KIND  # noqa: E402
from tests.support.serve import Serve  # noqa: E402
from trainjob_admission.webhook.cli.demo import admission_review  # noqa: E402

from latency import percentile  # noqa: E402 - bench/, the script's own directory

EXAMPLES = ROOT / "examples"
STATE_FILES = [EXAMPLES / "cluster-state.yaml", EXAMPLES / "runtimes" / "mpi-openmpi.yaml"]
JOB_FILE = EXAMPLES / "jobs" / "allowed.yaml"
ENDPOINTS = ("mutate", "validate")
TARGET_RATE, TARGET_P99_MS = 200, 25.0
TARGET_JOB_CPU_MS = 5.0  # issue 33: this process's CPU per admitted job
STRICT = "default, fsync per record"


@dataclass
class Phase:
    side: str
    endpoint: str
    rate: int
    sent: int
    ok: int
    failed: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    throughput: float
    cpu_ms: float  # server process CPU time per answered request: the cost, whatever the machine's load


def serve(workdir: Path, name: str, bundle: str, certs: IssuedCerts, *extra: str) -> Serve:
    """``trainjob-admission serve`` on 127.0.0.1 with a free port, as its own process."""
    state = [flag for path in STATE_FILES for flag in ("--cluster-state", str(path))]
    return Serve(workdir, certs.cert.parent, certs.ca_cert.read_bytes(), "--bundle", bundle, *state, *extra, name=name)


def cpu_seconds(server: Serve) -> float:
    """User + system CPU time of the server process so far (Linux /proc)."""
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def allow_all_bundle(path: Path) -> str:
    path.write_text(yaml.safe_dump({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "allow-all"},
                                    "spec": {"description": "bench baseline: matches every job, decides nothing"}}))
    return str(path)


def bodies(obj: dict, count: int) -> list[bytes]:
    """Distinct AdmissionReviews (fresh uid each), encoded once so the client spends no time on it."""
    template = admission_review(obj)
    out = []
    for _ in range(count):
        template["request"]["uid"] = str(uuid.uuid4())
        out.append(json.dumps(template).encode())
    return out


async def mutated_job(session: aiohttp.ClientSession, base: str, obj: dict) -> dict:
    """The object as /validate sees it: the submitted job with our /mutate patch applied."""
    async with session.post(f"{base}/mutate", data=bodies(obj, 1)[0]) as reply:
        answer = (await reply.json())["response"]
    if not answer.get("patch"):
        raise RuntimeError(f"expected a patch from /mutate for {JOB_FILE.name}, got {answer}")
    return jsonpatch.apply_patch(obj, json.loads(base64.b64decode(answer["patch"])))


async def run_phase(session: aiohttp.ClientSession, url: str, payloads: list[bytes], rate: int, duration: float,
                    expect: bytes) -> tuple[list[float], int, float]:
    """Send at ``rate``/s for ``duration`` s on schedule; returns latencies (s), failures, span (s)."""
    loop = asyncio.get_running_loop()
    total = max(1, int(rate * duration))
    latencies: list[float] = []
    failed = 0
    last_done = 0.0

    async def one(body: bytes, due: float) -> None:
        nonlocal failed, last_done
        try:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as reply:
                answer = await reply.read()
            if reply.status != 200 or expect not in answer:
                failed += 1
                return
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            failed += 1
            return
        done = loop.time()
        latencies.append(done - due)
        last_done = max(last_done, done)

    start = loop.time() + 0.05
    tasks = []
    for i in range(total):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(payloads[i % len(payloads)], due)))
    await asyncio.gather(*tasks)
    return latencies, failed, max(last_done - start, total / rate)


async def measure(args: argparse.Namespace, workdir: Path) -> list[Phase]:
    certs = issue("trainjob-admission", "bench", workdir / "tls", ip_addresses=["127.0.0.1"])
    sides = {
        "default": serve(workdir, "default", "builtin:default", certs),
        "allow-all": serve(workdir, "allow-all", allow_all_bundle(workdir / "allow-all.yaml"), certs),
        STRICT: serve(workdir, "strict", "builtin:default", certs, "--log-fsync-interval", "0"),
    }
    tls = ssl.create_default_context(cafile=str(certs.ca_cert))
    obj = yaml.safe_load(JOB_FILE.read_text())
    timeout = aiohttp.ClientTimeout(total=30)
    phases: list[Phase] = []
    try:
        sessions = {name: aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=tls, limit=args.connections, keepalive_timeout=60), timeout=timeout)
            for name in sides}
        try:
            base = {name: server.url for name, server in sides.items()}
            validated = await mutated_job(sessions["default"], base["default"], obj)
            payloads = {"mutate": bodies(obj, 64), "validate": bodies(validated, 64)}
            # Every answer must be 200 and allowed; the default bundle's /mutate must also patch.
            expect = {("default", "mutate"): b'"patch"', ("allow-all", "mutate"): b'"allowed":true'}
            for name in sides:  # warm up: open the connection pool and the code paths
                for endpoint in ENDPOINTS:
                    await run_phase(sessions[name], f"{base[name]}/{endpoint}", payloads[endpoint], 100, 1.0, b"")
            for rate in args.rates:
                for endpoint in ENDPOINTS:
                    for name in sides:
                        if name == STRICT and rate != TARGET_RATE:
                            continue
                        want = expect.get((name, endpoint), b'"allowed":true')
                        cpu_before = cpu_seconds(sides[name])
                        latencies, failed, span = await run_phase(
                            sessions[name], f"{base[name]}/{endpoint}", payloads[endpoint], rate, args.duration, want)
                        cpu = cpu_seconds(sides[name]) - cpu_before
                        ms = [v * 1000 for v in latencies]
                        phases.append(Phase(name, endpoint, rate, len(latencies) + failed, len(latencies), failed,
                                            percentile(ms, 50), percentile(ms, 95), percentile(ms, 99),
                                            max(ms, default=float("nan")), len(latencies) / span,
                                            cpu * 1000 / max(len(latencies), 1)))
                        await asyncio.sleep(args.pause)
        finally:
            for session in sessions.values():
                await session.close()
    finally:
        for server in sides.values():
            server.stop()
    return phases


def report(phases: list[Phase], args: argparse.Namespace) -> str:
    by = {(p.side, p.endpoint, p.rate): p for p in phases}
    lines = [f"webhook over TLS, open loop, {args.duration:g} s per phase, {args.connections} keep-alive connections; "
             f"job {JOB_FILE.relative_to(ROOT)} (4 workers, mpi-openmpi, team-a); "
             f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
             "latency in ms from each request's scheduled send time; cpu = server CPU ms per request; "
             "'ratio' = default p99 / allow-all p99",
             "decision log fsync on this disk: p50 {:.2f} ms, p99 {:.2f} ms, max {:.1f} ms (only the strict mode's "
             "answers wait for it; --log-dir moves the logs)".format(*args.fsync_ms), "",
             "default and allow-all: serve's default decision log (written before each answer, fsynced every 0.1 s)",
             "",
             f"{'endpoint':<9} {'rate/s':>6} | {'default p50':>11} {'p95':>6} {'p99':>6} {'req/s':>6} {'cpu':>4} {'fail':>4} | "
             f"{'allow-all p50':>13} {'p95':>6} {'p99':>6} {'req/s':>6} {'cpu':>4} {'fail':>4} | {'ratio':>5}"]
    for endpoint in ENDPOINTS:
        for rate in args.rates:
            d, a = by[("default", endpoint, rate)], by[("allow-all", endpoint, rate)]
            lines.append(f"{endpoint:<9} {rate:>6} | {d.p50_ms:>11.1f} {d.p95_ms:>6.1f} {d.p99_ms:>6.1f} "
                         f"{d.throughput:>6.0f} {d.cpu_ms:>4.1f} {d.failed:>4} | {a.p50_ms:>13.1f} {a.p95_ms:>6.1f} "
                         f"{a.p99_ms:>6.1f} {a.throughput:>6.0f} {a.cpu_ms:>4.1f} {a.failed:>4} | {d.p99_ms / a.p99_ms:>4.1f}x")
    lines += ["", "CPU per admitted job (one /mutate and one /validate, as the API server sends them), ms:"]
    for rate in args.rates:
        per_job = {side: sum(by[(side, e, rate)].cpu_ms for e in ENDPOINTS) for side in ("default", "allow-all")}
        lines.append(f"{'job':<9} {rate:>6} | default {per_job['default']:>4.1f}   allow-all {per_job['allow-all']:>4.1f}"
                     f"   ratio {per_job['default'] / per_job['allow-all']:.2f}x")
    if TARGET_RATE in args.rates:
        per_job = sum(by[("default", e, TARGET_RATE)].cpu_ms for e in ENDPOINTS)
        lines.append(f"target: default bundle CPU per admitted job at {TARGET_RATE} req/s <= {TARGET_JOB_CPU_MS:g} ms: "
                     f"{'met' if per_job <= TARGET_JOB_CPU_MS else 'MISSED'} ({per_job:.1f} ms)")
        lines += ["", f"{STRICT} (--log-fsync-interval 0), {TARGET_RATE} req/s; 'ratio' = its p99 / the default's p99:"]
        for endpoint in ENDPOINTS:
            d, s = by[("default", endpoint, TARGET_RATE)], by[(STRICT, endpoint, TARGET_RATE)]
            lines.append(f"{endpoint:<9} {TARGET_RATE:>6} | {s.p50_ms:>11.1f} {s.p95_ms:>6.1f} {s.p99_ms:>6.1f} "
                         f"{s.throughput:>6.0f} {s.cpu_ms:>4.1f} {s.failed:>4} | {s.p99_ms / d.p99_ms:>4.1f}x")
        worst = max(by[("default", e, TARGET_RATE)].p99_ms for e in ENDPOINTS)
        verdict = "met" if worst < TARGET_P99_MS else "MISSED"
        lines += ["", f"target: default bundle p99 at {TARGET_RATE} req/s < {TARGET_P99_MS:g} ms: {verdict} "
                      f"(worst endpoint {worst:.1f} ms)"]
    return "\n".join(lines)


def fsync_latency(directory: Path, samples: int = 200) -> tuple[float, float, float]:
    """(p50, p99, max) ms of appending a record-sized line and fsyncing it in ``directory``: the
    floor under every decision-log write, measured before the servers start."""
    path, times = directory / "fsync-probe", []
    with open(path, "ab") as probe:
        for _ in range(samples):
            probe.write(b"x" * 600 + b"\n")
            probe.flush()
            started = time.perf_counter()
            os.fsync(probe.fileno())
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.002)
    path.unlink()
    return percentile(times, 50), percentile(times, 99), max(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="50,200,500", help="requests/s per phase, comma-separated (default 50,200,500)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per phase (default 8)")
    parser.add_argument("--connections", type=int, default=32, help="client keep-alive connection pool (default 32)")
    parser.add_argument("--pause", type=float, default=0.5, help="idle seconds between phases (default 0.5)")
    parser.add_argument("--log-dir", metavar="DIR",
                        help="where the servers write their decision logs (default: the system temp dir); "
                             "the strict side fsyncs per record, so this disk's fsync latency is part of its answers")
    parser.add_argument("--json", action="store_true", help="print the phases as JSON only")
    args = parser.parse_args()
    args.rates = [int(r) for r in args.rates.split(",") if r.strip()]
    with tempfile.TemporaryDirectory(prefix="trainjob-admission-bench-", dir=args.log_dir) as tmp:
        args.fsync_ms = fsync_latency(Path(tmp))
        phases = asyncio.run(measure(args, Path(tmp)))
    if args.json:
        print(json.dumps({"durationSeconds": args.duration, "connections": args.connections,
                          "phases": [asdict(p) for p in phases]}, indent=2))
    else:
        print(report(phases, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
