"""policies.offline.lint: advice on bundles that compile."""
from __future__ import annotations

from trainjob_admission.policies.offline.lint import LintWarning, lint


def test_a_rule_without_message_is_a_warning(make_bundle):
    bundle = make_bundle({"validations": [
        {"name": "silent", "expression": "true"},
        {"name": "static", "expression": "true", "message": "m"},
        {"name": "rendered", "expression": "true", "messageExpression": "'m'"},
    ]})
    assert lint(bundle) == [LintWarning("<test>", "test", "silent", "no message; submitters will only read that the job fails this rule")]
    assert str(lint(bundle)[0]) == "<test>: bundle test: rule silent: no message; submitters will only read that the job fails this rule"


def test_the_shipped_bundles_lint_clean(default, production):
    assert [w for b in [*default, *production] for w in lint(b)] == []
