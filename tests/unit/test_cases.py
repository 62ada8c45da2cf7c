"""policy test cases: every expectation kind, who submits (user, groups, UPDATE with oldObject),
the failure output, -o json and -o junit, and malformed case files (one line per problem)."""
from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.offline import casereport
from trainjob_admission.policies.offline.cases import CaseError, CaseResult, load_cases, run_case

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "trainjob-admission"
QUEUE_LABEL = "/metadata/labels/kueue.x-k8s.io~1queue-name"  # the default bundle's Kueue queue
STATE = [str(ROOT / "examples" / "cluster-state.yaml"), str(ROOT / "examples" / "runtimes" / "mpi-openmpi.yaml")]

# A bundle whose rules read who submits and the old object, beside builtin:default in every test.
BUNDLE = {
    "version": "1.0.0",
    "validations": [
        {"name": "gpu-admins", "expression": "job.totals.gpus <= 4 || 'gpu-admins' in request.userInfo.groups",
         "message": "more than 4 GPUs need the gpu-admins group"},
        {"name": "resume", "expression": "request.operation != 'UPDATE' || !has(oldObject.spec.suspend) || "
                                         "!oldObject.spec.suspend || (has(object.spec.suspend) && object.spec.suspend)"
                                         " || 'ml-oncall' in request.userInfo.groups",
         "message": "only ml-oncall may resume a suspended job"},
        {"name": "no-bob", "expression": "request.userInfo.username != 'bob'", "message": "bob may not submit",
         "severity": "warn"},
    ],
}


def job(name: str = "vit", nodes: int = 4, gpus: int = 1, suspend: bool | None = None) -> dict:
    obj = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": name, "namespace": "team-a", "labels": {"team": "vision"}},
           "spec": {"runtimeRef": {"name": "mpi-openmpi"},
                    "trainer": {"numNodes": nodes, "resourcesPerNode": {"requests": {"cpu": "1", "memory": "4Gi"},
                                                                        "limits": {"nvidia.com/gpu": gpus}}}}}
    if suspend is not None:
        obj["spec"]["suspend"] = suspend
    return obj


@pytest.fixture
def bundles(make_bundle, default):
    return [make_bundle(BUNDLE, "team"), *default]


def run(tmp_path: Path, bundles, **case) -> CaseResult:
    document = {"name": "case", "object": job(), "clusterState": STATE, **case}
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(document))
    ((file, loaded),) = load_cases(path)
    return run_case(file, loaded, bundles)


# --- each expectation kind --------------------------------------------------------------------

@pytest.mark.parametrize("expect, failures", [
    ({"decision": "allow"}, []),
    ({"decision": "deny"}, ["expected deny, got allow"]),
    ({"decision": "allow", "rules": ["team/gpu-admins"]}, ["expected rule team/gpu-admins to fail; failed: none"]),
    ({"decision": "allow", "messages": []}, []),
    ({"decision": "allow", "warnings": []}, []),
    ({"decision": "allow", "patches": [{"op": "add", "path": QUEUE_LABEL}]}, []),
    ({"decision": "allow", "patches": [{"op": "add", "path": QUEUE_LABEL, "value": "default"}]}, []),
    ({"decision": "allow", "patches": [{"op": "add", "path": QUEUE_LABEL, "value": "other"}]},
     [f"no patch add {QUEUE_LABEL} with value 'other'"]),
    ({"decision": "allow", "patches": [{"op": "replace", "path": QUEUE_LABEL}]}, [f"no patch replace {QUEUE_LABEL}"]),
    ({"decision": "allow", "patches": []}, ["expected no patch, got 3"]),
    ({"decision": "allow", "injections": [{"kind": "Secret", "name": "vit-mpi-ssh-auth"}, {"kind": "NetworkPolicy"}]},
     []),
    ({"decision": "allow", "injections": [{"kind": "Secret", "name": "other"}]}, ["no injection Secret other"]),
    ({"decision": "allow", "injections": []}, ["expected no injection, got 2"]),
], ids=lambda v: json.dumps(v)[:60])
def test_expectations_on_an_allowed_job(tmp_path, bundles, expect, failures):
    result = run(tmp_path, bundles, expect=expect)
    assert result.failures == failures
    assert result.passed == (not failures)


@pytest.mark.parametrize("messages, failures", [
    (["more than 4 GPUs need the gpu-admins group"], []),
    ([{"regex": r"more than \d+ GPUs"}], []),
    ([{"contains": "gpu-admins", "rule": "team/gpu-admins"}], []),
    ([{"contains": "gpu-admins", "rule": "default/quota"}], ["no message of rule default/quota contains 'gpu-admins'"]),
    ([{"regex": "^GPUs"}], ["no message matches /^GPUs/"]),
    (["not said"], ["no message contains 'not said'"]),
    ([], ["expected no message, got 1"]),
])
def test_messages_substring_regex_and_rule(tmp_path, bundles, messages, failures):
    result = run(tmp_path, bundles, object=job(nodes=2, gpus=4), expect={"decision": "deny", "messages": messages})
    assert result.failures == failures


