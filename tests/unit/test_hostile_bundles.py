"""Hostile bundles: YAML bombs and oversized documents refused before they are built, deep CEL a
located compile error (lint exit 2), and a failed compile of any kind a rejection that keeps the
last good bundle, for files and for PolicyBundle objects alike."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.bundle import compile as bundle_module
from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.bundle.load import parse_documents
from trainjob_admission.policies.cel.environment import MAX_DEPTH, CelCompileError, compile_expression
from trainjob_admission.policies.k8s.manifests import MAX_ALIAS_NODES, MAX_DOCUMENT_CHARS
from trainjob_admission.webhook.loops.bundleset import BundleRegistry
from trainjob_admission.webhook.loops.clusterbundles import ClusterBundles

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CLI = Path(sys.executable).parent / "trainjob-admission"
GOOD = yaml.safe_load((FIXTURES / "bundles" / "good.yaml").read_text())
# 377 bytes of YAML that expand to about 4e9 nodes (a 690-byte one killed the server before).
BOMB = "a: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
    f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefghi", "bcdefghij"))
DEEP_EXPRESSIONS = ["!" * 3000 + "true", "(" * 300 + "true" + ")" * 300, " + ".join(["1"] * 400) + " > 0",
                    "[" * 200 + "]" * 200 + " == []", " && ".join(["true"] * 400)]


def deep_bundle(expression: str = DEEP_EXPRESSIONS[0]) -> dict:
    document = copy.deepcopy(GOOD)
    document["spec"]["validations"] = [{"name": "deep", "expression": expression, "message": "m"}]
    return document


def problem_of(text: str) -> str:
    with pytest.raises(BundleError) as info:
        parse_documents(text, "b.yaml")
    (problem,) = info.value.problems
    return str(problem)


def test_a_yaml_bomb_is_refused_before_it_is_built():
    assert problem_of(BOMB).startswith("b.yaml:1:1: YAML aliases expand this document by ")
    assert f"more than {MAX_ALIAS_NODES}" in problem_of(BOMB)


def test_a_recursive_alias_and_an_oversized_document_are_refused_with_their_line():
    assert "b.yaml:2:4: not valid YAML for a bundle: an alias refers to a node that contains it" in \
        problem_of("x: 1\na: &a [*a]\n")
    big = "---\nok: 1\n---\nx: " + "y" * MAX_DOCUMENT_CHARS + "\n"
    assert problem_of(big).startswith(f"b.yaml:4:1: document of {MAX_DOCUMENT_CHARS + 4} characters")
    assert "nested too deeply" in problem_of("[" * 5000 + "]" * 5000)


def test_a_few_aliases_still_work():
    text = "defaults: &d {cpu: 1, memory: 2Gi}\na: *d\nb: *d\n---\nsecond: true\n"
    assert parse_documents(text, "b.yaml") == [{"defaults": {"cpu": 1, "memory": "2Gi"}, "a": {"cpu": 1, "memory": "2Gi"},
                                                "b": {"cpu": 1, "memory": "2Gi"}}, {"second": True}]


@pytest.mark.parametrize("expression", DEEP_EXPRESSIONS)
def test_deep_cel_is_a_compile_error_not_a_recursion_error(expression):
    with pytest.raises(CelCompileError, match=f"nested too deeply \\(more than {MAX_DEPTH} levels"):
        compile_expression(expression)


def test_deep_cel_is_located_when_cel_python_gives_positions():
    with pytest.raises(CelCompileError) as info:
        compile_expression("object.a && (" * 30 + "object.b" + ")" * 30)
    assert info.value.line == 1 and info.value.column > 100


def test_policy_lint_of_deep_cel_exits_2_naming_the_rule(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(yaml.safe_dump(deep_bundle()))
    result = subprocess.run([str(CLI), "policy", "lint", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"ERROR {path}:9:18: bundle good: rule deep: expression: expression nested too deeply" in result.stdout
    assert "Traceback" not in result.stderr


def test_policy_lint_of_a_yaml_bomb_exits_2(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    result = subprocess.run([str(CLI), "policy", "lint", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "YAML aliases expand this document" in result.stdout + result.stderr


def test_a_file_that_stops_compiling_keeps_its_last_good_version(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    registry = BundleRegistry([str(path)])
    registry.poll()
    good = registry.active
    for text in (yaml.safe_dump(deep_bundle()), BOMB):
        path.write_text(text + "\n" * (len(str(registry.failures)) + 1))  # a new size: the poll sees a change
        registry.poll()
        assert registry.active == good and registry.errors[str(path)]


def test_a_file_caught_empty_mid_write_keeps_its_last_good_version(tmp_path):
    """An editor or `cp` empties the file before writing it: a poll in that window must not
    enforce nothing (zero bundles would admit every job)."""
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    registry = BundleRegistry([str(path)])
    registry.poll()
    good = registry.active
    for text in ("", "# being rewritten\n", "---\n"):
        path.write_text(text)
        registry.poll()
        assert registry.active == good and "holds no bundle" in registry.errors[str(path)]
    path.write_text(yaml.safe_dump(GOOD) + "\n")
    registry.poll()
    assert registry.active and not registry.errors


def test_an_unexpected_compiler_failure_is_a_rejection_too(tmp_path, monkeypatch):
    registry = BundleRegistry([])
    assert registry.update_documents("cluster:x", [GOOD]).compiled

    def broken(document, source, **_):
        raise RuntimeError("compiler bug")

    monkeypatch.setattr("trainjob_admission.webhook.loops.bundleset.compile_document", broken)
    state = registry.update_documents("cluster:x", [GOOD])
    assert not state.compiled and "RuntimeError: compiler bug" in state.error
    assert [b.name for b in registry.active] == ["good"]  # the last good version stays
    assert bundle_module.compile_document is not broken


def test_a_deep_policybundle_is_a_status_error_and_never_stops_the_watch(monkeypatch):
    bundles = ClusterBundles(api=None, registry=BundleRegistry([]))
    written: list[dict] = []
    monkeypatch.setattr(bundles, "_write_status", lambda obj: written.append(bundles.desired_status(obj)))
    good = copy.deepcopy(GOOD) | {"metadata": {"name": "good", "generation": 1, "uid": "u"}}
    deep = deep_bundle() | {"metadata": {"name": "good", "generation": 2, "uid": "u"}}
    bundles.apply("ADDED", good)
    bundles.apply("MODIFIED", deep)
    status = written[-1]
    assert status["compiled"] is False and status["activeGeneration"] == 1
    assert "rule deep: expression: expression nested too deeply" in status["errors"][0]

    def failing(obj):
        raise RuntimeError("status write blew up")

    monkeypatch.setattr(bundles, "_write_status", failing)
    bundles.apply("MODIFIED", good | {"metadata": {"name": "good", "generation": 3, "uid": "u"}})  # does not raise
    assert bundles.enforced["good"].generation == 3
