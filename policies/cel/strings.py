"""String functions: cel-go's strings extension at version 2, as kube-apiserver v1.36 enables it
(github.com/google/cel-go@v0.26.0 ext/strings.go and ext/formatting.go, the format of versions 1-3
with its en_US locale), and Kubernetes' regex library (k8s.io/apiserver@v0.36.3
pkg/cel/library/regex.go: find, findAll). Offsets count Unicode code points, as cel-go's runes.
"""
from __future__ import annotations

import math
from typing import Any, Optional as Maybe

from .functions import Overload, overload
from .stdlib import compile_regex
from .values import (
    CelType, Duration, Err, Timestamp, UInt, format_double, to_string, type_name,
)

EXT, REGEX = "ext.strings", "kubernetes.regex"
MAX_RESULT_CHARS = 1 << 20  # the longest string replace(), join() or format() may build
# unicode.IsSpace, which strings.TrimSpace uses (Python's str.strip() also strips U+001C-U+001F)
_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
         "\u2028\u2029\u202f\u205f\u3000"
_LOWER = str.maketrans({chr(c): chr(c + 32) for c in range(ord("A"), ord("Z") + 1)})
_UPPER = str.maketrans({chr(c): chr(c - 32) for c in range(ord("a"), ord("z") + 1)})


def _out_of_range(index: int) -> Err:
    return Err(f"index out of range: {index}")


def _char_at(text: str, index: int) -> Any:
    if index < 0 or index > len(text):
        return _out_of_range(index)
    return text[index] if index < len(text) else ""


def _offset_answer(text: str, sub: str, offset: int) -> Any:
    """What indexOf and lastIndexOf answer before searching (ext/strings.go): the offset itself for
    an empty search, an error below 0, -1 at or past the end; None: search."""
    if sub == "":
        return offset
    if offset < 0:
        return _out_of_range(offset)
    if offset >= len(text):
        return -1
    return None


def _index_of(text: str, sub: str, offset: int = 0) -> Any:
    early = _offset_answer(text, sub, offset)
    return early if early is not None else text.find(sub, offset)


def _last_index_of(text: str, sub: str, offset: Maybe[int] = None) -> Any:
    if offset is None:
        if sub == "":
            return len(text)
        if len(text.encode()) < len(sub.encode()):
            return -1
        offset = len(text) - 1
    early = _offset_answer(text, sub, offset)
    if early is not None:
        return early
    start = min(offset, len(text) - len(sub))
    if start < 0:
        return -1
    return text.rfind(sub, 0, start + len(sub))


def _bounded(length: int, what: str) -> Maybe[Err]:
    if length > MAX_RESULT_CHARS:
        return Err(f"{what} would build a string of {length} characters, more than {MAX_RESULT_CHARS}")
    return None


def _replace(text: str, old: str, new: str, count: int = -1) -> Any:
    """strings.Replace: at most ``count`` replacements (all when negative); refused before it
    builds a string longer than MAX_RESULT_CHARS (one call could square its input's length)."""
    found = len(text) + 1 if old == "" else text.count(old)
    if count >= 0:
        found = min(found, count)
    too_long = _bounded(len(text) + found * (len(new) - len(old)), "replace()")
    return too_long or text.replace(old, new, count)


def _split(text: str, separator: str, limit: int = -1) -> Any:
    """strings.Split / SplitN (an empty separator splits into characters)."""
    if limit == 0:
        return []
    if separator == "":
        chars = list(text)
        if 0 < limit < len(chars):
            return chars[:limit - 1] + ["".join(chars[limit - 1:])]
        return chars
    return text.split(separator, limit - 1 if limit > 0 else -1)


def _substring(text: str, start: int, end: Maybe[int] = None) -> Any:
    if end is None:
        if start < 0 or start > len(text):
            return _out_of_range(start)
        return text[start:]
    if start > end:
        return Err(f"invalid substring range. start: {start}, end: {end}")
    if start < 0 or start > len(text):
        return _out_of_range(start)
    if end < 0 or end > len(text):
        return _out_of_range(end)
    return text[start:end]


def _join(values: list, separator: str = "") -> Any:
    for value in values:
        if type(value) is not str:
            return Err(f"join: invalid input: {_go_value(value)}")
    too_long = _bounded(sum(map(len, values)) + len(separator) * max(len(values) - 1, 0), "join()")
    return too_long or separator.join(values)


def _go_value(value: Any) -> str:
    """A value as Go's %v prints a CEL value in an error (close enough for messages)."""
    text = to_string(value)
    return text if type(text) is str else type_name(value)


