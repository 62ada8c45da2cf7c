"""Hostile decision logs (issue 30): whoever can write a log file can put any line in it. A line
nested 100,000 levels deep made `serve` exit with RecursionError at start-up (a replica crash-looped
on its own log) and `decisions verify`, `query` and `report` crash with a traceback; `verify` read
each file whole (844 MB peak for one 200 MB line). Now every reader reports an unparsable, too-deep
or too-long line as malformed with its line number and goes on, reading a line at a time."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainjob_admission.webhook.decisionlog import DecisionLog
from trainjob_admission.webhook.decisionlog.lines import MAX_LINE_BYTES

from tests.support.flood import rss_bytes
from tests.support.objects import example_job
from trainjob_admission.webhook.cli.demo import admission_review

from .test_bounded_work import serve

pytestmark = pytest.mark.server

CLI = Path(sys.executable).parent / "trainjob-admission"
DEEP = b'{"a":' + b"[" * 100_000
GARBAGE = b'{"seq": 3, "prev": "x", not json'


def good_log(path: Path, records: int = 3) -> list[dict]:
    with DecisionLog(path, stdout=None, replica="r1") as log:
        return [log.append({"id": f"d{i}", "endpoint": "validate", "decision": "allow", "namespace": "team-a"}) for i in range(records)]


def hostile_lines(path: Path, long_bytes: int = MAX_LINE_BYTES + 1024) -> dict[int, str]:
    """Append a deep line, a line longer than any record may be and an unparsable one; their line
    numbers and what each must be reported as."""
    first = len(path.read_bytes().splitlines()) + 1
    with open(path, "ab") as f:
        f.write(DEEP + b"\n")
        f.write(b'{"padding":"')
        for start in range(0, long_bytes, 1 << 20):  # written a MiB at a time: this process stays small
            f.write(b"x" * min(1 << 20, long_bytes - start))
        f.write(b'"}\n')
        f.write(GARBAGE + b"\n")
    return {first: "nested deeper than", first + 1: "longer than the", first + 2: "not JSON"}


def run_measured(*args: str, stdin: Path | None = None) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS in bytes) of the installed CLI; the peak is its VmHWM,
    sampled every 10 ms until it exits."""
    peaks: list[int] = []
    with open(stdin, "rb") if stdin else open(os.devnull, "rb") as source:
        process = subprocess.Popen([str(CLI), *args], stdin=source, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        def sample() -> None:
            while process.poll() is None:
                try:
                    peaks.append(rss_bytes(process.pid, "VmHWM"))
                except (OSError, AttributeError):  # exiting: no memory left to read
                    pass
                time.sleep(0.01)
        sampler = threading.Thread(target=sample)
        sampler.start()
        out, err = process.communicate(timeout=300)
        sampler.join()
    return process.returncode, out.decode(), err.decode(), max(peaks, default=0)


@pytest.fixture
def hostile_log(tmp_path: Path) -> tuple[Path, list[dict], dict[int, str]]:
    path = tmp_path / "decisions.jsonl"
    written = good_log(path)
    lines = hostile_lines(path)
    return path, written, lines


def test_serve_starts_on_a_hostile_log_and_continues_its_chain(tmp_path: Path):
    cert_dir_holder = tmp_path / "work"
    cert_dir_holder.mkdir()
    log = cert_dir_holder / "serve-decisions.jsonl"  # the file Serve names --decision-log
    written = good_log(log)
    lines = hostile_lines(log)
    with serve(cert_dir_holder) as server:
        code, text = server.call("/validate", admission_review(example_job("allowed.yaml")))
        assert code == 200 and json.loads(text)["response"]["allowed"] is True
        stderr = server.output()
    for number, reason in lines.items():
        assert re.search(rf"{re.escape(str(log))}:{number} is not a record \([^\n]*{reason}", stderr), stderr
    assert "Traceback" not in stderr
    last = [json.loads(raw) for raw in log.read_bytes().splitlines()[-1:]][0]
    assert (last["seq"], last["prev"]) == (written[-1]["seq"] + 1, written[-1]["digest"])  # the chain goes on


@pytest.mark.parametrize("command", ["verify", "query", "report"])
@pytest.mark.parametrize("from_stdin", [False, True])
def test_every_reader_reports_each_hostile_line_and_goes_on(hostile_log, command: str, from_stdin: bool):
    path, written, lines = hostile_log
    with open(path, "ab") as f:  # a record after them: reading went on past them
        f.write(json.dumps({"seq": 99, "prev": "x", "digest": "y", "id": "after", "endpoint": "validate"}).encode() + b"\n")
    log = ["--log", "-"] if from_stdin else ["--log", str(path)]
    output = ["-o", "json"] if command == "query" else []
    code, out, err, _ = run_measured("decisions", command, *log, *output, stdin=path if from_stdin else None)
    assert "Traceback" not in out + err and code == 1, (code, out[-2000:], err[-2000:])
    report = out if command == "verify" else err
    where = "<stdin>" if from_stdin else str(path)
    for number, reason in lines.items():
        assert re.search(rf"{re.escape(where)}:{number}: malformed: [^\n]*{reason}", report), report[-3000:]
    if command == "query":  # the records around them
        assert [r["id"] for r in json.loads(out)] == ["d0", "d1", "d2", "after"]


def test_no_verify_query_counts_the_lines_it_skips(hostile_log):
    path, _, lines = hostile_log
    code, out, err, _ = run_measured("decisions", "query", "--log", str(path), "--no-verify", "-o", "json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == ["d0", "d1", "d2"]
    first = min(lines)
    assert f"3 malformed line(s) skipped, the first: {path}:{first}: {lines[first]}" in err, err


def test_verify_reads_a_200_mb_line_in_bounded_memory(tmp_path: Path):
    """Before: `decisions verify` read the file whole; one 200 MB line took it to 844 MB."""
    path = tmp_path / "decisions.jsonl"
    good_log(path)
    hostile_lines(path, long_bytes=200 * 1024 * 1024)
    results = {how: run_measured("decisions", "verify", "--log", *(["-"] if how == "stdin" else [str(path)]),
                                 stdin=path if how == "stdin" else None) for how in ("file", "stdin")}
    for how, (code, out, err, peak) in results.items():
        print(f"\ndecisions verify of a log with a 200 MB line ({how}): peak RSS {peak / 2**20:.0f} MiB")
        assert code == 1 and "longer than the" in out and "Traceback" not in err
        assert peak < 100 * 2**20, f"{how}: {peak / 2**20:.0f} MiB"
