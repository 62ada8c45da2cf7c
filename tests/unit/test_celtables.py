"""The CEL parser from the per-user cache (policies/cel/tables.py): it parses as the parser built
from the grammar does, and a cache that is corrupt, for other versions, or not private to the user
is never used."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import lark
import pytest
import yaml

from trainjob_admission.policies.cel import tables
from tests.unit.test_cel_conformance import SUITE, cases
from tests.unit.test_cli import ROOT, SCRIPT, STATE

BUNDLES = [*sorted((ROOT / "policies" / "bundle" / "builtin").glob("*.yaml")), *sorted((ROOT / "examples" / "bundles").glob("*.yaml"))]
BROKEN = ["a ==", "1 +* 2", "a.b(", "'x", "[1, 2", "{1: }", "a ? b", "x.all(y, )", "\\", "", "a.?", "a[?]", "[?]"]


def expressions(value: object) -> list[str]:
    """Every rule expression and message expression in a bundle document."""
    if isinstance(value, dict):
        return [text for key, item in value.items()
                for text in ([item] if key in ("expression", "messageExpression") and isinstance(item, str)
                             else expressions(item))]
    if isinstance(value, list):
        return [text for item in value for text in expressions(item)]
    return []


SOURCES = sorted({text for path in BUNDLES for document in yaml.safe_load_all(path.read_text())
                  for text in expressions(document)} | {expression for _, expression, _ in cases()})


def outcome(parser: lark.Lark, source: str) -> object:
    try:
        return parser.parse(source)
    except lark.exceptions.LarkError as exc:
        return type(exc).__name__, str(exc)


@pytest.fixture
def fresh_parser():
    """The process's parser slot emptied for the test and restored after it."""
    kept = tables.PARSER
    tables.PARSER = None
    yield
    tables.PARSER = kept


@pytest.fixture(scope="module")
def reference() -> lark.Lark:
    return tables.build()


def test_the_cached_tables_parse_and_refuse_as_the_built_parser(tmp_path: Path, reference: lark.Lark) -> None:
    """Every expression of the shipped bundles and of the cel-spec suite: the same tree, or the same error."""
    path = tmp_path / "cache" / "tables.json"
    tables.save(reference, path)
    cached = tables.load(path)
    assert cached is not None and cached is not reference
    assert len(SOURCES) > (300 if SUITE is not None else 5)  # the suite's expressions wherever Go can fetch them
    for source in [*SOURCES, *BROKEN]:
        assert outcome(cached, source) == outcome(reference, source), source


def test_install_writes_a_private_cache_and_the_next_process_reads_it(tmp_path: Path, fresh_parser) -> None:
    tables.install(tmp_path / "c")
    written, = (tmp_path / "c").iterdir()
    assert (os.stat(tmp_path / "c").st_mode & 0o777, os.stat(written).st_mode & 0o777) == (0o700, 0o600)
    built = tables.PARSER
    assert built.source_path != "<deserialized>"
    tables.PARSER = None
    tables.install(tmp_path / "c")
    assert tables.PARSER.source_path == "<deserialized>"


def spoil_corrupt(path: Path) -> None:
    path.write_text(path.read_text()[:5000])


def spoil_other_version(path: Path) -> None:
    path.write_text(path.read_text().replace(tables.key(), "0" * 64))


def spoil_writable_by_others(path: Path) -> None:
    path.chmod(0o622)


def spoil_symlink(path: Path) -> None:
    target = path.with_name("elsewhere.json")
    path.rename(target)
    path.symlink_to(target)


def spoil_not_json_tables(path: Path) -> None:
    path.write_text('{"key": "%s", "tables": {"data": [], "memo": {}}}' % tables.key())


@pytest.mark.parametrize("spoil", [spoil_corrupt, spoil_other_version, spoil_writable_by_others, spoil_symlink,
                                   spoil_not_json_tables])
def test_a_spoiled_cache_is_ignored_and_written_again(tmp_path: Path, fresh_parser, spoil) -> None:
    tables.install(tmp_path)
    path, = tmp_path.iterdir()
    spoil(path)
    assert tables.load(path) is None
    tables.PARSER = None
    tables.install(tmp_path)  # rebuilt, and the file replaced by a good one
    assert tables.PARSER.source_path != "<deserialized>"
    assert tables.load(path) is not None and not path.is_symlink()


def test_a_cache_directory_others_may_write_is_not_used(tmp_path: Path, fresh_parser) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    tables.install(shared)
    assert list(shared.iterdir()) == []  # nothing written where others could swap it
    assert tables.PARSER is not None  # built in memory: the command goes on


def test_review_decides_the_same_with_an_empty_a_filled_and_a_corrupt_cache(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}

    def review() -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPT), "review", "-f", "examples/jobs/", *STATE, "-o", "json"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)

    first = review()
    path, = (tmp_path / "trainjob-admission").iterdir()
    second = review()
    path.write_text("{not json")
    third = review()
    assert first.returncode == second.returncode == third.returncode == 1  # some are denied
    assert first.stdout == second.stdout == third.stdout and first.stderr == second.stderr == third.stderr
    assert tables.load(path) is not None  # the corrupt file was replaced


def test_a_relative_xdg_cache_home_is_ignored_for_the_home_directorys(tmp_path: Path, monkeypatch) -> None:
    """As the XDG spec says: a relative path would put the cache wherever the command runs."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert tables.cache_dir() == tmp_path / ".cache" / "trainjob-admission"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tables.cache_dir() == tmp_path / "xdg" / "trainjob-admission"


def test_the_extended_grammar_gives_cel_pythons_trees_for_what_cel_python_parses(reference: lark.Lark) -> None:
    """The extensions (optional syntax, trailing commas) add trees, never change one: an expression
    cel-python's own grammar parses gets the very same tree."""
    from celpy import celparser

    own = celparser.CELParser.CEL_PARSER or (celparser.CELParser() and celparser.CELParser.CEL_PARSER)
    for source in SOURCES:
        try:
            expected = own.parse(source)
        except lark.exceptions.LarkError:
            continue
        assert reference.parse(source) == expected, source
    assert reference.parse("object.?spec[?'a']") is not None and reference.parse("[?a, b,]") is not None