_QUOTED = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v", "\\": "\\\\",
           '"': '\\"'}


def quote(text: str) -> str:
    """strings.quote: double quotes, CEL's escapes written out."""
    return '"' + "".join(_QUOTED.get(c, c) for c in text) + '"'


# --- string.format (ext/formatting.go, the version-1 formatter with the en_US locale) -------------

class FormatError(ValueError):
    pass


def format_string(template: str, args: list) -> Any:
    try:
        text = _interpolate(template, _RuntimeArgs(args))
    except FormatError as exc:
        return Err(str(exc))
    return _bounded(len(text), "format()") or text


class _RuntimeArgs:
    def __init__(self, values: list):
        self.values = values

    def arg(self, index: int) -> Any:
        if index >= len(self.values):
            raise FormatError(f"index {index} out of range")
        return self.values[index]

    def size(self) -> int:
        return len(self.values)


def _interpolate(template: str, args: Any, checker: Any = None) -> str:
    """parseFormatString: ``%%`` is a percent sign, ``%[.precision]verb`` formats the next argument."""
    out, i, index = [], 0, 0
    while i < len(template):
        if template[i] != "%":
            out.append(template[i])
            i += 1
            continue
        if i + 1 < len(template) and template[i + 1] == "%":
            out.append("%")
            i += 2
            continue
        value = args.arg(index)
        if i + 1 >= len(template):
            raise FormatError("unexpected end of string")
        if index >= args.size():
            raise FormatError(f"index {index} out of range")
        read, verb, precision = _clause(template[i + 1:])
        try:
            out.append((checker or _format_value)(verb, precision, value))
        except FormatError as exc:
            raise FormatError(f"error during formatting: {exc}") from None
        i += 1 + read
        index += 1
    return "".join(out)


def _clause(text: str) -> tuple[int, str, Maybe[int]]:
    i, precision = 0, None
    if text[0] == ".":
        i = 1
        while True:
            if i >= len(text):
                raise FormatError("could not parse formatting clause: error while parsing precision: could not "
                                  "find end of precision specifier")
            if not ("0" <= text[i] <= "9"):
                break
            i += 1
        digits = text[1:i]
        if not digits:
            raise FormatError('could not parse formatting clause: error while parsing precision: error while '
                              'converting precision to integer: strconv.Atoi: parsing "": invalid syntax')
        precision = int(digits)
    verb = text[i]
    if verb not in "sdfebxXo":
        raise FormatError(f'could not parse formatting clause: unrecognized formatting clause "{verb}"')
    return i + 1, verb, precision


_CLAUSE_ERRORS = {
    "s": "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, "
         "and timestamps, was given {}",
    "d": "decimal clause can only be used on integers, was given {}",
    "f": "fixed-point clause can only be used on doubles, was given {}",
    "e": "scientific clause can only be used on doubles, was given {}",
    "b": "only integers and bools can be formatted as binary, was given {}",
    "x": "only integers, byte buffers, and strings can be formatted as hex, was given {}",
    "o": "octal clause can only be used on integers, was given {}",
}
_SPECIAL_DOUBLES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _format_value(verb: str, precision: Maybe[int], value: Any) -> str:
    kind = type(value)
    wrong = FormatError(_CLAUSE_ERRORS[verb.lower()].format(type_name(value)))
    if verb == "s":
        return _format_string(value)
    if verb == "d":
        if kind is int or kind is UInt:
            return str(int(value))
        raise wrong
    if verb in "fe":
        if kind is str and value in _SPECIAL_DOUBLES:
            value, kind = _SPECIAL_DOUBLES[value], float
        if kind is not float:
            raise wrong
        if verb == "e":  # cel-go builds "%<precision>e": a width, not a precision, so always 6 digits
            return _scientific(value, 6)
        return _fixed(value, 6 if precision is None else precision)
    if verb == "b":
        if kind is bool:
            return "1" if value else "0"
        if kind is int or kind is UInt:
            return format(int(value), "b")
        raise wrong
    if verb in "xX":
        if kind is str:
            data = value.encode()
        elif kind is bytes:
            data = value
        elif kind is int or kind is UInt:
            text = format(int(value), "x")
            return text.upper() if verb == "X" else text
        else:
            raise wrong
        return data.hex().upper() if verb == "X" else data.hex()
    if kind is int or kind is UInt:
        return format(int(value), "o")
    raise wrong


