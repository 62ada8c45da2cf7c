"""Hostile job files (issue 30): every YAML the CLI reads has the bundle loader's alias, depth and
size bounds (policies/k8s/manifests.py). A 1 KB "billion laughs" job file in `review -f` or a
`policy test` case's `object:` once ran past 60 s in redaction (a hostile manifest in a GitOps PR
hangs CI) and a deep one printed a traceback; now each is refused at once, naming the file and line,
exit 2. Redaction itself is bounded by the input too (a shared value is walked once)."""
from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.k8s.redaction import echoable_values

from tests.support.objects import EXAMPLES

pytestmark = pytest.mark.server

CLI = Path(sys.executable).parent / "trainjob-admission"
STATE = ["--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
         "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml")]


def laughs(indent: str = "") -> str:
    """A TrainJob whose env is nine levels of nine aliases: 1 KB written, 9^9 values expanded."""
    levels = [f"{indent}  l0: &l0 [{', '.join(['{name: A, value: lol-lol-lol}'] * 9)}]"]
    levels += [f"{indent}  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join([
        f"{indent}apiVersion: trainer.kubeflow.org/v1alpha1", f"{indent}kind: TrainJob",
        f"{indent}metadata: {{name: laughs, namespace: team-a}}", f"{indent}x-laughs:", *levels,
        f"{indent}spec:", f"{indent}  runtimeRef: {{name: mpi-openmpi}}",
        f"{indent}  trainer: {{numNodes: 1, env: *l8}}", ""])


def deep(depth: int = 5_000) -> str:
    return ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: deep, namespace: team-a}\n"
            f"spec: {{runtimeRef: {{name: mpi-openmpi}}, trainer: {{x: {'[' * depth}{']' * depth}}}}}\n")


def cli(*args: str, stdin: str | None = None, timeout: float = 60) -> tuple[int, str, float]:
    """(exit code, stderr, CPU seconds) of the installed CLI; a hang fails the test at ``timeout``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([str(CLI), *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p.returncode, p.stderr, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def assert_refused(result: tuple[int, str, float], where: str, *reason: str) -> None:
    code, err, seconds = result
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert where in err and all(r in err for r in reason), err[-3000:]
    assert seconds < 10, f"refused only after {seconds:.1f} s of CPU"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {"laughs": tmp_path / "laughs.yaml", "deep": tmp_path / "deep.yaml"}
    out["laughs"].write_text(laughs())
    out["deep"].write_text(deep())
    assert len(out["laughs"].read_bytes()) < 1500
    return out


BOMB = "YAML aliases expand this document by"


def test_review_refuses_a_billion_laughs_and_a_deep_job_file(files: dict[str, Path]):
    assert_refused(cli("review", "-f", str(files["laughs"]), *STATE), f"{files['laughs']}:1", BOMB)
    assert_refused(cli("review", "-f", "-", *STATE, stdin=laughs()), "<stdin>:1", BOMB)
    assert_refused(cli("review", "-f", str(files["deep"]), *STATE), str(files["deep"]), "nested")
    assert_refused(cli("policy", "explain", "-f", str(files["laughs"]), *STATE), str(files["laughs"]), BOMB)


def test_every_other_yaml_the_cli_reads_is_bounded_too(files: dict[str, Path], tmp_path: Path):
    allowed = str(EXAMPLES / "jobs" / "allowed.yaml")
    assert_refused(cli("review", "-f", allowed, "--cluster-state", str(files["laughs"])), str(files["laughs"]), BOMB)
    config = tmp_path / "serve.yaml"
    config.write_text(laughs().replace("apiVersion: trainer.kubeflow.org/v1alpha1\n", "host: 127.0.0.1\n"))
    assert_refused(cli("serve", "--config", str(config), "--cert-dir", str(tmp_path)), str(config), BOMB)
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "laughs.yaml").write_text("name: laughs\nexpect: {decision: deny}\nobject:\n" + laughs("  "))
    assert_refused(cli("policy", "test", "builtin:default", "--cases", str(cases)), f"{cases / 'laughs.yaml'}:", BOMB)
    (cases / "laughs.yaml").write_text("name: deep\nexpect: {decision: deny}\nobject:\n  " + deep())
    assert_refused(cli("policy", "test", "builtin:default", "--cases", str(cases)), f"{cases / 'laughs.yaml'}:",
                   "nested")


def test_redaction_walks_a_shared_value_once():
    """The engine's redaction over an object built with shared values (as a YAML alias builds
    them, here 9^9 entries deep): bounded by what is there, not by what it expands to."""
    level: list = [{"name": "A", "value": "a-secret-value"}] * 9
    for _ in range(8):
        level = [level] * 9
    started = time.monotonic()
    found = echoable_values({"spec": {"trainer": {"env": level}}, "metadata": {"annotations": {"k": "v" * 9}}})
    assert time.monotonic() - started < 1
    assert found == ["vvvvvvvvv"]  # env values are those of env lists of maps: here lists of lists
    flat = {"spec": {"env": [{"name": "A", "value": "a-secret-value"}] * 100_000}}
    assert echoable_values(flat, flat) == ["a-secret-value"]


def test_a_bomb_inside_the_limits_still_reviews(tmp_path: Path):
    """Aliases within the bound are fine: a job file may share values."""
    job = yaml.safe_load((EXAMPLES / "jobs" / "allowed.yaml").read_text())
    shared = {"team": "a"}  # one object twice: safe_dump writes an anchor and an alias (not unknown fields,
    job["metadata"]["labels"] = job["metadata"]["annotations"] = shared  # which strict validation refuses)
    text = yaml.safe_dump(job)
    assert "*id" in text
    (tmp_path / "shared.yaml").write_text(text)
    code, err, _ = cli("review", "-f", str(tmp_path / "shared.yaml"), *STATE)
    assert code == 0, err