def test_groups_decide_and_the_group_admits(tmp_path, bundles):
    admitted = run(tmp_path, bundles, object=job(nodes=2, gpus=4), groups=["gpu-admins"],
                   expect={"decision": "allow", "messages": []})
    assert admitted.passed, admitted.failures
    refused = run(tmp_path, bundles, object=job(nodes=2, gpus=4), groups=["ml"], expect={"decision": "allow"})
    assert refused.failures == ["expected allow, got deny"]


@pytest.mark.parametrize("key", ["user", "username"])  # username: the field's name before `user`
def test_user_and_warnings(tmp_path, bundles, key):
    result = run(tmp_path, bundles, **{key: "bob"}, expect={
        "decision": "warn", "warnings": ["bob may not submit", {"regex": "^\\[team/no-bob\\]", "rule": "team/no-bob"}],
        "messages": ["bob may not submit"]})  # messages also finds warnings, as it always did
    assert result.passed, result.failures
    other = run(tmp_path, bundles, user="alice", expect={"decision": "allow", "warnings": ["bob may not submit"]})
    assert other.failures == ["no warning contains 'bob may not submit'"]


def test_update_with_old_object_and_groups(tmp_path, bundles):
    resume = {"operation": "UPDATE", "oldObject": job(suspend=True), "object": job(suspend=False)}
    refused = run(tmp_path, bundles, **resume, groups=["ml"],
                  expect={"decision": "deny", "rules": ["team/resume"], "messages": ["only ml-oncall may resume"],
                          "patches": [], "injections": []})  # no mutation and no injection on UPDATE
    assert refused.passed, refused.failures
    admitted = run(tmp_path, bundles, **resume, groups=["ml-oncall"], expect={"decision": "deny"})
    assert admitted.failures[0].startswith("expected deny, got ")
    assert "team/resume" not in " ".join(admitted.failures)


def test_old_object_from_a_path(tmp_path, bundles):
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(job(suspend=True)))
    result = run(tmp_path, bundles, operation="UPDATE", oldObject="old.yaml",
                 expect={"decision": "deny", "messages": [{"contains": "resume", "rule": "team/resume"}]})
    assert result.passed, result.failures


# --- the failure output -----------------------------------------------------------------------

def test_a_failing_case_prints_what_came_back_next_to_what_was_expected(tmp_path, bundles):
    result = run(tmp_path, bundles, user="bob", expect={"decision": "deny", "messages": ["quota"]})
    lines = casereport.text([result]).splitlines()
    assert lines[0] == f"FAIL  case  ({tmp_path / 'case.yaml'})"
    assert [line.strip() for line in lines[1:]] == [
        "expected deny, got warn",
        "no message contains 'quota'",
        "came back:",
        "decision: warn",
        "warning: [team/no-bob] bob may not submit",
        "patch: add /metadata/labels/kueue.x-k8s.io~1queue-name",
        "patch: add /spec/runtimePatches",
        "patch: add /spec/activeDeadlineSeconds",
        "injection: Secret vit-mpi-ssh-auth",
        "injection: NetworkPolicy vit-mpi-isolation",
        "0 passed, 1 failed"]


def test_a_denial_came_back_with_its_rule(tmp_path, bundles):
    result = run(tmp_path, bundles, object=job(nodes=2, gpus=4), expect={"decision": "allow"})
    assert "      message: [team/gpu-admins] more than 4 GPUs need the gpu-admins group" in casereport.text([result])


def test_passing_cases_print_one_line_each(tmp_path, bundles):
    result = run(tmp_path, bundles, expect={"decision": "allow"})
    assert casereport.text([result, result]).splitlines()[1:] == [f"PASS  case  ({tmp_path / 'case.yaml'})",
                                                                   "2 passed, 0 failed"]


# --- json and junit ---------------------------------------------------------------------------

def test_json_has_each_result_with_what_came_back(tmp_path, bundles):
    failing = run(tmp_path, bundles, expect={"decision": "deny"})
    passing = run(tmp_path, bundles, expect={"decision": "allow"})
    body = json.loads(json.dumps(casereport.as_json([failing, passing])))
    assert (body["passed"], body["failed"]) == (1, 1)
    first = body["results"][0]
    assert (first["name"], first["passed"], first["failures"]) == ("case", False, ["expected deny, got allow"])
    assert first["got"]["decision"] == "allow"
    assert [p["path"] for p in first["got"]["patches"]] == [QUEUE_LABEL, "/spec/runtimePatches",
                                                             "/spec/activeDeadlineSeconds"]
    assert first["got"]["injections"] == [{"kind": "Secret", "name": "vit-mpi-ssh-auth"},
                                          {"kind": "NetworkPolicy", "name": "vit-mpi-isolation"}]


