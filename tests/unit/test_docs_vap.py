"""docs/admin-guide.md's ported ValidatingAdmissionPolicies ("Porting a ValidatingAdmissionPolicy"):
each bundle carries its policy's CEL character for character, and cel-go with Kubernetes' v1.36
environment (tests/support/celgo), run as the API server runs a policy (match conditions, then
variables, then each validation and its messageExpression), gives every validation the verdict and
the message our engine gives the bundle's rule: on the guide's example job and on jobs made to
break each rule."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from trainjob_admission.policies.bundle.compile import compile_document
from trainjob_admission.policies.decide.decision import Result
from tests.support import celgo, upstream
from tests.unit.test_docs import parse

GUIDE = "docs/admin-guide.md"


@dataclass
class Ported:
    policy: dict  # the ValidatingAdmissionPolicy's spec
    bundle: dict  # the PolicyBundle document
    line: int


def ported() -> list[Ported]:
    """Each ValidatingAdmissionPolicy block of the guide with the PolicyBundle block after it."""
    pairs, policy = [], None
    for block in parse(GUIDE):
        if block.lang != "yaml":
            continue
        text = "\n".join(block.body)
        if "kind: ValidatingAdmissionPolicy" not in text and "kind: PolicyBundle" not in text:
            continue
        (document, *more) = yaml.safe_load_all(text)
        kind = document.get("kind") if isinstance(document, dict) and not more else None
        if kind == "ValidatingAdmissionPolicy" and not block.steps:
            policy = (document["spec"], block.line)
        elif kind == "PolicyBundle" and policy is not None:
            pairs.append(Ported(policy[0], document, policy[1]))
            policy = None
    return pairs


def cel_of_policy(spec: dict) -> dict:
    return {
        "matchConditions": [(c["name"], c["expression"]) for c in spec.get("matchConditions", [])],
        "variables": [(v["name"], v["expression"]) for v in spec.get("variables", [])],
        "validations": [(v["expression"], v.get("message"), v.get("messageExpression")) for v in spec["validations"]],
        "auditAnnotations": [(a["key"], a["valueExpression"]) for a in spec.get("auditAnnotations", [])],
    }


def test_the_guide_ports_several_policies_each_with_its_cel_unchanged() -> None:
    pairs = ported()
    assert len(pairs) >= 3, f"{GUIDE}: expected a few ValidatingAdmissionPolicies each followed by its bundle"
    for pair in pairs:
        assert cel_of_policy(pair.bundle["spec"]) == cel_of_policy(pair.policy), \
            f"{GUIDE}:{pair.line}: the bundle after this policy does not carry its CEL unchanged"


# --- the same verdicts as cel-go ----------------------------------------------------------------

@dataclass
class Scenario:
    """A submission: the guide's example job changed by ``change``, in team-a with ``labels``."""

    name: str
    change: dict = field(default_factory=dict)  # dotted path under the job -> value (None: removed)
    labels: dict = field(default_factory=dict)  # merged into the namespace's labels
    old: dict | None = None  # changes that make the stored job of an UPDATE
    update: bool = False


SCENARIOS = [
    Scenario("as in the guide"),
    Scenario("16 nodes, image latest", {"spec.trainer.numNodes": 16,
                                        "spec.trainer.image": "quay.io/acme-ml/horovod-resnet:latest"}),
    Scenario("a label value with a space", {"metadata.labels": {"team": "team a"}}),
    Scenario("9 GPUs a node", {"spec.trainer.resourcesPerNode.limits": {"nvidia.com/gpu": 9}}),
    Scenario("no trainer image", {"spec.trainer.image": None}),
    Scenario("an image from elsewhere", {"spec.trainer.image": "docker.io/library/python:3.12"}),
    Scenario("... in an exempt namespace", {"spec.trainer.image": "docker.io/library/python:3.12"}, {"exempt": "true"}),
    Scenario("... in a namespace of that registry", {"spec.trainer.image": "docker.io/library/python:3.12"},
             {"registry": "docker.io/library"}),
    Scenario("an update that keeps the nodes", update=True, old={}),
    Scenario("an update from 4 to 8 nodes", {"spec.trainer.numNodes": 8}, update=True, old={}),
    Scenario("an update that drops numNodes", {"spec.trainer.numNodes": None}, update=True, old={}),
]


