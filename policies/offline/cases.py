"""``policy test``: admins' test cases for their bundles, like ``kyverno test``.

A case says what to submit (object, oldObject, operation, user, groups, cluster state) and what
must come back (decision, failed rules, messages, warnings, patches, injections); the format is
documented in docs/admin-guide.md "Test cases". A malformed case file is reported one line per
problem, with the file, line and field, never as a validation dump.
"""
from __future__ import annotations

import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .. import PolicyError
from ..bundle.compile import Bundle
from ..decide.decision import FAILED, Decision
from ..decide.engine import AdmissionInput, evaluate
from ..k8s import manifests
from ..k8s.clusterstate import ClusterState, StateError, load_objects

FORMAT_DOC = "docs/admin-guide.md#test-cases"
WARNING_RULE = re.compile(r"\[([^\]\s]+)(?: audit)?\] ")  # how engine.evaluate prefixes a rule's warning


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Text(Strict):
    """A text some message or warning must contain, or match as a regular expression (Python
    ``re.search``); with ``rule``, only that rule's (``bundle/rule``). A plain string is ``contains``."""

    contains: str | None = None
    regex: str | None = None
    rule: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"contains": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_pattern(self) -> Text:
        if (self.contains is None) == (self.regex is None):
            raise ValueError("give either contains or regex")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex {self.regex!r} is not a valid regular expression: {exc}") from None
        return self

    def found_in(self, texts: list[tuple[str | None, str]]) -> bool:
        return any((self.rule is None or rule == self.rule)
                   and (self.contains in text if self.contains is not None else re.search(self.regex or "", text))
                   for rule, text in texts)

    def describe(self, what: str) -> str:
        of = f" of rule {self.rule}" if self.rule else ""
        pattern = f"contains {self.contains!r}" if self.contains is not None else f"matches /{self.regex}/"
        return f"no {what}{of} {pattern}"


class Patch(Strict):
    """A JSON Patch operation the mutation must include; ``value``, when given, must be equal."""

    op: Literal["add", "remove", "replace", "move", "copy", "test"]
    path: str
    value: Any = None

    def found_in(self, patch: list[dict]) -> bool:
        return any(p.get("op") == self.op and p.get("path") == self.path
                   and ("value" not in self.model_fields_set or p.get("value") == self.value) for p in patch)

    def describe(self) -> str:
        value = f" with value {self.value!r}" if "value" in self.model_fields_set else ""
        return f"no patch {self.op} {self.path}{value}"


class Injection(Strict):
    """An object the service must create for the job (kind, and name when given)."""

    kind: str
    name: str | None = None

    def found_in(self, injections: list[dict]) -> bool:
        return any(i.get("kind") == self.kind and self.name in (None, i.get("name")) for i in injections)

    def describe(self) -> str:
        return f"no injection {self.kind}" + (f" {self.name}" if self.name else "")


class Expect(Strict):
    """Each listed item must be found (others may come back too); an empty list means none may."""

    decision: Literal["allow", "warn", "deny"]
    rules: list[str] = []
    messages: list[Text] | None = None  # denials (message and fix) and, as ever, warnings
    warnings: list[Text] | None = None
    patches: list[Patch] | None = None
    injections: list[Injection] | None = None


