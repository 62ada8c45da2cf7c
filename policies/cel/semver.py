"""Kubernetes' semver library of CEL at version 1 (k8s.io/apiserver@v0.36.3
pkg/cel/library/semverlib.go) on a port of github.com/blang/semver/v4 Parse and Compare, with
the library's normalisation (``semver('v1.2', true)``)."""
from __future__ import annotations

from typing import Any

from .functions import Overload, overload, register_type
from .strings import go_quote
from .values import UINT64_MAX, CelType, Err, no_such_overload

LIBRARY = "kubernetes.semver"
SEMVER_TYPE = CelType("kubernetes.Semver")
_NUMBERS = frozenset("0123456789")
_ALPHANUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789")


class SemverError(ValueError):
    pass


class Semver:
    __slots__ = ("major", "minor", "patch", "pre")
    cel_type = SEMVER_TYPE

    def __init__(self, major: int, minor: int, patch: int, pre: tuple):
        self.major, self.minor, self.patch, self.pre = major, minor, patch, pre

    def compare(self, other: "Semver") -> int:
        for a, b in ((self.major, other.major), (self.minor, other.minor), (self.patch, other.patch)):
            if a != b:
                return 1 if a > b else -1
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)
        for a, b in zip(self.pre, other.pre):
            if a != b:
                if isinstance(a, int) != isinstance(b, int):
                    return -1 if isinstance(a, int) else 1
                return 1 if a > b else -1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def cel_equals(self, other: Any) -> Any:
        return self.compare(other) == 0 if type(other) is Semver else no_such_overload(other)


register_type(SEMVER_TYPE.name, Semver)


def _number(text: str, what: str) -> int:
    if not set(text) <= _NUMBERS:
        raise SemverError(f"Invalid character(s) found in {what} number {go_quote(text)}")
    if len(text) > 1 and text[0] == "0":
        raise SemverError(f"{what.capitalize()} number must not contain leading zeroes {go_quote(text)}")
    if not text or int(text) > UINT64_MAX:
        raise SemverError(f'strconv.ParseUint: parsing {go_quote(text)}: '
                          f'{"invalid syntax" if not text else "value out of range"}')
    return int(text)


def parse(text: str) -> Semver:
    """blang/semver's Parse (build metadata checked, then dropped: it does not order)."""
    if not text:
        raise SemverError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise SemverError("No Major.Minor.Patch elements found")
    major, minor = _number(parts[0], "major"), _number(parts[1], "minor")
    patch_text, build, prerelease = parts[2], None, None
    if "+" in patch_text:
        patch_text, _, rest = patch_text.partition("+")
        build = rest.split(".")
    if "-" in patch_text:
        patch_text, _, rest = patch_text.partition("-")
        prerelease = rest.split(".")
    patch = _number(patch_text, "patch")
    pre: list = []
    for item in prerelease or ():
        if not item:
            raise SemverError("Prerelease is empty")
        if set(item) <= _NUMBERS:
            if len(item) > 1 and item[0] == "0":
                raise SemverError(f"Numeric PreRelease version must not contain leading zeroes {go_quote(item)}")
            pre.append(int(item))
        elif set(item) <= _ALPHANUM:
            pre.append(item)
        else:
            raise SemverError(f"Invalid character(s) found in prerelease {go_quote(item)}")
    for item in build or ():
        if not item:
            raise SemverError("Build meta data is empty")
        if not set(item) <= _ALPHANUM:
            raise SemverError(f"Invalid character(s) found in build meta data {go_quote(item)}")
    return Semver(major, minor, patch, tuple(pre))


def _normalized(text: str) -> Semver:
    """normalizeAndParse: a leading v dropped, leading zeroes trimmed, missing parts set to 0."""
    if text.startswith("v"):
        text = text[1:]
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            part = part.lstrip("0")
            if not part or part[0] not in _NUMBERS:
                part = "0" + part
            parts[i] = part
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise SemverError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return parse(".".join(parts))


def _to_semver(text: str, normalize: bool = False) -> Any:
    try:
        return _normalized(text) if normalize else parse(text)
    except SemverError as exc:
        return Err(str(exc))


def _is_semver(text: str, normalize: bool = False) -> bool:
    return type(_to_semver(text, normalize)) is Semver


_S = "kubernetes.Semver"
OVERLOADS: list[Overload] = [
    overload("isSemver", "is_semver_string", "string", "bool", _is_semver, library=LIBRARY),
    overload("isSemver", "is_semver_string_bool", "string, bool", "bool", _is_semver, library=LIBRARY,
             example=("isSemver('v1.0', true)", "true"), doc="normalised"),
    overload("semver", "string_to_semver", "string", _S, _to_semver, library=LIBRARY, example=("semver('1.2.3').minor()", "2")),
    overload("semver", "string_bool_to_semver", "string, bool", _S, _to_semver, library=LIBRARY),
    overload("major", "semver_major", _S, "int", lambda v: v.major, member=True, library=LIBRARY),
    overload("minor", "semver_minor", _S, "int", lambda v: v.minor, member=True, library=LIBRARY),
    overload("patch", "semver_patch", _S, "int", lambda v: v.patch, member=True, library=LIBRARY),
    overload("isGreaterThan", "semver_is_greater_than", f"{_S}, {_S}", "bool", lambda a, b: a.compare(b) == 1,
             member=True, library=LIBRARY, example=("semver('1.10.0').isGreaterThan(semver('1.9.0'))", "true")),
    overload("isLessThan", "semver_is_less_than", f"{_S}, {_S}", "bool", lambda a, b: a.compare(b) == -1,
             member=True, library=LIBRARY),
    overload("compareTo", "semver_compare_to", f"{_S}, {_S}", "int", lambda a, b: a.compare(b), member=True,
             library=LIBRARY),
]