def _format_string(value: Any) -> str:
    """FormatString: the string() of a value, lists and maps written out (maps sorted by key)."""
    kind = type(value)
    if kind is list:
        return "[" + ", ".join(_member(v) for v in value) + "]"
    if kind is dict or isinstance(value, dict):
        pairs = []
        for key, item in value.items():
            if type(key) not in (str, bool, int, UInt):
                raise FormatError(f"no formatting function for map key of type {type_name(key)}")
            pairs.append((_quoted(key, _format_string(key)), _member(item)))
        pairs.sort(key=lambda pair: pair[0].encode())
        return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"
    if value is None:
        return "null"
    if kind is CelType:
        return value.name
    if kind in (int, UInt, float, bool, str, bytes, Timestamp, Duration):
        text = to_string(value)
        if type(text) is Err:
            raise FormatError(text.message)
        return text
    raise FormatError(_CLAUSE_ERRORS["s"].format(type_name(value)))


def _member(value: Any) -> str:
    """A list element or map value inside %s: clauseForType, then quoted as CEL literals are."""
    kind = type(value)
    if kind is float:
        text = _fixed_plain(value, 6)
    elif kind is Timestamp or kind is Duration:
        name = "timestamp" if kind is Timestamp else "duration"
        return f'{name}("{to_string(value)}")'
    elif kind is CelType:  # clauseForType lists the type type with the strings first: no type(...) around it
        return value.name
    elif kind in (int, UInt):
        text = str(int(value))
    elif kind in (str, bytes, bool, list, dict) or value is None or isinstance(value, (list, dict)):
        text = _format_string(value)
    else:
        raise FormatError(f"no formatting function for {type_name(value)}")
    return _quoted(value, text)


def _quoted(value: Any, text: str) -> str:
    kind = type(value)
    if kind is str:
        return go_quote(text)
    if kind is bytes:
        return "b" + go_quote(text)
    if kind is float and (math.isinf(value) or math.isnan(value)):
        return go_quote(text)
    return text


def go_quote(text: str) -> str:
    """Go's %q of a string: double-quoted with Go escapes, printable Unicode kept."""
    out = ['"']
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c in "\a\b\f\n\r\t\v":
            out.append(_QUOTED[c])
        elif c.isprintable() or c == " ":
            out.append(c)
        elif ord(c) < 0x10000:
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    out.append('"')
    return "".join(out)


def _fixed_plain(value: float, digits: int) -> str:
    """Go's %.Nf (no locale): used for doubles inside lists and maps."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.{digits}f}"


def _fixed(value: float, digits: int) -> str:
    """%f through golang.org/x/text's en_US printer: thousands grouped, ∞ for infinity."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    text = f"{value:,.{digits}f}"
    return text