def test_junit_one_suite_per_file_one_testcase_per_case(tmp_path, bundles):
    cases = tmp_path / "cases"
    cases.mkdir()
    for file, decisions in (("a.yaml", ["allow", "deny"]), ("b.yaml", ["allow"])):
        (cases / file).write_text(yaml.safe_dump_all(
            [{"name": f"{file} {i} <&>", "object": job(), "clusterState": STATE, "expect": {"decision": d}}
             for i, d in enumerate(decisions)]))
    results = [run_case(path, case, bundles) for path, case in load_cases(cases)]
    root = ET.fromstring(casereport.junit(results))
    assert root.tag == "testsuites" and (root.get("tests"), root.get("failures")) == ("3", "1")
    suites = root.findall("testsuite")
    assert [(s.get("name"), s.get("tests"), s.get("failures")) for s in suites] == [
        (str(cases / "a.yaml"), "2", "1"), (str(cases / "b.yaml"), "1", "0")]
    testcases = suites[0].findall("testcase")
    assert [t.get("name") for t in testcases] == ["a.yaml 0 <&>", "a.yaml 1 <&>"]
    assert testcases[0].find("failure") is None
    failure = testcases[1].find("failure")
    assert failure.get("message") == "expected deny, got allow (came back: allow)"
    assert f"came back:\n  decision: allow\n  patch: add {QUEUE_LABEL}\n" in failure.text
    assert suites[1].find("testcase").get("classname") == str(cases / "b")


def test_cli_output_formats(tmp_path, bundles):
    fixtures = "tests/unit/fixtures/cases"
    outputs = {fmt: subprocess.run([str(SCRIPT), "policy", "test", "builtin:default", "--cases", fixtures, "-o", fmt],
                                   cwd=ROOT, capture_output=True, text=True, timeout=60)
               for fmt in ("json", "yaml", "junit")}
    assert {fmt: r.returncode for fmt, r in outputs.items()} == {"json": 1, "yaml": 1, "junit": 1}
    assert json.loads(outputs["json"].stdout) == yaml.safe_load(outputs["yaml"].stdout)
    assert json.loads(outputs["json"].stdout)["failed"] == 1
    suite = ET.fromstring(outputs["junit"].stdout).find("testsuite")
    assert suite.get("name") == f"{fixtures}/wrong-expectation.yaml" and suite.get("failures") == "1"


# --- malformed case files ---------------------------------------------------------------------

MALFORMED = """\
name: bad one
object: 5
groups: ml-admins
expect:
  decision: denied
  messages:
    - {contains: x, regex: y}
    - {regex: "a("}
  patches:
    - {op: ad, path: /x}
  injections: [{name: x}]
  bogus: 1
---
name: an update without its old object
object: {kind: TrainJob}
operation: UPDATE
expect: {decision: allow}
---
object: {kind: TrainJob}
expect: {decision: allow}
---
- not a mapping
"""


def test_malformed_case_file_one_line_per_problem_with_line_and_field(tmp_path):
    (tmp_path / "bad.yaml").write_text(MALFORMED)
    (tmp_path / "broken.yaml").write_text("name: x\n object: [\n")
    with pytest.raises(CaseError) as caught:
        load_cases(tmp_path)
    bad, broken = tmp_path / "bad.yaml", tmp_path / "broken.yaml"
    assert caught.value.problems == [
        f"{bad}:2: case 'bad one': object: give a path relative to the case file or the object inline, got int",
        f"{bad}:3: case 'bad one': groups: Input should be a valid list, got 'ml-admins'",
        f"{bad}:5: case 'bad one': expect.decision: Input should be 'allow', 'warn' or 'deny', got 'denied'",
        f"{bad}:7: case 'bad one': expect.messages[0]: give either contains or regex",
        f"{bad}:8: case 'bad one': expect.messages[1]: regex 'a(' is not a valid regular expression: "
        "missing ), unterminated subpattern at position 1",
        f"{bad}:10: case 'bad one': expect.patches[0].op: Input should be 'add', 'remove', 'replace', 'move', "
        "'copy' or 'test', got 'ad'",
        f"{bad}:11: case 'bad one': expect.injections[0].kind: required",
        f"{bad}:12: case 'bad one': expect.bogus: unknown field (known: decision, rules, messages, warnings, "
        "patches, injections; see docs/admin-guide.md#test-cases)",
        f"{bad}:14: case 'an update without its old object': (case): an UPDATE case needs oldObject: "
        "the job as it was before the update",
        f"{bad}:19: document 3: name: required",
        f"{bad}:22: document 4: (case): must be a mapping, got list",
        f"{broken}:2: not valid YAML: mapping values are not allowed here",
    ]


def test_cli_malformed_cases_exit_2_without_a_validation_dump(tmp_path):
    (tmp_path / "bad.yaml").write_text(MALFORMED)
    result = subprocess.run([str(SCRIPT), "policy", "test", "builtin:default", "--cases", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "error: invalid test cases:" and len(lines) == 12
    assert all(line.startswith(f"{tmp_path / 'bad.yaml'}:") for line in lines[1:])
    assert "pydantic" not in result.stderr and "validation error" not in result.stderr


def test_every_case_naming_a_missing_file_is_listed(tmp_path, bundles):
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump_all(
        [{"name": n, "object": "nope.yaml", "expect": {"decision": "allow"}} for n in ("one", "two")]))
    result = subprocess.run([str(SCRIPT), "policy", "test", "builtin:default", "--cases", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert [line.split(": case ")[1][:5] for line in result.stderr.splitlines()[1:]] == ["'one'", "'two'"]
