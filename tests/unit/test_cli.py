"""The real console script, as a new user runs it. Every invocation is a subprocess of
.venv/bin/trainjob-admission; they run concurrently once per session (each pays the interpreter
start-up) and the tests assert on exit codes and output."""
from __future__ import annotations

import json
import socket
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "trainjob-admission"
BUNDLES = "tests/unit/fixtures/bundles"
STATE = ["--cluster-state", "examples/cluster-state.yaml", "--cluster-state", "examples/runtimes/mpi-openmpi.yaml"]
PRIVILEGED = STATE + ["--cluster-state", "examples/runtimes/mpi-privileged.yaml"]

CALLS: dict[str, list[str]] = {
    "allowed": ["review", "-f", "examples/jobs/allowed.yaml", *STATE],
    "allowed-json": ["review", "-f", "examples/jobs/allowed.yaml", *STATE, "-o", "json"],
    "too-many-gpus": ["review", "-f", "examples/jobs/too-many-gpus.yaml", *STATE],
    "too-many-nodes": ["review", "-f", "examples/jobs/too-many-nodes.yaml", *STATE],
    "privileged": ["review", "-f", "examples/jobs/privileged.yaml", *PRIVILEGED],
    "over-quota": ["review", "-f", "examples/jobs/over-quota.yaml", *STATE],
    "over-quota-json": ["review", "-f", "examples/jobs/over-quota.yaml", *STATE, "-o", "json"],
    "legacy": ["review", "-f", "examples/jobs/legacy-mpijob.yaml", *STATE],
    "review-missing-file": ["review", "-f", "examples/jobs/nope.yaml", *STATE],
    "review-missing-bundle": ["review", "-f", "examples/jobs/allowed.yaml", *STATE, "--bundle", "nope/"],
    "review-broken-bundle": ["review", "-f", "examples/jobs/allowed.yaml", *STATE,
                             "--bundle", f"{BUNDLES}/cel-syntax-error.yaml"],
    "review-custom-bundle": ["review", "-f", "examples/jobs/allowed.yaml", *STATE, "--bundle", f"{BUNDLES}/good.yaml",
                             "--bundle", "builtin:default", "-o", "json"],
    "lint-syntax": ["policy", "lint", f"{BUNDLES}/cel-syntax-error.yaml"],
    "lint-variable": ["policy", "lint", f"{BUNDLES}/cel-unknown-variable.yaml"],
    "lint-schema": ["policy", "lint", *(f"{BUNDLES}/{name}.yaml" for name in
                                        ("unknown-field", "bad-mode", "duplicate-rules", "fips-ed25519"))],
    "lint-good": ["policy", "lint", f"{BUNDLES}/good.yaml"],
    "lint-examples": ["policy", "lint", "examples/bundles", "builtin:default"],
    "lint-mixed": ["policy", "lint", f"{BUNDLES}/good.yaml", f"{BUNDLES}/cel-unknown-variable.yaml"],
    "lint-missing": ["policy", "lint", "nope.yaml"],
    "lint-json": ["policy", "lint", f"{BUNDLES}/good.yaml", f"{BUNDLES}/cel-unknown-variable.yaml", "-o", "json"],
    "test-default": ["policy", "test", "builtin:default", "--cases", "examples/cases/default"],
    "test-production": ["policy", "test", "examples/bundles/production.yaml", "--cases", "examples/cases/production"],
    "test-wrong": ["policy", "test", "builtin:default", "--cases", "tests/unit/fixtures/cases"],
    "test-together": ["policy", "test", f"{BUNDLES}/good.yaml", "builtin:default", "--cases", "tests/unit/fixtures/cases-together"],
    "test-alone": ["policy", "test", f"{BUNDLES}/good.yaml", "--cases", "tests/unit/fixtures/cases-together"],
    "review-selector-alone": ["review", "-f", "examples/jobs/allowed.yaml", *STATE, "--bundle-selector", "team=ml"],
    "serve-namespace-alone": ["serve", "--insecure-http", "--port", "0", "--reconcile-namespace", "team-a"],
    "explain": ["policy", "explain", "-f", "examples/jobs/over-quota.yaml", *STATE],
    "explain-json": ["policy", "explain", "-f", "examples/jobs/allowed.yaml", *STATE, "-o", "json"],
    "review-not-a-job": ["review", "-f", "examples/cluster-state.yaml", *STATE],
    "review-no-state": ["review", "-f", "examples/jobs/allowed.yaml", *STATE[2:]],
    "review-no-state-strict": ["review", "-f", "examples/jobs/allowed.yaml", *STATE[2:], "--strict", "-o", "json"],
    "review-strict": ["review", "-f", "examples/jobs/allowed.yaml", *STATE, "--strict"],
    "explain-no-runtime-strict": ["policy", "explain", "-f", "examples/jobs/allowed.yaml", *STATE[:2], "--strict",
                                  "-o", "json"],
}


