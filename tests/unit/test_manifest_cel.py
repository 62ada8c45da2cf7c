"""The CEL of the ValidatingAdmissionPolicies the manifests install (the guards of manifests/base)
passes cel-go's type check, as the API server's does when the policy is created: a policy that
does not compile is refused by `kubectl apply`, and the whole install with it."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support import celgo, upstream

ROOT = Path(__file__).resolve().parents[2]
# Values of the variables every policy reads; the check types literals and calls, whatever these hold.
VARIABLES = {"request": {"name": "x", "namespace": "y", "userInfo": {"username": "u"}},
             "object": {}, "oldObject": None, "params": None, "variables": {}}


def expressions() -> list[tuple[str, str]]:
    """(where, expression) for every CEL expression of every policy under manifests/."""
    found = []
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "ValidatingAdmissionPolicy":
                continue
            spec, name = doc["spec"], doc["metadata"]["name"]
            for section in ("matchConditions", "variables", "validations", "auditAnnotations"):
                for index, entry in enumerate(spec.get(section) or []):
                    for key in ("expression", "messageExpression", "valueExpression"):
                        if key in entry:
                            where = f"{path.relative_to(ROOT)} {name} {section}[{index}].{key}"
                            found.append((where, entry[key]))
    return found


def test_every_policy_expression_of_the_manifests_compiles_in_cel_go() -> None:
    cases = expressions()
    assert len(cases) >= 10, "the manifests' guard policies were not found"
    try:
        results = celgo.evaluate([(expression, VARIABLES) for _, expression in cases])
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))
    refused = [f"{where}: {result['compile_error']}" for (where, _), result in zip(cases, results)
               if "compile_error" in result]
    assert not refused, "\n".join(refused)
