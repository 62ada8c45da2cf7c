"""Bundle schema, loading and compile-time lint: every problem named by file, rule and position."""
from __future__ import annotations

import pytest

from trainjob_admission.policies.bundle.compile import BundleError, compile_document
from trainjob_admission.policies.bundle.load import builtin_names, default_bundles, load_bundles, order


def _problems(build, fixture: str):
    with pytest.raises(BundleError) as info:
        load_bundles([str(build.fixtures / "bundles" / fixture)])
    return info.value.problems


def test_every_example_bundle_and_the_builtin_default_compile(build):
    bundles = load_bundles([str(build.examples / "bundles"), "builtin:default"])
    assert {b.name for b in bundles} == {"production", "gpu-budget-rollout", "gpu-nodes", "default"}
    assert "default" in builtin_names()
    # Ordered by priority, then name: production (10), the rollout and gpu-nodes (50), default (1000).
    assert [b.name for b in bundles] == ["production", "gpu-budget-rollout", "gpu-nodes", "default"]
    for bundle in bundles:
        assert bundle.digest.startswith("sha256:") and len(bundle.digest) == 7 + 64
        assert all(rule.expression.source == rule.rule.expression for rule in bundle.rules)


def test_default_bundle_settings(default):
    (bundle,) = default
    spec = bundle.spec
    assert spec.mode == "enforce"
    assert spec.checks.gpu.maxPerWorker == 8
    assert spec.checks.shape.maxWorkers == 64
    assert spec.checks.podSecurity.defaultLevel == "baseline"  # Kubernetes' own is privileged
    assert spec.checks.podSecurity.openshiftSCC == "auto"
    assert spec.injections.sshKey.type == "ecdsa-p521"
    assert [r.rule.name for r in bundle.rules] == ["max-job-gpus"]
    assert "kube-system" in spec.match.excludeNamespaces


def test_cel_syntax_error_names_rule_field_and_position(build):
    (problem,) = _problems(build, "cel-syntax-error.yaml")
    assert problem.bundle == "broken-syntax"
    assert problem.rule == "unbalanced"
    assert problem.field == "expression"
    # the file's line, and a column inside the quoted expression (which starts at column 20)
    assert problem.line == 11 and problem.column is not None and problem.column > 20
    assert "syntax error" in problem.message
    text = str(problem)
    assert f"cel-syntax-error.yaml:11:{problem.column}: bundle broken-syntax: rule unbalanced: expression:" in text


def test_unknown_variable_names_rule_and_position(build):
    (problem,) = _problems(build, "cel-unknown-variable.yaml")
    assert problem.rule == "typo-in-variable"
    # a double-quoted string over two lines: the file position of the string, and the expression's own
    assert (problem.line, problem.column) == (8, 20)
    assert problem.message.endswith("(expression line 2, column 3)")  # `trainjob` on its second line
    assert "undeclared reference to 'trainjob'" in problem.message
    assert "job" in problem.message  # lists the variables that exist


@pytest.mark.parametrize("fixture, field, words", [
    ("unknown-field.yaml", "spec.checks.gpu.maxPerWorkr", "unknown field"),
    ("bad-mode.yaml", "spec.mode", "'dryrun'"),
    ("duplicate-rules.yaml", "spec", "rule name 'limit' is used twice"),
    ("fips-ed25519.yaml", "spec.injections.sshKey", "ed25519 is not allowed with fips: true"),
])
def test_schema_errors_name_the_field(build, fixture, field, words):
    (problem,) = _problems(build, fixture)
    assert problem.field == field
    assert words in problem.message
    assert problem.source.endswith(fixture)


def test_fips_with_rsa_is_accepted(make_bundle):
    bundle = make_bundle({"injections": {"sshKey": {"type": "rsa-4096", "fips": True}}})
    assert bundle.spec.injections.sshKey.fips is True


def test_every_problem_is_reported_at_once(build):
    doc = build.bundle_document({"validations": [
        {"name": "a", "expression": "nosuch.x > 1"},
        {"name": "b", "expression": "job.workers >"},
        {"name": "c", "expression": "job.workers > 1", "messageExpression": "frobnicate(job)"},
    ]})
    with pytest.raises(BundleError) as info:
        compile_document(doc, "inline")
    found = {(p.rule, p.field) for p in info.value.problems}
    assert found == {("a", "expression"), ("b", "expression"), ("c", "messageExpression")}
    assert "unknown function 'frobnicate'" in str(info.value)


def test_schema_error_inside_a_rule_names_the_rule(build):
    doc = build.bundle_document({"validations": [{"name": "sev", "expression": "true", "severity": "block"}]})
    with pytest.raises(BundleError) as info:
        compile_document(doc, "inline")
    (problem,) = info.value.problems
    assert problem.rule == "sev" and problem.field == "severity"