@pytest.fixture(scope="module")
def cli() -> dict[str, subprocess.CompletedProcess]:
    if not SCRIPT.exists():
        found = shutil.which("trainjob-admission")
        assert found, "the console script is not installed (pip install -e .)"
    script = str(SCRIPT) if SCRIPT.exists() else shutil.which("trainjob-admission")

    def run(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([script, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = dict(zip(CALLS, pool.map(run, CALLS.values())))
    return results


def out(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


# --- review -----------------------------------------------------------------------------------

def test_review_allowed(cli):
    result = cli["allowed"]
    assert result.returncode == 0, out(result)
    assert result.stdout.startswith("ALLOWED  TrainJob team-a/resnet-allreduce")
    assert "4 pods (4 nodes, the launcher among them), 4 nvidia.com/gpu" in result.stdout
    assert "inject: Secret resnet-allreduce-mpi-ssh-auth (keyType=ecdsa-p521, made by Trainer" in result.stdout


def test_review_allowed_json_has_the_istio_and_queue_patch(cli):
    result = cli["allowed-json"]
    assert result.returncode == 0, out(result)
    body = json.loads(result.stdout)  # only JSON on stdout
    assert set(body) == {"object", "source", "allowed", "decision", "messages", "warnings", "patch", "injections", "job",
                         "unchecked", "cluster"}
    assert body["cluster"] == {"kubernetes": "1.36", "trainer": "v2.3", "kueue": "kueue.x-k8s.io/v1beta2"}  # the newest: none given
    assert body["object"] == {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "namespace": "team-a",
                              "name": "resnet-allreduce"} and body["source"] == "examples/jobs/allowed.yaml"
    assert body["unchecked"] == []
    assert body["allowed"] is True and body["decision"] == "allow" and body["messages"] == []
    ops = {op["path"]: op for op in body["patch"]}
    assert ops["/metadata/labels"]["value"] == {"kueue.x-k8s.io/queue-name": "default"}
    (runtime_patch,) = ops["/spec/runtimePatches"]["value"]
    assert runtime_patch["manager"] == "trainjob-admission.io/webhook"
    jobs = runtime_patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert sorted(j["name"] for j in jobs) == ["launcher", "node"]
    for j in jobs:
        meta = j["template"]["spec"]["template"]["metadata"]
        assert meta["labels"]["sidecar.istio.io/inject"] == "false"
        assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
    assert body["job"]["gpus"] == 4 and body["job"]["pods"] == 4
    assert [i["kind"] for i in body["injections"]] == ["Secret", "NetworkPolicy"]


def test_review_refuses_what_is_not_a_job(cli):
    result = cli["review-not-a-job"]
    assert result.returncode == 2, out(result)
    assert "v1 Namespace is not a trainer.kubeflow.org TrainJob or kubeflow.org MPIJob" in result.stderr


def test_review_names_what_the_state_lacks(cli):
    result = cli["review-no-state"]
    assert result.returncode == 0, out(result)  # decided as the webhook would, but not silently
    assert "not checked: quota (no ResourceQuota for team-a in --cluster-state)" in result.stderr
    assert "not checked: namespace labels (no Namespace team-a in --cluster-state)" in result.stderr


def test_strict_makes_missing_state_exit_2(cli):
    result = cli["review-no-state-strict"]
    assert result.returncode == 2, out(result)
    assert json.loads(result.stdout)["unchecked"] == [
        {"check": "namespace labels", "reason": "no Namespace team-a"},
        {"check": "quota", "reason": "no ResourceQuota for team-a"},
        {"check": "schedulability", "reason": "no Nodes (whether the job can ever be placed)"},
    ]
    assert cli["review-strict"].returncode == 0, out(cli["review-strict"])  # complete state: as without --strict
    explain = cli["explain-no-runtime-strict"]
    assert explain.returncode == 2, out(explain)
    assert json.loads(explain.stdout)["unchecked"] == [
        {"check": "every check of the job", "reason": "no ClusterTrainingRuntime 'mpi-openmpi'"}]


@pytest.mark.parametrize("name, rule, numbers", [
    ("too-many-gpus", "default/gpu-limits", ["9 nvidia.com/gpu", "the limit is 8 per node", "to 8 or less"]),
    ("too-many-nodes", "default/job-shape", ["job has 65 nodes (spec.trainer.numNodes); the limit is 64",
                                             "set spec.trainer.numNodes to 64,"]),
    ("privileged", "default/pod-security", ["spec.containers[node].securityContext.privileged",
                                            "remove privileged: true"]),
    ("over-quota", "default/quota", ["32 nvidia.com/gpu", "allows 32 and 24 are in use",
                                     "set spec.trainer.numNodes to 2"]),
])
def test_review_denials_exit_1_with_numbers_and_fix(cli, name, rule, numbers):
    result = cli[name]
    assert result.returncode == 1, out(result)
    assert result.stdout.startswith("DENIED  TrainJob team-a/")
    assert f"x {rule}: " in result.stdout
    for text in numbers:
        assert text in result.stdout
    assert "fix: " in result.stdout
    assert "patch:" not in result.stdout and "inject:" not in result.stdout


def test_review_denied_json(cli):
    result = cli["over-quota-json"]
    assert result.returncode == 1
    body = json.loads(result.stdout)
    assert body["allowed"] is False and body["decision"] == "deny" and body["patch"] == []
    (message,) = body["messages"]
    assert message["rule"] == "default/quota"
    assert "24 are in use" in message["message"] and "numNodes to 2" in message["remediation"]


def test_review_legacy_mpijob_warns(cli):
    result = cli["legacy"]
    assert result.returncode == 0
    assert result.stdout.startswith("ALLOWED with warnings  MPIJob team-a/horovod-legacy")
    assert "MPIJob is deprecated" in result.stdout


def test_review_with_extra_bundle(cli):
    result = cli["review-custom-bundle"]
    assert result.returncode == 0, out(result)
    assert json.loads(result.stdout)["allowed"] is True


@pytest.mark.parametrize("name, code, words", [
    ("review-missing-file", 3, "file not found: examples/jobs/nope.yaml"),
    ("review-missing-bundle", 3, "bundle not found"),
    ("review-broken-bundle", 2, "rule unbalanced"),
    ("lint-missing", 3, "not found: nope.yaml"),
])
def test_errors_have_their_exit_codes(cli, name, code, words):
    result = cli[name]
    assert result.returncode == code, out(result)
    assert words in result.stderr and result.stderr.startswith("error: ")


# --- policy lint ------------------------------------------------------------------------------

def test_lint_syntax_error_names_rule_and_position(cli):
    result = cli["lint-syntax"]
    assert result.returncode == 2
    assert "ERROR tests/unit/fixtures/bundles/cel-syntax-error.yaml:11:47: bundle broken-syntax: rule unbalanced: " \
           "expression: syntax error" in result.stdout
    assert "syntax error" in result.stdout
    assert "rule fine" not in result.stdout  # the good rule is not blamed


def test_lint_unknown_variable_names_rule_and_position(cli):
    result = cli["lint-variable"]
    assert result.returncode == 2
    assert ("cel-unknown-variable.yaml:8:20: bundle broken-variable: rule typo-in-variable: expression: "
            "undeclared reference to 'trainjob'" in result.stdout)
    assert "(expression line 2, column 3)" in result.stdout


def test_lint_schema_errors_exit_2_and_name_the_field(cli):
    result = cli["lint-schema"]
    assert result.returncode == 2, out(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("ERROR ") for line in lines), result.stdout
    expected = {
        "unknown-field.yaml": "bundle broken-field: spec.checks.gpu.maxPerWorkr: unknown field",
        "bad-mode.yaml": "bundle broken-mode: spec.mode: Input should be 'enforce' or 'audit', got 'dryrun'",
        "duplicate-rules.yaml": "bundle broken-duplicates: spec: rule name 'limit' is used twice",
        "fips-ed25519.yaml": "bundle broken-fips: spec.injections.sshKey: key type ed25519 is not "
                             "allowed with fips: true",
    }
    for file, words in expected.items():
        line = next(line for line in lines if f"/{file}:" in line)
        assert words in line


def test_lint_good_bundles_exit_0(cli):
    result = cli["lint-good"]
    assert result.returncode == 0, out(result)
    assert result.stdout.startswith("OK    tests/unit/fixtures/bundles/good.yaml: bundle good 1.0.0 (enforce, 1 rules")


def test_every_example_bundle_and_the_default_lint_clean(cli):
    result = cli["lint-examples"]
    assert result.returncode == 0, out(result)
    lines = result.stdout.splitlines()
    assert all(line.startswith("OK ") for line in lines), result.stdout
    assert {line.split("bundle ")[1].split()[0] for line in lines} == {"production", "gpu-budget-rollout", "gpu-nodes", "default"}


def test_lint_reports_good_and_bad_and_fails(cli):
    result = cli["lint-mixed"]
    assert result.returncode == 2
    assert "OK    tests/unit/fixtures/bundles/good.yaml" in result.stdout
    assert "ERROR tests/unit/fixtures/bundles/cel-unknown-variable.yaml" in result.stdout


def test_lint_json_lists_errors_and_bundles(cli):
    result = cli["lint-json"]
    assert result.returncode == 2, out(result)
    body = json.loads(result.stdout)
    assert body["ok"] is False
    assert [(e["source"], e["bundle"], e["rule"]) for e in body["errors"]] == [
        (f"{BUNDLES}/cel-unknown-variable.yaml", "broken-variable", "typo-in-variable")]
    assert "trainjob" in body["errors"][0]["message"]
    assert [(b["source"], b["name"], b["rules"], b["warnings"]) for b in body["bundles"]] == [
        (f"{BUNDLES}/good.yaml", "good", 1, [])]


# --- policy test / explain --------------------------------------------------------------------

@pytest.mark.parametrize("name, count", [("test-default", 7), ("test-production", 4)])
def test_policy_test_examples_pass(cli, name, count):
    result = cli[name]
    assert result.returncode == 0, out(result)
    assert result.stdout.rstrip().endswith(f"{count} passed, 0 failed")
    assert "FAIL" not in result.stdout


def test_policy_test_wrong_expectation_fails_and_names_it(cli):
    result = cli["test-wrong"]
    assert result.returncode == 1, out(result)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("FAIL  wrong expectation: allowed job expected to be denied")
    assert lines[1].strip() == "expected deny, got allow"
    assert "PASS  a right expectation next to it still passes" in result.stdout
    assert result.stdout.rstrip().endswith("1 passed, 1 failed")


def test_explain_lists_every_rule_with_its_result(cli):
    result = cli["explain"]
    assert result.returncode == 0, out(result)
    rows = [line.split(None, 4) for line in result.stdout.splitlines()[1:10]]
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("quota", "fail", "deny"), ("gpu-limits", "pass", "allow"), ("job-shape", "pass", "allow"),
        ("pod-security", "pass", "allow"), ("limit-range", "pass", "allow"), ("duration", "pass", "allow"),
        ("schedulability", "pass", "allow"), ("kueue", "pass", "allow"), ("max-job-gpus", "pass", "allow")]
    assert "24 are in use" in rows[0][4]


def test_explain_json(cli):
    result = cli["explain-json"]
    assert result.returncode == 0
    body = json.loads(result.stdout)
    assert [r["rule"] for r in body["results"]] == ["quota", "gpu-limits", "job-shape", "pod-security", "limit-range",
                                                    "duration", "schedulability", "kueue", "max-job-gpus"]
    assert body["job"]["totals"]["gpus"] == 4 and body["job"]["numNodes"] == 4


def test_policy_test_takes_several_bundles_decided_together(cli):
    together, alone = cli["test-together"], cli["test-alone"]
    assert together.returncode == 0 and together.stdout.rstrip().endswith("1 passed, 0 failed"), out(together)
    assert alone.returncode == 1 and "expected rule default/quota to fail" in alone.stdout, out(alone)


def test_flags_that_need_a_cluster_say_so(cli):
    selector, serve = cli["review-selector-alone"], cli["serve-namespace-alone"]
    assert selector.returncode == 2 and "--bundle-selector selects the cluster's PolicyBundles" in selector.stderr, out(selector)
    assert serve.returncode == 2 and "--reconcile-namespace" in serve.stderr and "--kubeconfig" in serve.stderr, out(serve)


# --- decisions --------------------------------------------------------------------------------

@pytest.fixture
def submissions(tmp_path: Path) -> Path:
    """A log as the server writes it: each submission once per endpoint."""
    from trainjob_admission.webhook.decisionlog import DecisionLog

    path = tmp_path / "decisions.jsonl"
    with DecisionLog(path, stdout=None) as log:
        for i, decision in enumerate(("allow", "deny")):
            for endpoint in ("mutate", "validate"):
                log.append({"id": f"{endpoint}-{i}", "endpoint": endpoint, "decision": decision, "user": "alice",
                            "kind": "TrainJob", "namespace": "team-a", "name": f"job-{i}"})
    return path


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, capture_output=True, input=stdin, timeout=60)


def test_decisions_query_by_endpoint_and_id(submissions):
    table = run("decisions", "query", "--log", str(submissions), "--endpoint", "validate")
    lines = table.stdout.decode().splitlines()
    assert table.returncode == 0 and lines[0].split()[:4] == ["TIME", "ID", "ENDPOINT", "DECISION"], lines
    assert [line.split()[1:4] for line in lines[1:]] == [["validate-0", "validate", "allow"], ["validate-1", "validate", "deny"]]
    one = run("decisions", "query", "--log", str(submissions), "--id", "mutate-1", "-o", "json")
    assert [(r["id"], r["endpoint"], r["seq"]) for r in json.loads(one.stdout)] == [("mutate-1", "mutate", 2)]
    csv_out = run("decisions", "query", "--log", str(submissions), "--endpoint", "mutate", "-o", "csv").stdout.decode()
    assert csv_out.splitlines()[0].startswith("time,id,endpoint,") and csv_out.count(",mutate,") == 2


def test_decisions_verify_reads_kubectl_logs_from_stdin(submissions):
    records = submissions.read_bytes().splitlines(keepends=True)
    pod_log = b"I0301 serving\n" + b"".join(records[:2]) + b"WARNING something on stderr\n" + b"".join(records[2:])
    ok = run("decisions", "verify", "--log", "-", stdin=pod_log)
    assert ok.returncode == 0, ok
    assert ok.stdout.decode().splitlines()[0] == ("OK: 4 records, seq 0..3, chain intact; 2 line(s) not starting with { "
                                                  "skipped (service log lines, not records)")
    tampered = run("decisions", "verify", "--log", "-", stdin=pod_log.replace(b'"decision":"deny"', b'"decision":"allow"', 1))
    assert tampered.returncode == 1 and "<stdin>:5 (seq 2): edited" in tampered.stdout.decode(), tampered
    # the file sink holds only records: a foreign line there is a problem, not skipped
    submissions.write_bytes(pod_log)
    strict = run("decisions", "verify", "--log", str(submissions))
    assert strict.returncode == 1 and "malformed" in strict.stdout.decode(), strict



@pytest.mark.parametrize("content, words", [
    ("- a\n- b\n", "must be a YAML mapping of host, port, certDir"),
    ("port: eighty\n", "port: Input should be a valid integer, got 'eighty'"),
    ("port: true\n", "port: Input should be a valid integer, got True"),  # strict: YAML's true is no port
    ("logFsyncInterval: soon\n", "logFsyncInterval: Input should be a valid number"),
    ("logFsyncInterval: -1\n", "logFsyncInterval: Input should be greater than or equal to 0, got -1"),
    ("failureMode: open\n", "failureMode: Input should be 'deny' or 'allow', got 'open'"),
    ("prot: 8443\ntimeoutSecond: 3\n", "unknown key 'prot' (known: host, port, certDir"),
    ("timeoutSecond: 3\n", "unknown key 'timeoutSecond'"),
    ("creationBurst: 0\n", "creationBurst: Input should be greater than or equal to 1"),
    ("port: 9443\nprobePort: 9443\n", "--probe-port 9443 is the admission port"),
])
def test_serve_rejects_a_malformed_config_with_exit_2(tmp_path: Path, content: str, words: str) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(content)
    result = subprocess.run([str(SCRIPT), "serve", "--config", str(config), "--cert-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_serve_client_ca_must_exist_and_needs_tls(tmp_path: Path) -> None:
    missing = subprocess.run([str(SCRIPT), "serve", "--cert-dir", str(tmp_path), "--client-ca", str(tmp_path / "ca.crt")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 3 and f"--client-ca {tmp_path / 'ca.crt'} not found" in missing.stderr, missing.stderr
    plain = subprocess.run([str(SCRIPT), "serve", "--insecure-http", "--client-ca", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 2 and "--client-ca needs --cert-dir" in plain.stderr, plain.stderr


def test_serve_refuses_system_namespaces_and_a_weak_provenance_key(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text("")
    (tmp_path / "short.key").write_text("hunter2\n")
    base = [str(SCRIPT), "serve", "--cert-dir", str(tmp_path), "--kubeconfig", str(tmp_path / "kubeconfig")]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)

    system = run("--reconcile-namespace", "team-a", "--reconcile-namespace", "kube-system")
    assert system.returncode == 2 and "--reconcile-namespace kube-system: the service never injects into or deletes " \
        "from kube-node-lease, kube-public, kube-system; remove it" in system.stderr, system.stderr
    weak = run("--provenance-key", str(tmp_path / "short.key"))
    assert weak.returncode == 2 and "must hold one key of at least 32 characters per line" in weak.stderr \
        and "Traceback" not in weak.stderr, weak.stderr


def test_serve_start_up_errors_are_one_line_with_the_fix(tmp_path: Path) -> None:
    """What stops serve before it listens: exit 2 (3 for a missing file), one line naming the cause
    and the fix, no traceback."""
    subprocess.run([str(SCRIPT), "certs", "issue", "--service", "s", "--namespace", "n", "--out", str(tmp_path / "tls")],
                   check=True, capture_output=True, timeout=60)
    (tmp_path / "broken.yaml").write_text("spec: [not closed\n")
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\n")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "tls.crt").write_text("junk\n")
    (tmp_path / "garbage" / "tls.key").write_text("junk\n")
    tls = ["--cert-dir", str(tmp_path / "tls"), "--host", "127.0.0.1"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = [
            (["--cert-dir", str(tmp_path / "none"), "--port", "0"], 2, "tls.crt: No such file or directory", "certs issue"),
            (["--cert-dir", str(tmp_path / "garbage"), "--port", "0"], 2, "no readable PEM certificate", "certs issue"),
            ([*tls, "--port", port], 2, "address already in use", "choose another --port"),
            ([*tls, "--port", "0", "--bundle", str(tmp_path / "broken.yaml")], 2, "not valid YAML", "policy lint"),
            ([*tls, "--port", "0", "--bundle", str(tmp_path / "nope.yaml")], 3, "--bundle: not found", "builtin:default"),
            ([*tls, "--port", "0", "--kubeconfig", str(tmp_path / "kubeconfig")], 2, "cannot load kubeconfig",
             "current-context"),
            ([*tls, "--port", "0", "--decision-log", str(tmp_path / "broken.yaml" / "decisions.jsonl")], 2,
             "broken.yaml", "writable"),
            ([*tls, "--port", "0", "--webhook-timeout", "1"], 2, "--webhook-timeout must be", "more than 2"),
        ]
        for args, code, cause, fix in cases:
            result = subprocess.run([str(SCRIPT), "serve", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
            assert cause in lines[0] and fix in lines[0], (args, lines[0])


def test_lint_prints_a_lone_surrogate_escaped_not_a_traceback(tmp_path: Path) -> None:
    bundle = tmp_path / "b.yaml"
    bundle.write_text('apiVersion: policy.trainjob-admission.io/v1alpha1\nkind: PolicyBundle\nmetadata: {name: b}\n'
                      'spec:\n  validations:\n    - name: "\\ud800"\n      expression: "true"\n')
    result = run("policy", "lint", str(bundle))
    assert b"Traceback" not in result.stderr and result.returncode in (0, 2), result
    assert b"\\ud800" in result.stdout + result.stderr
