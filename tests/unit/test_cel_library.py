"""The function registry (policies/cel/library.py) against cel-go's own environment (the unit
oracle, tests/support/celgo: kube-apiserver v1.36's): the same functions, each with the same
overloads (id, receiver or not, argument and result types), and nothing cel-go's lacks."""
from __future__ import annotations

import re

import pytest

from trainjob_admission.policies.cel.library import MACROS, REGISTRY
from tests.support import celgo, upstream

# cel-go's macro helpers and its deprecated spellings of `in`: no expression can name them
INTERNAL = re.compile(r"^(@|__|cel\.@|_in_$|in$)")


@pytest.fixture(scope="module")
def declared() -> list[tuple]:
    try:
        return celgo.functions()
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))


def normal(text: str) -> str:
    return text.replace("<", "").replace(">", "")


def test_every_overload_is_cel_gos(declared) -> None:
    theirs = {(name, oid, member, tuple(normal(a) for a in args), normal(result))
              for name, oid, member, args, result in declared if name != "macro" and not INTERNAL.match(name)}
    ours = {(o.name, o.id, o.member, o.args, o.result) for o in REGISTRY.overloads() if not INTERNAL.match(o.name)}
    assert ours - theirs == set() and theirs - ours == set(), (sorted(ours - theirs), sorted(theirs - ours))


def test_the_macros_are_cel_gos(declared) -> None:
    theirs = {(name, int(args[0])) for kind, name, _, args, _ in declared if kind == "macro"}
    ours = {(name, count) for name, counts in MACROS.items() for count in counts}
    assert ours == theirs