def changed(obj: dict, changes: dict) -> dict:
    obj = copy.deepcopy(obj)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return obj


def plain(tag: dict) -> Any:
    """cel-go's tagged value (tests/support/celgo) as JSON-like data, to feed a later expression."""
    (kind, value), *_ = tag.items()
    if kind == "list":
        return [plain(item) for item in value]
    if kind == "map":
        return {plain(key): plain(item) for key, item in value}
    if kind in ("int", "uint"):
        return int(value)
    if kind == "double":
        return float(value)
    assert kind in ("null", "bool", "string"), f"a variable of type {kind} cannot be passed on"
    return value


def cel_go_policy(spec: dict, data: dict) -> list[tuple[str, str]] | None:
    """What the API server's policy gives each validation, (result, message); None: not matched."""
    def run(expression: str) -> dict:
        (answer,) = celgo.evaluate([(expression, data)])
        assert "compile_error" not in answer, f"cel-go refuses {expression!r}: {answer['compile_error']}"
        return answer

    for condition in spec.get("matchConditions", []):
        answer = run(condition["expression"])
        assert "error" not in answer, f"{condition['name']}: {answer['error']}"
        if not answer["value"]["bool"]:
            return None
    data["variables"] = {}
    for variable in spec.get("variables", []):
        answer = run(variable["expression"])
        assert "error" not in answer, f"variables.{variable['name']}: {answer['error']}"
        data["variables"][variable["name"]] = plain(answer["value"])
    verdicts = []
    for validation in spec["validations"]:
        answer = run(validation["expression"])
        if "error" in answer:
            verdicts.append((Result.ERROR, ""))
        elif answer["value"]["bool"]:
            verdicts.append((Result.PASS, ""))
        else:
            message = validation.get("message", "")
            if "messageExpression" in validation:
                text = run(validation["messageExpression"]).get("value", {}).get("string", "")
                message = text.strip() if text.strip() and "\n" not in text.strip() else message
            verdicts.append((Result.FAIL, message))
    return verdicts


def test_each_ported_rule_gives_the_verdict_and_message_cel_go_gives(example_job, _example_objects, review, build) -> None:
    try:
        celgo.binary()
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))
    seen: set[tuple[str, Result]] = set()
    for pair in ported():
        bundle = compile_document(pair.bundle, f"{GUIDE}:{pair.line}")
        rules = [v["name"] for v in pair.bundle["spec"]["validations"]]
        for scenario in SCENARIOS:
            job = changed(example_job("allowed"), scenario.change)
            old = changed(example_job("allowed"), scenario.old) if scenario.update else None
            objects = copy.deepcopy(_example_objects)
            (namespace,) = [o for o in objects if o["kind"] == "Namespace" and o["metadata"]["name"] == "team-a"]
            namespace["metadata"]["labels"].update(scenario.labels)
            operation = "UPDATE" if scenario.update else "CREATE"
            data = {"object": job, "oldObject": old, "namespaceObject": namespace,
                    "request": {"operation": operation, "namespace": "team-a"}}
            theirs = cel_go_policy(pair.policy, copy.deepcopy(data))
            decision = review(job, [bundle], build.state(*objects), operation=operation, old=old)
            mine = [(r.result, r.messages[0] if r.result is Result.FAIL else "")
                    for r in decision.results if r.bundle == pair.bundle["metadata"]["name"]]
            where = f"{GUIDE}:{pair.line}, {scenario.name}"
            if theirs is None:
                assert mine == [], f"{where}: the policy does not match, yet the bundle judged {mine}"
                continue
            assert [m for m, _ in mine] == [t for t, _ in theirs], f"{where}: cel-go {theirs}, ours {mine}"
            for (result, message), (_, expected), rule in zip(mine, theirs, rules):
                seen.add((f"{pair.bundle['metadata']['name']}/{rule}", result))
                if result is Result.FAIL:
                    assert message.startswith(expected), f"{where}: cel-go says {expected!r}, we say {message!r}"
    rules = {rule for rule, _ in seen}
    unbroken = sorted(rule for rule in rules if (rule, Result.FAIL) not in seen or (rule, Result.PASS) not in seen)
    assert not unbroken, f"no scenario both passes and fails {unbroken}: add one"
