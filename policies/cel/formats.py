"""Kubernetes' format library of CEL (k8s.io/apiserver@v0.36.3 pkg/cel/library/format.go):
``format.dns1123Label().validate(s)`` and the other named formats, with the validators' own
messages (k8s.io/apimachinery pkg/util/validation and pkg/api/validate/content, kube-openapi's
strfmt for uuid, byte, date and datetime)."""
from __future__ import annotations

import re
from typing import Any, Callable

from .functions import Overload, overload, register_type
from .urls import UrlError, parse as parse_url
from .strings import go_quote
from .values import NONE, CelType, Optional, no_such_overload, parse_timestamp

LIBRARY = "kubernetes.format"
FORMAT_TYPE = CelType("kubernetes.NamedFormat")
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = _LABEL + "(\\." + _LABEL + ")*"
_DNS1035 = "[a-z]([-a-z0-9]*[a-z0-9])?"
_KEY = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_VALUE = "(" + _KEY + ")?"
_LABEL_MESSAGE = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                  "start and end with an alphanumeric character")
_SUBDOMAIN_MESSAGE = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                      "and must start and end with an alphanumeric character")
_DNS1035_MESSAGE = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                    "alphabetic character, and end with an alphanumeric character")
_KEY_MESSAGE = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
_VALUE_MESSAGE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
                  "must start and end with an alphanumeric character")


class NamedFormat:
    __slots__ = ("name", "validate")
    cel_type = FORMAT_TYPE

    def __init__(self, name: str, validate: Callable[[str], list[str]]):
        self.name, self.validate = name, validate

    def cel_equals(self, other: Any) -> Any:
        return self.name == other.name if type(other) is NamedFormat else no_such_overload(other)


register_type(FORMAT_TYPE.name, NamedFormat)


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    if not examples:
        return f"{message} (regex used for validation is '{pattern}')"
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def _size(value: str) -> int:
    return len(value.encode())


def _dns1123_label(value: str) -> list[str]:
    errors = []
    if _size(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _matches(_LABEL, value):
        if _matches(_SUBDOMAIN, value):
            errors.append("must not contain dots")
        else:
            errors.append(_regex_error(_LABEL_MESSAGE, _LABEL, "my-name", "123-abc"))
    return errors


def _bounded_pattern(value: str, limit: str, pattern: str, message: str, *examples: str) -> list[str]:
    """The usual validator: at most ``limit`` ("253 characters"), matching ``pattern``."""
    errors = []
    if _size(value) > int(limit.split()[0]):
        errors.append(f"must be no more than {limit}")
    if not _matches(pattern, value):
        errors.append(_regex_error(message, pattern, *examples))
    return errors


def _dns1123_subdomain(value: str, unit: str = "characters") -> list[str]:
    return _bounded_pattern(value, f"253 {unit}", _SUBDOMAIN, _SUBDOMAIN_MESSAGE, "example.com")


def _dns1035_label(value: str) -> list[str]:
    return _bounded_pattern(value, "63 characters", _DNS1035, _DNS1035_MESSAGE, "my-name", "abc-123")


def _masked(validate: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """A name prefix (generateName): a trailing dash is allowed (maskTrailingDash)."""
    def check(value: str) -> list[str]:
        if len(value.encode()) > 1 and value.endswith("-"):
            value = value[:-2] + "a"
        return validate(value)
    return check


def _qualified_name(value: str) -> list[str]:
    """content.IsLabelKey."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += ["prefix part " + m for m in _dns1123_subdomain(prefix, "bytes")]
    else:
        return [f"a valid label key {_regex_error(_KEY_MESSAGE, _KEY, 'MyName', 'my.name', '123-abc')} with an "
                "optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errors.append("name part must be non-empty")
    elif _size(name) > 63:
        errors.append("name part must be no more than 63 bytes")
    if not _matches(_KEY, name):
        errors.append("name part " + _regex_error(_KEY_MESSAGE, _KEY, "MyName", "my.name", "123-abc"))
    return errors


def _label_value(value: str) -> list[str]:
    return _bounded_pattern(value, "63 bytes", _VALUE, _VALUE_MESSAGE, "MyValue", "my_value", "12345")


def _uri(value: str) -> list[str]:
    try:
        parse_url(value, True)
    except UrlError as exc:
        return [f"parse {go_quote(value)}: {exc}"]
    return []


_UUID = re.compile(r"(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_TIME = re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))")


def _is_date(value: str) -> bool:
    """time.Parse("2006-01-02", value)."""
    return _DATE.fullmatch(value) is not None and type(parse_timestamp(value + "T00:00:00Z")) is not type(None)


def _is_datetime(value: str) -> bool:
    """strfmt.IsDateTime: a date, 't', a time matching DateTimePattern with hours <= 23."""
    if len(value) < 4:
        return False
    parts = value.lower().split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    match = _TIME.search(parts[1])
    if match is None or match.start() != 0 or match.end() != len(parts[1]):
        return False
    return match.group(1) <= "23" and match.group(2) <= "59" and match.group(3) <= "59"


def _check(test: Callable[[str], bool], message: str) -> Callable[[str], list[str]]:
    return lambda value: [] if test(value) else [message]


FORMATS = {
    "dns1123Label": NamedFormat("DNS1123Label", _dns1123_label),
    "dns1123Subdomain": NamedFormat("DNS1123Subdomain", _dns1123_subdomain),
    "dns1035Label": NamedFormat("DNS1035Label", _dns1035_label),
    "qualifiedName": NamedFormat("QualifiedName", _qualified_name),
    "dns1123LabelPrefix": NamedFormat("DNS1123LabelPrefix", _masked(_dns1123_label)),
    "dns1123SubdomainPrefix": NamedFormat("DNS1123SubdomainPrefix", _masked(_dns1123_subdomain)),
    "dns1035LabelPrefix": NamedFormat("DNS1035LabelPrefix", _masked(_dns1035_label)),
    "labelValue": NamedFormat("LabelValue", _label_value),
    "uri": NamedFormat("URI", _uri),
    "uuid": NamedFormat("uuid", _check(lambda v: _UUID.fullmatch(v) is not None, "does not match the UUID format")),
    "byte": NamedFormat("byte", _check(lambda v: _BASE64.fullmatch(v) is not None, "invalid base64")),
    "date": NamedFormat("date", _check(_is_date, "invalid date")),
    "datetime": NamedFormat("datetime", _check(_is_datetime, "invalid datetime")),
}


def _validate(named: NamedFormat, value: str) -> Optional:
    errors = named.validate(value)
    return Optional(errors) if errors else NONE


def _named(name: str) -> Optional:
    found = FORMATS.get(name)
    return NONE if found is None else Optional(found)


OVERLOADS: list[Overload] = [
    *(overload(f"format.{name}", f"format.{name}", "", "kubernetes.NamedFormat", (lambda f=fmt: f), library=LIBRARY)
      for name, fmt in sorted(FORMATS.items())),
    overload("validate", "format-validate", "kubernetes.NamedFormat, string", "optional_type(list(string))",
             _validate, member=True, library=LIBRARY,
             example=("format.dns1123Label().validate('my-name')", "optional.none()"), doc="no errors"),
    overload("format.named", "format-named", "string", "optional_type(kubernetes.NamedFormat)", _named,
             library=LIBRARY, example=("format.named('uuid').hasValue()", "true")),
]