class Case(Strict):
    name: str
    object: str | dict[str, Any]
    oldObject: str | dict[str, Any] | None = None
    clusterState: list[str] = []
    operation: Literal["CREATE", "UPDATE"] = "CREATE"
    user: str = Field("tester", validation_alias=AliasChoices("user", "username"))
    groups: list[str] = []
    expect: Expect

    @field_validator("object", "oldObject", mode="before")
    @classmethod
    def _path_or_object(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, (str, dict)):
            raise ValueError(f"give a path relative to the case file or the object inline, got {type(value).__name__}")
        return value

    @field_validator("clusterState", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _old_object_for_update(self) -> Case:
        if self.operation == "UPDATE" and self.oldObject is None:
            raise ValueError("an UPDATE case needs oldObject: the job as it was before the update")
        if self.operation == "CREATE" and self.oldObject is not None:
            raise ValueError("oldObject is for operation: UPDATE only")
        return self


class CaseError(PolicyError, ValueError):
    """Case files that cannot be read or do not match the case format: one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class Outcome:
    """What came back for a case, as the failure output and ``-o json`` show it."""

    decision: str
    messages: list[dict]
    warnings: list[str]
    patches: list[dict]
    injections: list[dict]

    @classmethod
    def of(cls, decision: Decision) -> Outcome:
        return cls(str(decision.decision), decision.messages, list(decision.warnings), decision.patch,
                   [{"kind": i["kind"], "name": i["name"]} for i in decision.injections])

    def lines(self) -> list[str]:
        return ([f"decision: {self.decision}"]
                + [f"message: [{m['rule']}] {m['message']}" for m in self.messages]
                + [f"warning: {w}" for w in self.warnings]
                + [f"patch: {p['op']} {p['path']}" for p in self.patches]
                + [f"injection: {i['kind']} {i['name']}" for i in self.injections])


@dataclass
class CaseResult:
    source: str
    name: str
    passed: bool
    failures: list[str]
    got: Outcome | None = None  # None only for results built by hand


def load_cases(directory: Path) -> list[tuple[Path, Case]]:
    """Every case of a file or a directory's ``*.yaml`` files (recursively); every problem of every
    file in one :class:`CaseError`."""
    files = sorted(p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml")) if directory.is_dir() else [directory]
    cases: list[tuple[Path, Case]] = []
    problems: list[str] = []
    for file in files:
        try:  # bounded as every manifest is (policies/k8s/manifests.py): a case's object is a job file
            nodes = manifests.parse_nodes(manifests.read_text(file), "a policy test case file")
        except OSError as exc:
            problems.append(f"{file}: cannot read: {exc.strerror}")
            continue
        except UnicodeDecodeError as exc:
            problems.append(f"{file}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})")
            continue
        except manifests.ManifestError as exc:
            problems.append(f"{file}:{exc.line or 1}: {exc.message}")
            continue
        for number, (document, node) in enumerate(nodes, 1):
            try:
                cases.append((file, Case.model_validate(document)))
            except ValidationError as exc:
                found = [_problem(number, node, document, err) for err in exc.errors()]
                problems += [f"{file}:{line}: {text}" for line, text in sorted(found, key=lambda p: p[0])]
    if problems:
        raise CaseError(list(dict.fromkeys(problems)))
    if not cases:
        raise CaseError([f"{directory}: no test cases found (*.yaml)"])
    return cases


def _problem(number: int, node: yaml.Node, document: Any, err: Any) -> tuple[int, str]:
    """(line, what is wrong where) for one pydantic error."""
    loc = _fields_in(document, err["loc"], err["type"] == "missing")
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    name = document.get("name") if isinstance(document, dict) else None
    where = f"case {name!r}" if isinstance(name, str) else f"document {number}"
    if err["type"] == "extra_forbidden":
        message = f"unknown field (known: {', '.join(_fields(loc[:-1]))}; see {FORMAT_DOC})"
    elif err["type"] == "missing":
        message = "required"
    elif err["type"] in ("model_type", "dict_type"):
        message = f"must be a mapping, got {type(err.get('input')).__name__}"
    elif err["type"] == "value_error":
        message = err["msg"].removeprefix("Value error, ")
    else:
        message = f"{err['msg']}, got {err.get('input')!r}"
    return _line(node, loc), f"{where}: {path or '(case)'}: {message}"


def _fields_in(document: Any, loc: tuple, missing: bool) -> list:
    """``loc`` without the union members pydantic names in it: the keys and indexes the document
    has, and for a missing field its name."""
    out, value = [], document
    for i, part in enumerate(loc):
        if isinstance(value, dict) and part in value or isinstance(value, list) and isinstance(part, int) \
                and 0 <= part < len(value):
            out.append(part)
            value = value[part]
        elif missing and i == len(loc) - 1:
            out.append(part)
    return out


def _line(node: yaml.Node, loc: list) -> int:
    """The line of the deepest node along ``loc`` that the file has."""
    for part in loc:
        children: dict[Any, yaml.Node] = {}
        if isinstance(node, yaml.MappingNode):
            children = {key.value: value for key, value in node.value}
        elif isinstance(node, yaml.SequenceNode):
            children = dict(enumerate(node.value))
        if part not in children:
            break
        node = children[part]
    return node.start_mark.line + 1


def _fields(loc: list) -> list[str]:
    """The fields of the case-format model at ``loc`` (for an unknown field: what is known there)."""
    model: type[BaseModel] = Case
    for part in loc:
        if isinstance(part, str) and part in model.model_fields:
            model = next((t for t in _types(model.model_fields[part].annotation) if _is_model(t)), model)
    return list(model.model_fields)


def _types(annotation: Any) -> list[Any]:
    if get_origin(annotation) in (list, Union, types.UnionType):
        return [t for arg in get_args(annotation) for t in _types(arg)]
    return [annotation]


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _load_object(value: str | dict, base: Path) -> dict:
    if isinstance(value, dict):
        return value
    objects = load_objects(base / value)
    if len(objects) != 1:
        raise StateError(f"{value}: expected exactly one object, found {len(objects)}")
    return objects[0]


def run_case(path: Path, case: Case, bundles: list[Bundle]) -> CaseResult:
    """Decide the case as the webhook would and compare; a file it names that cannot be read is a CaseError."""
    base = path.parent
    try:
        obj = _load_object(case.object, base)
        old = _load_object(case.oldObject, base) if case.oldObject is not None else None
        state = ClusterState.from_objects(o for s in case.clusterState for o in load_objects(base / s))
    except StateError as exc:
        raise CaseError([f"{path}: case {case.name!r}: {exc}"]) from None
    request = AdmissionInput(obj, operation=case.operation, old_object=old, username=case.user, groups=case.groups)
    decision = evaluate(request, bundles, state)
    failures = _failures(case.expect, decision)
    return CaseResult(str(path), case.name, not failures, failures, Outcome.of(decision))


def _failures(expect: Expect, decision: Decision) -> list[str]:
    failures = []
    if decision.decision != expect.decision:
        failures.append(f"expected {expect.decision}, got {decision.decision}")
    failed_rules = {r.qualified for r in decision.results if r.result in FAILED}
    failures += [f"expected rule {rule} to fail; failed: {', '.join(sorted(failed_rules)) or 'none'}"
                 for rule in expect.rules if rule not in failed_rules]
    denials = [(m["rule"], f"{m['message']} {m['remediation']}") for m in decision.messages]
    warnings = [(_warning_rule(w), w) for w in decision.warnings]
    failures += _texts("message", expect.messages, denials + warnings, len(denials))
    failures += _texts("warning", expect.warnings, warnings, len(warnings))
    if expect.patches == [] and decision.patch:
        failures.append(f"expected no patch, got {len(decision.patch)}")
    failures += [p.describe() for p in expect.patches or [] if not p.found_in(decision.patch)]
    if expect.injections == [] and decision.injections:
        failures.append(f"expected no injection, got {len(decision.injections)}")
    failures += [i.describe() for i in expect.injections or [] if not i.found_in(decision.injections)]
    return failures


def _texts(what: str, expected: list[Text] | None, texts: list[tuple[str | None, str]], count: int) -> list[str]:
    if expected == [] and count:
        return [f"expected no {what}, got {count}"]
    return [t.describe(what) for t in expected or [] if not t.found_in(texts)]


def _warning_rule(warning: str) -> str | None:
    match = WARNING_RULE.match(warning)
    return match.group(1) if match else None
