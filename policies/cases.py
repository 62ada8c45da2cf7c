"""``policy test``: admins' test cases for their bundles, like ``kyverno test``.

A case file (YAML, one or more documents) says what to submit and what must come back::

    name: 9 GPUs per worker is refused
    object: ../jobs/too-many-gpus.yaml      # a path (relative to the case file) or an inline object
    clusterState: ../cluster-state.yaml     # optional, relative path(s)
    operation: CREATE                       # optional
    expect:
      decision: deny                        # allow | warn | deny
      rules: [default/gpu-limits]           # optional: these rules must have failed
      messages: ["limit is 8 per worker"]   # optional: each must appear in some message or warning
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .bundle import Bundle
from .decision import FAILED
from .engine import AdmissionInput, evaluate
from .state import ClusterState, StateError, load_objects


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["allow", "warn", "deny"]
    rules: list[str] = []
    messages: list[str] = []


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    object: str | dict[str, Any]
    clusterState: str | list[str] = []
    operation: Literal["CREATE", "UPDATE"] = "CREATE"
    username: str = "tester"
    expect: Expect


class CaseError(ValueError):
    """A case file that cannot be read or does not match the case format."""


@dataclass
class CaseResult:
    source: str
    name: str
    passed: bool
    failures: list[str]


def _load_object(value: str | dict, base: Path) -> dict:
    if isinstance(value, dict):
        return value
    objects = load_objects(base / value)
    if len(objects) != 1:
        raise StateError(f"{value}: expected exactly one object, found {len(objects)}")
    return objects[0]


def load_cases(directory: Path) -> list[tuple[Path, Case]]:
    files = sorted(p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml")) if directory.is_dir() else [directory]
    cases = []
    for file in files:
        try:
            documents = [d for d in yaml.safe_load_all(file.read_text(encoding="utf-8")) if d is not None]
            cases.extend((file, Case.model_validate(doc)) for doc in documents)
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise CaseError(f"{file}: not a valid test case: {exc}") from None
    if not cases:
        raise CaseError(f"{directory}: no test cases found (*.yaml)")
    return cases


def run_case(path: Path, case: Case, bundles: list[Bundle]) -> CaseResult:
    base = path.parent
    try:
        obj = _load_object(case.object, base)
        states = [case.clusterState] if isinstance(case.clusterState, str) else case.clusterState
        state = ClusterState.from_objects(o for s in states for o in load_objects(base / s))
    except StateError as exc:
        raise CaseError(f"{path}: case {case.name!r}: {exc}") from None
    decision = evaluate(AdmissionInput(obj, operation=case.operation, username=case.username), bundles, state)
    failures = []
    if decision.decision != case.expect.decision:
        reasons = "; ".join(m["message"] for m in decision.messages) or "; ".join(decision.warnings)
        failures.append(f"expected {case.expect.decision}, got {decision.decision}" + (f" ({reasons})" if reasons else ""))
    failed_rules = {r.qualified for r in decision.results if r.result in FAILED}
    for rule in case.expect.rules:
        if rule not in failed_rules:
            failures.append(f"expected rule {rule} to fail; failed: {', '.join(sorted(failed_rules)) or 'none'}")
    texts = [m["message"] + " " + m["remediation"] for m in decision.messages] + decision.warnings
    for expected in case.expect.messages:
        if not any(expected in text for text in texts):
            failures.append(f"no message contains {expected!r}")
    return CaseResult(str(path), case.name, not failures, failures)
