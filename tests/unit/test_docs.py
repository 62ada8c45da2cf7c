"""Every command in the user docs is run, so the docs cannot drift from the product.

Conventions in docs/quickstart.md, admin-guide.md, auditor-guide.md, troubleshooting.md and deploy.md:

- A fenced block ```` ```console ```` holds commands: lines starting with ``$ `` (a trailing ``\\``
  continues a command on the next line). The lines after a command, up to the next ``$ ``, are
  its output as the doc shows it: each must match a line of the real output (stdout + stderr),
  in order, whitespace runs compared as one space; ``...`` in a line matches anything and a
  line that is only ``...`` stands for omitted lines. ``<NAME>`` (capitals) in an output line
  captures a token that later commands of the same doc use where they say ``<NAME>``.
- A command ends with ``# exit N`` when it is expected to exit with N (default 0).
- The info string says who runs the block: ``console`` (no cluster; this file, in a temp
  directory holding a copy of ``examples/``, one directory per doc so a doc reads as one
  session), ``console cluster`` (against the test control plane: tests/cluster/test_docs_cluster.py,
  or tests/cluster/test_newcomer.py in a doc that installs), ``console cluster-install`` (installs
  the service: tests/cluster/test_newcomer.py runs the doc's install and cluster blocks in order
  on the test control plane's real node; here only their ``trainjob-admission`` commands run, and
  every manifests path they name must exist or be written by a file block before).
- A block ```` ```yaml file=NAME ```` (or json) is written to NAME in the doc's directory before
  the next command runs, so a doc can show a bundle and then lint, test or apply it.
- Any other block is illustration; a ``kind: PolicyBundle`` in one must still compile.

A console block with a command this harness cannot run fails the test: nothing is skipped.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/quickstart.md", "docs/admin-guide.md", "docs/auditor-guide.md", "docs/troubleshooting.md", "docs/deploy.md")
RUNNERS = {"": "unit", "cluster": "cluster", "cluster-install": "install"}
OFFLINE_PROGRAMS = {"trainjob-admission", "make", "sed", "cp", "grep", "mkdir", "cat"}
FENCE = re.compile(r"^```(\w[\w-]*)?\s*(.*)$")
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
CAPTURE = re.compile(r"<([A-Z][A-Z0-9_]*)>")
TIMEOUT = 120


@dataclass
class Command:
    doc: str
    line: int
    text: str  # as written, continuation lines joined, without the exit marker
    exit: int
    output: list[str]
    runner: str  # unit | cluster | install

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class FileBlock:
    doc: str
    line: int
    name: str
    content: str


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    info: str
    body: list[str]
    steps: list = field(default_factory=list)  # Command | FileBlock


def parse(doc: str) -> list[Block]:
    """The fenced blocks of a doc, with commands and file blocks resolved."""
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    blocks, current = [], None
    for number, line in enumerate(lines, 1):
        if current is None:
            match = FENCE.match(line)
            if match:
                current = Block(doc, number, match.group(1) or "", match.group(2).strip(), [])
        elif line.startswith("```"):
            blocks.append(_resolve(current))
            current = None
        else:
            current.body.append(line)
    assert current is None, f"{doc}:{current.line}: unterminated code block"
    return blocks


def _resolve(block: Block) -> Block:
    file = re.fullmatch(r"file=(\S+)", block.info)
    if file:
        block.steps = [FileBlock(block.doc, block.line, file.group(1), "\n".join(block.body) + "\n")]
    elif block.lang == "console":
        runner = RUNNERS.get(block.info)
        assert runner, f"{block.doc}:{block.line}: unknown console block kind {block.info!r} (known: {sorted(RUNNERS)})"
        block.steps = _commands(block, runner)
        assert block.steps, f"{block.doc}:{block.line}: console block without a `$ ` command"
    return block


def _commands(block: Block, runner: str) -> list[Command]:
    commands: list[Command] = []
    pending: list[str] = []
    start = 0
    for offset, line in enumerate(block.body, 1):
        if pending:
            pending.append(line.strip())
        elif line.startswith("$ "):
            pending, start = [line[2:]], block.line + offset
        elif commands:
            commands[-1].output.append(line)
            continue
        elif line.strip():
            raise AssertionError(f"{block.doc}:{block.line + offset}: text before the first `$ ` command")
        else:
            continue
        if pending[-1].endswith("\\"):
            pending[-1] = pending[-1][:-1].rstrip()
            continue
        text = " ".join(pending)
        pending = []
        marker = EXIT.search(text)
        commands.append(Command(block.doc, start, EXIT.sub("", text), int(marker.group(1)) if marker else 0, [], runner))
    assert not pending, f"{block.doc}:{start}: command ends with a continuation"
    return commands


def steps(doc: str, runners: set[str]) -> list:
    """Commands for ``runners`` and every file block, in doc order."""
    out = []
    for block in parse(doc):
        out += [s for s in block.steps if isinstance(s, FileBlock) or s.runner in runners]
    return out


# --- running and checking --------------------------------------------------------------------

def pattern(expected: str) -> re.Pattern:
    """An output line of the doc as a regex: `...` anything, <NAME> a captured token."""
    parts = re.split(r"(\.\.\.|<[A-Z][A-Z0-9_]*>)", " ".join(expected.split()))
    regex, seen = "", set()
    for part in parts:
        if part == "...":
            regex += ".*?"
        elif CAPTURE.fullmatch(part):
            name = part[1:-1]
            regex += f"(?P={name})" if name in seen else f"(?P<{name}>[^\\s,\"']+)"
            seen.add(name)
        else:
            regex += re.escape(part)
    return re.compile(regex)


def match_output(expected: list[str], actual: str) -> tuple[list[str], dict[str, str]]:
    """Problems (empty when every shown line matches, in order) and the captured tokens."""
    lines = [" ".join(line.split()) for line in actual.splitlines()]
    position, captures, problems = 0, {}, []
    for shown in expected:
        if not shown.strip() or shown.strip() == "...":
            continue
        regex = pattern(shown)
        for index in range(position, len(lines)):
            found = regex.search(lines[index])
            if found:
                captures.update(found.groupdict())
                position = index + 1
                break
        else:
            problems.append(f"output has no line like {shown.strip()!r} (after line {position})")
    return problems, captures


def substitute(text: str, captures: dict[str, str], where: str) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        assert name in captures, f"{where}: <{name}> is used before an output line captured it"
        return captures[name]

    return CAPTURE.sub(value, text)


def pipeline(text: str) -> list[list[str]]:
    """`a | b` as argument lists; no shell is involved."""
    parts: list[list[str]] = [[]]
    for token in shlex.split(text):
        if token == "|":
            parts.append([])
        else:
            parts[-1].append(token)
    assert all(parts), f"empty command in {text!r}"
    return parts


def run(argvs: list[list[str]], cwd: Path, env: dict[str, str], timeout: float = TIMEOUT) -> tuple[int, str]:
    """Run a pipeline; the exit code is the last command's, the output all stdout + stderr."""
    data: bytes | None = None
    output, code = "", 0
    for argv in argvs:
        try:
            result = subprocess.run(argv, cwd=cwd, env=env, input=data, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:  # a problem of this command, reported with what it printed
            return -1, (exc.stdout or b"").decode(errors="replace") + f"\n(timed out after {timeout:g} s)"
        data, code = result.stdout, result.returncode
        output += result.stderr.decode(errors="replace")
    return code, data.decode(errors="replace") + output if data is not None else output


def execute(command: Command, resolve: Callable[[list[str]], list[str]], cwd: Path, env: dict[str, str],
            captures: dict[str, str], timeout: float = TIMEOUT) -> list[str]:
    """Run one doc command and compare exit code and output; returns the problems."""
    text = substitute(command.text, captures, command.where)
    code, output = run([resolve(argv) for argv in pipeline(text)], cwd, env, timeout)
    problems, found = match_output(command.output, output)
    captures.update(found)
    if code != command.exit:
        problems.insert(0, f"exit code {code}, the doc says {command.exit}")
    if problems:
        return [f"{command.where}: $ {text}\n    " + "\n    ".join(problems) + "\n    --- output ---\n    "
                + "\n    ".join(output.splitlines()[:40])]
    return []


def write_file(block: FileBlock, cwd: Path, transform: Callable[[str], str] = lambda s: s) -> None:
    target = (cwd / block.name).resolve()
    assert target.is_relative_to(cwd.resolve()), f"{block.doc}:{block.line}: file= must stay in the doc's directory"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(transform(block.content), encoding="utf-8")


def offline_program(argv: list[str]) -> list[str]:
    program = argv[0]
    assert program in OFFLINE_PROGRAMS, f"a `console` block may run {sorted(OFFLINE_PROGRAMS)}, not {program!r}"
    if program == "trainjob-admission":
        return [str(Path(sys.executable).with_name("trainjob-admission")), *argv[1:]]
    if program == "make":
        assert argv[1:] == ["demo"], "only `make demo` is run from the docs"
        return ["make", "-s", "-C", str(ROOT), "demo"]
    return [shutil.which(program) or program, *argv[1:]]


@pytest.fixture
def doc_dir(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run_as_shown(doc: str, doc_dir: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    captures: dict[str, str] = {}
    problems: list[str] = []
    ran = 0
    for step in steps(doc, {"unit", "install"}):
        if isinstance(step, FileBlock):
            write_file(step, doc_dir)
        elif step.runner == "unit" or step.text.startswith("trainjob-admission "):
            problems += execute(step, offline_program, doc_dir, env, captures)
            ran += 1
    assert not problems, "\n".join(problems)
    assert ran or doc == "docs/quickstart.md", f"{doc} has no offline command"


def test_every_console_block_has_a_runner() -> None:
    """Cluster commands run in the cluster tier; install commands must be covered there too."""
    for doc in DOCS:
        for block in parse(doc):
            for step in block.steps:
                if isinstance(step, Command) and step.runner == "unit":
                    offline_program(pipeline(step.text)[0])  # raises for a program we cannot run
                elif isinstance(step, Command):
                    program = pipeline(step.text)[0][0]
                    assert program in ("kubectl", "trainjob-admission"), \
                        f"{step.where}: cluster blocks run kubectl or trainjob-admission, not {program!r}"


def manifest_paths(text: str) -> list[str]:
    return re.findall(r"(manifests/[\w./-]+?)/?(?=\s|$)", text)


def test_install_blocks_install_from_the_manifests_or_the_docs_own_overlay() -> None:
    """`cluster-install` blocks run kubectl or trainjob-admission; every manifests/ path they name is
    in the repository or written by a file block of the same doc before the command (the reader's own
    overlay). tests/cluster/test_newcomer.py runs them in order on the test control plane."""
    count = 0
    for doc in DOCS:
        written: list[str] = []
        for step in steps(doc, {"install"}):
            if isinstance(step, FileBlock):
                written.append(step.name)
                continue
            assert step.text.split()[0] in ("kubectl", "trainjob-admission"), \
                f"{step.where}: install blocks run kubectl or trainjob-admission"
            for path in manifest_paths(step.text) if step.text.startswith("kubectl ") else []:
                count += 1
                assert (ROOT / path).exists() or any(name.startswith(path + "/") for name in written), \
                    f"{step.where}: {path} is neither in the repository nor written by this doc before"
    assert count >= 4, "the quickstart and deploy.md install from manifests/ in cluster-install blocks"


def test_the_quickstart_and_deploy_install_alike() -> None:
    """Both pages install; the quickstart's steps are deploy.md's (so the newcomer and the admin
    reading the details do the same), each run as printed by tests/cluster/test_newcomer.py."""
    def install(doc: str) -> list[str]:
        return [(s.name + s.content) if isinstance(s, FileBlock) else " ".join(s.text.split())
                for s in steps(doc, {"install"}) if isinstance(s, FileBlock) or s.runner == "install"]

    quickstart, deploy = install("docs/quickstart.md"), install("docs/deploy.md")
    assert sorted(quickstart) == sorted(deploy), (quickstart, deploy)
    assert any("certs checkpoint-key" in step for step in quickstart)  # without it the overlay does not build


def test_the_readme_counts_the_guides_it_names() -> None:
    """"Every command in these N guides" named the guides test_docs runs, and N said how many."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    found = re.search(r"Every command in these (\w+) guides, ([^.]+?) is run", text)
    assert found, "the README says which guides' commands are run"
    names = [n.strip() for n in re.split(r",| and ", found[2]) if n.strip()]
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    assert words.index(found[1]) + 1 == len(names), found[0]
    assert sorted(names) == sorted(Path(doc).stem for doc in DOCS), found[0]


def test_docs_cite_only_files_the_repository_has() -> None:
    """The docs once cited a DESIGN.md that is not in the repository."""
    missing = []
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for name in re.findall(r"(?<![\w/.-])([\w-]+\.md)\b", page.read_text(encoding="utf-8")):
            if not any((where / name).is_file() for where in (ROOT, ROOT / "docs", page.parent)):
                missing.append(f"{page.relative_to(ROOT)}: {name}")
    assert missing == []


def test_policy_bundles_shown_in_docs_compile_or_are_run() -> None:
    """A bundle shown as illustration compiles; one written with file= is used by a command."""
    from trainjob_admission.policies.bundle.compile import compile_document

    count = 0
    for doc in DOCS:
        blocks = parse(doc)
        commands = " ".join(s.text for b in blocks for s in b.steps if isinstance(s, Command))
        for block in blocks:
            if block.lang not in ("yaml", "json") or "kind: PolicyBundle" not in "\n".join(block.body):
                continue
            count += 1
            if block.steps:
                assert block.steps[0].name in commands, f"{doc}:{block.line}: no command uses {block.steps[0].name}"
                continue
            for document in yaml.safe_load_all("\n".join(block.body)):
                if isinstance(document, dict) and document.get("kind") == "PolicyBundle":
                    compile_document(document, f"{doc}:{block.line}")
    assert count >= 3


# --- references that must match the code -----------------------------------------------------

def doc_table(doc: str, heading: str) -> list[list[str]]:
    """The rows (cells without backticks) of the first table after a heading that starts with ``heading``."""
    lines = (ROOT / doc).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and line.lstrip("#").strip().startswith(heading))
    rows, started = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            started = True
            cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif started or line.startswith("#"):
            break
    assert len(rows) > 1, f"{doc}: no table under {heading!r}"
    return rows[1:]


def model_fields(model: type[BaseModel], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Every field path of a pydantic model -> (annotation, default or 'required')."""
    out: dict[str, tuple[Any, Any]] = {}
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        default = "required" if info.default is PydanticUndefined and info.default_factory is None else (
            info.default_factory() if info.default_factory else info.default)
        if isinstance(default, BaseModel):
            default = {} if _all_defaults(default) else default.model_dump(mode="json")
        out[path] = (info.annotation, default)
        for nested, suffix in _nested_models(info.annotation):
            out.update(model_fields(nested, f"{path}{suffix}."))
    return out


def _all_defaults(value: BaseModel) -> bool:
    """A section whose default is "every sub-field at its default" is documented as `{}`."""
    try:
        return value == type(value)()
    except ValueError:
        return False


def _nested_models(annotation: Any) -> list[tuple[type[BaseModel], str]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    if get_origin(annotation) is list:
        return [(m, "[]") for m, _ in _nested_models(get_args(annotation)[0])]
    return [m for arg in get_args(annotation) for m in _nested_models(arg)]


def literal_values(annotation: Any) -> list[str]:
    if str(get_origin(annotation)) == "typing.Literal":
        return [str(v) for v in get_args(annotation)]
    return [v for arg in get_args(annotation) for v in literal_values(arg)]


def test_bundle_reference_lists_every_schema_field_with_its_default() -> None:
    """docs/admin-guide.md "Bundle reference" against policies.bundle.schema.BundleDocument."""
    from trainjob_admission.policies.bundle.schema import BundleDocument

    fields = {path: value for path, value in model_fields(BundleDocument).items()}
    rows = {row[0].strip("`"): row for row in doc_table("docs/admin-guide.md", "Bundle reference")}
    assert sorted(rows) == sorted(fields), (
        f"documented but not in the schema: {sorted(set(rows) - set(fields))}; "
        f"in the schema but not documented: {sorted(set(fields) - set(rows))}")
    for path, (annotation, default) in fields.items():
        cell = rows[path][2].strip("`")
        documented = cell if default == "required" or cell == "required" else json.loads(cell)
        assert documented == default, f"{path}: the doc says default {cell}, the schema has {default!r}"
        for value in literal_values(annotation):
            assert f"`{value}`" in rows[path][1], f"{path}: allowed value {value!r} is not in its type cell"


def test_bundle_reference_names_each_built_in_check_by_its_rule() -> None:
    """Admins read a rule name in a denial or a log and look it up in the bundle reference."""
    from trainjob_admission.policies.checks.registry import CHECKS

    rows = {row[0].strip("`"): row for row in doc_table("docs/admin-guide.md", "Bundle reference")}
    for check in CHECKS:
        assert f"rule `{check.rule}`" in rows[f"spec.checks.{check.setting}"][3], check


def test_built_in_rules_table_lists_every_rule_a_cel_rule_may_not_take() -> None:
    """docs/admin-guide.md "Built-in rules" against policies/bundle/rulenames.py (which bundles refuse)."""
    from trainjob_admission.policies.bundle.rulenames import BUILTIN_RULES

    assert [row[0].strip("`") for row in doc_table("docs/admin-guide.md", "Built-in rules")] == list(BUILTIN_RULES)


def test_serve_settings_table_matches_the_settings() -> None:
    """docs/deploy.md "Server settings" against the one table serve's flags, config keys and
    defaults come from (webhook/cli/settings.py), and the flags the parser really has."""
    from trainjob_admission.webhook.cli.main import build_parser
    from trainjob_admission.webhook.cli.settings import SETTINGS, config_schema

    rows = [[cell.strip("`") for cell in row[:3]] for row in doc_table("docs/deploy.md", "Server settings")]
    assert rows == [[s.key, s.flag, s.default_text] for s in SETTINGS]
    assert list(config_schema().model_fields) == [s.key for s in SETTINGS]
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = {option for action in serve._actions for option in action.option_strings}
    assert {s.flag for s in SETTINGS} <= flags


def test_security_model_cites_tests_that_exist() -> None:
    """docs/security.md says which test proves each defence: each one cited must exist."""
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    cited = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert len(cited) > 20
    for path, test in cited:
        assert (ROOT / path).is_file(), path
        if test:
            assert re.search(rf"^(async )?def {test}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), f"{path}::{test}"


def test_cel_reference_matches_the_environment() -> None:
    from trainjob_admission.policies.cel import environment

    variables = [row[0].strip("`") for row in doc_table("docs/admin-guide.md", "CEL variables")]
    assert variables == list(environment.VARIABLES)
    from trainjob_admission.policies.cel.library import reference_rows

    documented = [tuple(row) for row in doc_table("docs/admin-guide.md", "CEL functions")]
    expected = [tuple(cell.replace("\\|", "|") for cell in row) for row in reference_rows()]
    table = "\n".join("| " + " | ".join(row) + " |" for row in reference_rows())
    assert documented == expected, f"docs/admin-guide.md 'CEL functions' is not the registry's; the table is:\n{table}"
    assert {row[0] for row in documented} == set(environment.FUNCTIONS)


def test_cel_function_examples_evaluate_to_the_documented_values() -> None:
    """Every example of the 'CEL functions' table (each overload's ``example``) is true here."""
    from trainjob_admission.policies.cel.environment import Budget, compile_expression
    from trainjob_admission.policies.cel.library import REGISTRY

    examples = [o.example for o in REGISTRY.overloads() if o.example]
    for expression, value in examples:
        assert compile_expression(f"({expression}) == ({value})").evaluate({}, Budget()) is True, expression
    assert len(examples) >= 30


def test_job_variable_reference_matches_the_effective_job(example_state, example_job) -> None:
    from trainjob_admission.policies.job import effective_job

    job = effective_job.build(example_job("allowed"), example_state).as_cel()
    actual = {f"job.{k}" for k in job} | {f"job.totals.{k}" for k in job["totals"]} | \
        {f"job.podSets[].{k}" for k in job["podSets"][0]}
    documented = {row[0].strip("`") for row in doc_table("docs/admin-guide.md", "The `job` variable")}
    assert documented == actual, f"undocumented: {sorted(actual - documented)}; unknown: {sorted(documented - actual)}"


def test_cel_examples_evaluate_to_the_documented_values(example_state, example_job, review, make_bundle, default) -> None:
    """Each row of "CEL examples" is evaluated by the engine on examples/jobs/allowed.yaml."""
    rows = doc_table("docs/admin-guide.md", "CEL examples")
    for expression, value, *_ in rows:
        expression, value = expression.strip("`"), value.strip("`")
        bundle = make_bundle({"params": {"maxJobGpus": 16},
                              "validations": [{"name": "example", "expression": f"({expression}) == ({value})"}]})
        decision = review(example_job("allowed"), [bundle, *default], example_state, username="alice", groups=["team-a"])
        result = next(r for r in decision.results if r.rule == "example")
        assert result.result == "pass", f"{expression} is not {value}: {result.messages}"
    assert len(rows) >= 8


def test_exit_code_table_matches_the_cli() -> None:
    from trainjob_admission.webhook.cli import main

    codes = {int(row[0].strip("`")) for row in doc_table("docs/troubleshooting.md", "Exit codes")}
    assert codes == {main.EXIT_OK, main.EXIT_DENIED, main.EXIT_INVALID, main.EXIT_NOT_FOUND, main.EXIT_UNREACHABLE,
                     main.EXIT_BROKEN_PIPE}


def documented_record_keys() -> set[str]:
    return {key.strip(" `") for row in doc_table("docs/auditor-guide.md", "Record format") for key in row[0].split(",")}


def test_decision_record_reference_matches_the_record_type() -> None:
    """docs/auditor-guide.md "Record format" lists exactly the DecisionRecord fields and the keys the log chains in."""
    from dataclasses import fields

    from trainjob_admission.webhook.decisionlog import LOG_KEYS
    from trainjob_admission.webhook.admission.record import DecisionRecord

    actual = {f.name for f in fields(DecisionRecord)} | set(LOG_KEYS)
    documented = documented_record_keys()
    assert documented == actual, f"undocumented: {sorted(actual - documented)}; not a field: {sorted(documented - actual)}"


def test_patch_op_keys_are_documented() -> None:
    """The guide's `patch` row names every key a recorded op can have (webhook/admission/record.py _bounded_value)."""
    from trainjob_admission.webhook.admission.record import MAX_PATCH_VALUE, _bounded_value

    row = next(row[1] for row in doc_table("docs/auditor-guide.md", "Record format") if row[0].strip("` ") == "patch")
    keys = set(_bounded_value({"op": "add", "path": "/a", "value": 1})) | set(_bounded_value(
        {"op": "add", "path": "/a", "value": "x" * MAX_PATCH_VALUE})) | {"from"}
    assert {key for key in keys if f"`{key}`" not in row} == set(), row
    assert f"{MAX_PATCH_VALUE // 1024} KiB" in row


def test_decision_record_fields_are_the_logged_ones(tmp_path: Path) -> None:
    """Every key the server writes (here: the demo's records) is documented."""
    result = subprocess.run([str(Path(sys.executable).with_name("trainjob-admission")), "demo", "--workdir",
                             str(tmp_path)], capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    keys = {key for line in (tmp_path / "decisions.jsonl").read_text().splitlines() for key in json.loads(line)}
    assert keys <= documented_record_keys(), f"undocumented: {sorted(keys - documented_record_keys())}"


def test_harness_matches_and_fails() -> None:
    """The harness itself: a wrong line, order or exit code is reported."""
    assert match_output(["a ... c", "<ID> done"], "a b c\nx 42 done\n") == ([], {"ID": "42"})
    assert match_output(["second", "first"], "first\nsecond\n")[0]
    assert match_output(["missing"], "present\n")[0]
    assert pipeline("a 'b | c' | d e") == [["a", "b | c"], ["d", "e"]]


def test_parity_table_names_tests_that_exist() -> None:
    """Each "proven by" cell of the admin guide's comparison names test files (and functions) that
    exist, so a renamed or deleted test cannot leave a claim unproven."""
    text = (ROOT / "docs/admin-guide.md").read_text()
    section = text.split("## Compared with ValidatingAdmissionPolicy, Kyverno and Gatekeeper", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    named = [ref for row in rows for ref in re.findall(r"`(tests/[^`]+)`", row[-1])]
    assert len(named) >= 12
    for ref in named:
        path, _, function = ref.partition("::")
        assert (ROOT / path).is_file(), ref
        if function:
            assert re.search(rf"^(async )?def {re.escape(function)}\(", (ROOT / path).read_text(), re.M), ref


def test_the_component_map_names_every_module() -> None:
    """docs/architecture.md's component map has a section per package with a row per module: a
    module added, moved or renamed without its row fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^#### `((?:policies|webhook)/\w+)/`\n(.*?)(?=^#### |^\*\*|^## )", text, re.M | re.S))
    assert len(sections) >= 11
    missing = [f"{package}/{path.name}" for package, section in sections.items()
               for path in sorted((ROOT / package).glob("*.py"))
               if path.name != "__init__.py" and f"`{path.name}`" not in section]
    assert missing == []
    packages = {str(p.parent.relative_to(ROOT)) for top in ("policies", "webhook") for p in (ROOT / top).glob("*/__init__.py")}
    assert packages <= set(sections)