_SUPERSCRIPT = str.maketrans("0123456789-+", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺")


def _scientific(value: float, digits: int) -> str:
    """%e through the en_US printer: ``2.718280×10⁰⁰``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    mantissa, _, exponent = f"{value:.{digits}e}".partition("e")
    power = int(exponent)
    sign = "⁻" if power < 0 else ""
    return f"{mantissa}×10{sign}{format(abs(power), '02d').translate(_SUPERSCRIPT)}"


def check_format(template: str, kinds: list[Maybe[str]]) -> Maybe[str]:
    """cel-go's compile-time check of ``'<constant>'.format([literal list])``: the clauses against
    the elements' types (None where not known until run time), and no unused argument. The
    problem as cel-go words it, or None."""
    class Static:
        def arg(self, index: int) -> Any:
            if index >= len(kinds):
                raise FormatError(f"index {index} out of range")
            self.current = index
            self.requested = getattr(self, "requested", 0) + 1
            return index

        def size(self) -> int:
            return len(kinds)

    static = Static()

    def verify(verb: str, precision: Maybe[int], index: int) -> str:
        kind = kinds[index]
        allowed = {"s": None, "d": ("int", "uint"), "f": ("double", "string"), "e": ("double", "string"),
                   "b": ("int", "uint", "bool"), "x": ("int", "uint", "string", "bytes"), "X": ("int", "uint", "string", "bytes"),
                   "o": ("int", "uint")}[verb]
        if kind is None:
            return ""
        if allowed is None:
            if kind not in ("list", "map", "int", "uint", "double", "bool", "string", "google.protobuf.Timestamp",
                            "bytes", "google.protobuf.Duration", "type", "null_type"):
                raise FormatError(_CLAUSE_ERRORS["s"].format(kind))
        elif kind not in allowed:
            raise FormatError(_CLAUSE_ERRORS[verb.lower()].format(kind))
        return ""

    try:
        _interpolate(template, static, verify)
    except FormatError as exc:
        return str(exc)
    requested = getattr(static, "requested", 0)
    if len(kinds) > requested:
        return f"too many arguments supplied to string.format (expected {requested}, got {len(kinds)})"
    return None


# --- Kubernetes' regex library --------------------------------------------------------------------

def _find(text: str, pattern: str) -> Any:
    try:
        match = compile_regex(pattern).search(text)
    except ValueError as exc:
        return Err(f"Illegal regex: {exc}")
    return match.group(0) if match else ""


def _find_all(text: str, pattern: str, limit: int = -1) -> Any:
    try:
        compiled = compile_regex(pattern)
    except ValueError as exc:
        return Err(f"Illegal regex: {exc}")
    if limit == 0:
        return []
    found = []
    for match in compiled.finditer(text):
        found.append(match.group(0))
        if 0 < limit <= len(found):
            break
    return found


OVERLOADS: list[Overload] = [
    overload("charAt", "string_char_at_int", "string, int", "string", _char_at, member=True, library=EXT,
             example=("'hello'.charAt(4)", "'o'")),
    overload("indexOf", "string_index_of_string", "string, string", "int", _index_of, member=True, library=EXT,
             example=("'hello mellow'.indexOf('ello')", "1")),
    overload("indexOf", "string_index_of_string_int", "string, string, int", "int", _index_of, member=True,
             library=EXT, example=("'hello mellow'.indexOf('ello', 2)", "7")),
    overload("lastIndexOf", "string_last_index_of_string", "string, string", "int", _last_index_of, member=True,
             library=EXT),
    overload("lastIndexOf", "string_last_index_of_string_int", "string, string, int", "int", _last_index_of,
             member=True, library=EXT),
    overload("lowerAscii", "string_lower_ascii", "string", "string", lambda s: s.translate(_LOWER), member=True,
             library=EXT, example=("'ÄB'.lowerAscii()", "'Äb'"), doc="ASCII letters only"),
    overload("replace", "string_replace_string_string", "string, string, string", "string", _replace, member=True,
             library=EXT, example=("'a-b-c'.replace('-', '+')", "'a+b+c'")),
    overload("replace", "string_replace_string_string_int", "string, string, string, int", "string", _replace,
             member=True, library=EXT, example=("'a-b-c'.replace('-', '+', 1)", "'a+b-c'")),
    overload("split", "string_split_string", "string, string", "list(string)", _split, member=True, library=EXT),
    overload("split", "string_split_string_int", "string, string, int", "list(string)", _split, member=True,
             library=EXT, example=("'a,b,c'.split(',', 2)", "['a', 'b,c']")),
    overload("substring", "string_substring_int", "string, int", "string", _substring, member=True, library=EXT),
    overload("substring", "string_substring_int_int", "string, int, int", "string", _substring, member=True,
             library=EXT, example=("'tacocat'.substring(0, 4)", "'taco'")),
    overload("trim", "string_trim", "string", "string", lambda s: s.strip(_SPACE), member=True, library=EXT),
    overload("upperAscii", "string_upper_ascii", "string", "string", lambda s: s.translate(_UPPER), member=True,
             library=EXT),
    overload("format", "string_format", "string, list(dyn)", "string", format_string, member=True, library=EXT,
             example=("'%s has %d GPUs'.format(['llm', 4])", "'llm has 4 GPUs'")),
    overload("strings.quote", "strings_quote", "string", "string", quote, library=EXT,
             example=("strings.quote('a\"b')", "'\"a\\\\\"b\"'")),
    overload("join", "list_join", "list(string)", "string", _join, member=True, library=EXT),
    overload("join", "list_join_string", "list(string), string", "string", _join, member=True, library=EXT,
             example=("['a', 'b'].join('-')", "'a-b'")),
    overload("find", "string_find_string", "string, string", "string", _find, member=True, library=REGEX,
             example=("'quay.io/a'.find('[a-z]+[.]io')", "'quay.io'"), doc="first match, or `''` (RE2 syntax, like `matches()`)"),
    overload("findAll", "string_find_all_string", "string, string", "list(string)", _find_all, member=True,
             library=REGEX),
    overload("findAll", "string_find_all_string_int", "string, string, int", "list(string)", _find_all, member=True,
             library=REGEX, example=("'a1b22c333'.findAll('[0-9]+', 2)", "['1', '22']")),
]
__all__ = ["OVERLOADS", "check_format", "quote", "format_double"]