@pytest.mark.parametrize("spec, field", [
    ({"checks": {"shape": {"minWorkerCpu": "lots"}}}, "spec.checks.shape.minWorkerCpu"),
    ({"checks": {"gpu": {"maxPerWorker": -1}}}, "spec.checks.gpu.maxPerWorker"),
    ({"checks": {"podSecurity": {"defaultLevel": "strict"}}}, "spec.checks.podSecurity.defaultLevel"),
    ({"checks": {"podSecurity": {"openshiftSCC": "maybe"}}}, "spec.checks.podSecurity.openshiftSCC"),
    ({"injections": {"networkPolicy": {"sshPort": 70000}}}, "spec.injections.networkPolicy.sshPort"),
    ({"match": {"operations": ["DELETE"]}}, "spec.match.operations[0]"),
])
def test_invalid_settings_are_rejected(build, spec, field):
    with pytest.raises(BundleError) as info:
        compile_document(build.bundle_document(spec), "inline")
    assert [p.field for p in info.value.problems] == [field]


@pytest.mark.parametrize("old, new", [({"level": "restricted"}, {"defaultLevel": "restricted"}),
                                      ({"openshiftSCC": True}, {"openshiftSCC": "always"}),
                                      ({"openshiftSCC": False}, {"openshiftSCC": "never"})])
def test_old_pod_security_fields_keep_their_meaning(build, old, new):
    """A PolicyBundle written before defaultLevel/auto still compiles after an upgrade, to what
    it meant: had it stopped compiling, its namespaces would have had no policy at all."""
    checks = compile_document(build.bundle_document({"checks": {"podSecurity": old}}), "inline").spec.checks
    assert {key: getattr(checks.podSecurity, key) for key in new} == new


def test_old_and_new_level_together_are_refused(build):
    with pytest.raises(BundleError, match="old name of `defaultLevel`"):
        compile_document(build.bundle_document({"checks": {"podSecurity": {"level": "baseline",
                                                                           "defaultLevel": "restricted"}}}), "inline")


def test_wrong_api_version_and_kind(build):
    doc = build.bundle_document({})
    doc["apiVersion"], doc["kind"] = "v1", "ConfigMap"
    with pytest.raises(BundleError) as info:
        compile_document(doc, "inline")
    assert {p.field for p in info.value.problems} == {"apiVersion", "kind"}


def test_invalid_yaml_gives_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: x\nspec:\n  validations: [\n    - name: a\n")
    with pytest.raises(BundleError) as info:
        load_bundles([str(path)])
    (problem,) = info.value.problems
    assert "not valid YAML" in problem.message and problem.line is not None and problem.line >= 3


def test_duplicate_bundle_names_across_files(tmp_path, build):
    good = (build.fixtures / "bundles" / "good.yaml").read_text()
    (tmp_path / "a.yaml").write_text(good)
    (tmp_path / "b.yaml").write_text(good)
    with pytest.raises(BundleError, match="bundle name used twice"):
        load_bundles([str(tmp_path)])


def test_multi_document_file_and_missing_paths(tmp_path, build):
    good = (build.fixtures / "bundles" / "good.yaml").read_text()
    path = tmp_path / "two.yaml"
    path.write_text(good + "---\n" + good.replace("name: good", "name: second"))
    assert [b.name for b in load_bundles([str(path)])] == ["good", "second"]
    with pytest.raises(FileNotFoundError):
        load_bundles([str(tmp_path / "missing.yaml")])
    with pytest.raises(BundleError, match="no built-in bundle 'nope'"):
        load_bundles(["builtin:nope"])


def test_digest_tracks_content_not_formatting(build):
    doc = build.bundle_document({"params": {"a": 1}})
    first = compile_document(doc, "one").digest
    assert compile_document(build.bundle_document({"params": {"a": 1}}), "two").digest == first
    assert compile_document(build.bundle_document({"params": {"a": 2}}), "one").digest != first


def test_order_is_by_priority_then_name(make_bundle):
    b = [make_bundle({"priority": 5}, "zeta"), make_bundle({"priority": 5}, "alpha"), make_bundle({"priority": 1}, "late")]
    assert [x.name for x in order(b)] == ["late", "alpha", "zeta"]


def test_default_bundles_is_the_builtin(default):
    assert [b.digest for b in default_bundles()] == [b.digest for b in default]


def test_unreadable_bundle_file_is_rejected_once_per_change(tmp_path):
    from trainjob_admission.webhook.loops.bundleset import BundleRegistry

    broken = tmp_path / "broken.yaml"
    broken.write_bytes(b"\xff\xfe not utf-8")
    registry = BundleRegistry([str(tmp_path)])
    for _ in range(3):
        registry.poll()
    assert registry.failures == 1 and "cannot read" in registry.errors[str(broken)]


def test_merged_settings_take_each_field_from_the_first_section_that_sets_it():
    from trainjob_admission.policies.bundle.schema import IstioMutation, Mutations, SchedulingMutation, merged

    first = Mutations(istio=IstioMutation(disableSidecar=False))
    second = Mutations(istio=IstioMutation(), scheduling=SchedulingMutation(defaultQueue="q"))
    settings = merged(Mutations, [first, second])
    assert settings.istio is first.istio and settings.scheduling is second.scheduling
    assert settings.securityDefaults is None and settings.costLabels is None
    assert merged(Mutations, [second]) is second
