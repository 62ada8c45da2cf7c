"""Every function of the CEL environment ValidatingAdmissionPolicy validations have at Kubernetes
v1.36 (k8s.io/apiserver/pkg/cel/environment/base.go), by name, with its overloads as the type
checker (policies/cel/checker.py) resolves them: cel-go v0.26's standard library, optional types,
ext.Strings v2, ext.Sets, ext.Lists v3 and the Kubernetes libraries (URLs, regex, lists, authz,
quantity, IP, CIDR, format, semver). Overload ids are upstream's, so
tests/unit/test_cel_checker.py can compare this table with the Go module cache.

A line is ``name(ARGS) -> RESULT  ID`` for a global function and ``RECEIVER:name(ARGS) -> RESULT
ID`` for a member function; single capital letters are type parameters.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .types import _NAMED, Type, parse_type, struct

# Kubernetes' object and opaque types (k8s.io/apiserver/pkg/cel/*.go, library/authz.go)
LIBRARY_TYPES: dict[str, Type] = {
    "Quantity": struct("kubernetes.Quantity"), "URL": struct("kubernetes.URL"), "Semver": struct("kubernetes.Semver"),
    "Format": struct("kubernetes.NamedFormat"), "IP": Type("opaque", "net.IP"), "CIDR": Type("opaque", "net.CIDR"),
    "Authorizer": struct("kubernetes.authorization.Authorizer"),
    "PathCheck": struct("kubernetes.authorization.PathCheck"),
    "GroupCheck": struct("kubernetes.authorization.GroupCheck"),
    "ResourceCheck": struct("kubernetes.authorization.ResourceCheck"),
    "Decision": struct("kubernetes.authorization.Decision"),
}

_RELATIONS = {"_<_": "less", "_<=_": "less_equals", "_>_": "greater", "_>=_": "greater_equals"}
_ORDERED = [("bool", "bool", "bool"), ("int", "int", "int64"), ("int", "double", "int64_double"),
            ("int", "uint", "int64_uint64"), ("uint", "uint", "uint64"), ("uint", "double", "uint64_double"),
            ("uint", "int", "uint64_int64"), ("double", "double", "double"), ("double", "int", "double_int64"),
            ("double", "uint", "double_uint64"), ("string", "string", "string"), ("bytes", "bytes", "bytes"),
            ("timestamp", "timestamp", "timestamp"), ("duration", "duration", "duration")]
_TIME_PARTS = {"getFullYear": "year", "getMonth": "month", "getDayOfYear": "day_of_year",
               "getDayOfMonth": "day_of_month", "getDate": "day_of_month_1_based", "getDayOfWeek": "day_of_week",
               "getHours": "hours", "getMinutes": "minutes", "getSeconds": "seconds",
               "getMilliseconds": "milliseconds"}
_DURATION_PARTS = ("getHours", "getMinutes", "getSeconds", "getMilliseconds")
# the element types ext.Lists sorts and Kubernetes' lists library compares and sums
_COMPARABLE = ("int", "uint", "double", "bool", "duration", "timestamp", "string", "bytes")
_SUMMABLE = ("int", "uint", "double", "duration")

STANDARD = """
_?_:_(bool, A, A) -> A  conditional
_&&_(bool, bool) -> bool  logical_and
_||_(bool, bool) -> bool  logical_or
!_(bool) -> bool  logical_not
@not_strictly_false(bool) -> bool  not_strictly_false
_==_(A, A) -> bool  equals
_!=_(A, A) -> bool  not_equals
_+_(bytes, bytes) -> bytes  add_bytes
_+_(double, double) -> double  add_double
_+_(duration, duration) -> duration  add_duration_duration
_+_(duration, timestamp) -> timestamp  add_duration_timestamp
_+_(timestamp, duration) -> timestamp  add_timestamp_duration
_+_(int, int) -> int  add_int64
_+_(list(A), list(A)) -> list(A)  add_list
_+_(string, string) -> string  add_string
_+_(uint, uint) -> uint  add_uint64
_/_(double, double) -> double  divide_double
_/_(int, int) -> int  divide_int64
_/_(uint, uint) -> uint  divide_uint64
_%_(int, int) -> int  modulo_int64
_%_(uint, uint) -> uint  modulo_uint64
_*_(double, double) -> double  multiply_double
_*_(int, int) -> int  multiply_int64
_*_(uint, uint) -> uint  multiply_uint64
-_(double) -> double  negate_double
-_(int) -> int  negate_int64
_-_(double, double) -> double  subtract_double
_-_(duration, duration) -> duration  subtract_duration_duration
_-_(int, int) -> int  subtract_int64
_-_(timestamp, duration) -> timestamp  subtract_timestamp_duration
_-_(timestamp, timestamp) -> duration  subtract_timestamp_timestamp
_-_(uint, uint) -> uint  subtract_uint64
_[_](list(A), int) -> A  index_list
_[_](map(A, B), A) -> B  index_map
@in(A, list(A)) -> bool  in_list
@in(A, map(A, B)) -> bool  in_map
size(bytes) -> int  size_bytes
bytes:size() -> int  bytes_size
size(list(A)) -> int  size_list
list(A):size() -> int  list_size
size(map(A, B)) -> int  size_map
map(A, B):size() -> int  map_size
size(string) -> int  size_string
string:size() -> int  string_size
type(A) -> type(A)  type
bool(bool) -> bool  bool_to_bool
bool(string) -> bool  string_to_bool
bytes(bytes) -> bytes  bytes_to_bytes
bytes(string) -> bytes  string_to_bytes
double(double) -> double  double_to_double
double(int) -> double  int64_to_double
double(string) -> double  string_to_double
double(uint) -> double  uint64_to_double
duration(duration) -> duration  duration_to_duration
duration(int) -> duration  int64_to_duration
duration(string) -> duration  string_to_duration
dyn(A) -> dyn  to_dyn
int(int) -> int  int64_to_int64
int(double) -> int  double_to_int64
int(duration) -> int  duration_to_int64
int(string) -> int  string_to_int64
int(timestamp) -> int  timestamp_to_int64
int(uint) -> int  uint64_to_int64
string(string) -> string  string_to_string
string(bool) -> string  bool_to_string
string(bytes) -> string  bytes_to_string
string(double) -> string  double_to_string
string(duration) -> string  duration_to_string
string(int) -> string  int64_to_string
string(timestamp) -> string  timestamp_to_string
string(uint) -> string  uint64_to_string
timestamp(timestamp) -> timestamp  timestamp_to_timestamp
timestamp(int) -> timestamp  int64_to_timestamp
timestamp(string) -> timestamp  string_to_timestamp
uint(uint) -> uint  uint64_to_uint64
uint(double) -> uint  double_to_uint64
uint(int) -> uint  int64_to_uint64
uint(string) -> uint  string_to_uint64
string:contains(string) -> bool  contains_string
string:endsWith(string) -> bool  ends_with_string
string:startsWith(string) -> bool  starts_with_string
matches(string, string) -> bool  matches
string:matches(string) -> bool  matches_string
"""

OPTIONAL = """
optional.of(V) -> optional(V)  optional_of
optional.ofNonZeroValue(V) -> optional(V)  optional_ofNonZeroValue
optional.none() -> optional(V)  optional_none
optional(V):value() -> V  optional_value
optional(V):hasValue() -> bool  optional_hasValue
optional(V):or(optional(V)) -> optional(V)  optional_or_optional
optional(V):orValue(V) -> V  optional_orValue_value
_?._(dyn, string) -> optional(V)  select_optional_field
_[?_](list(V), int) -> optional(V)  list_optindex_optional_int
_[?_](optional(list(V)), int) -> optional(V)  optional_list_optindex_optional_int
_[?_](map(K, V), K) -> optional(V)  map_optindex_optional_value
_[?_](optional(map(K, V)), K) -> optional(V)  optional_map_optindex_optional_value
_[_](optional(list(V)), int) -> optional(V)  optional_list_index_int
_[_](optional(map(K, V)), K) -> optional(V)  optional_map_index_value
list(V):last() -> optional(V)  list_last
list(V):first() -> optional(V)  list_first
optional.unwrap(list(optional(V))) -> list(V)  optional_unwrap
list(optional(V)):unwrapOpt() -> list(V)  optional_unwrapOpt
"""

STRINGS_EXT = """
string:charAt(int) -> string  string_char_at_int
string:indexOf(string) -> int  string_index_of_string
string:indexOf(string, int) -> int  string_index_of_string_int
string:lastIndexOf(string) -> int  string_last_index_of_string
string:lastIndexOf(string, int) -> int  string_last_index_of_string_int
string:lowerAscii() -> string  string_lower_ascii
string:replace(string, string) -> string  string_replace_string_string
string:replace(string, string, int) -> string  string_replace_string_string_int
string:split(string) -> list(string)  string_split_string
string:split(string, int) -> list(string)  string_split_string_int
string:substring(int) -> string  string_substring_int
string:substring(int, int) -> string  string_substring_int_int
string:trim() -> string  string_trim
string:upperAscii() -> string  string_upper_ascii
string:format(list(dyn)) -> string  string_format
strings.quote(string) -> string  strings_quote
list(string):join() -> string  list_join
list(string):join(string) -> string  list_join_string
"""

SETS = """
sets.contains(list(T), list(T)) -> bool  list_sets_contains_list
sets.equivalent(list(T), list(T)) -> bool  list_sets_equivalent_list
sets.intersects(list(T), list(T)) -> bool  list_sets_intersects_list
"""

LISTS_EXT = """
list(T):slice(int, int) -> list(T)  list_slice
list(list(T)):flatten() -> list(T)  list_flatten
list(dyn):flatten(int) -> list(dyn)  list_flatten_int
lists.range(int) -> list(int)  lists_range
list(T):reverse() -> list(T)  list_reverse
list(T):distinct() -> list(T)  list_distinct
"""

TWO_VARIABLE = """
cel.@mapInsert(map(K, V), K, V) -> map(K, V)  @mapInsert_map_key_value
cel.@mapInsert(map(K, V), map(K, V)) -> map(K, V)  @mapInsert_map_map
"""

KUBERNETES = """
url(string) -> URL  string_to_url
URL:getScheme() -> string  url_get_scheme
URL:getHost() -> string  url_get_host
URL:getHostname() -> string  url_get_hostname
URL:getPort() -> string  url_get_port
URL:getEscapedPath() -> string  url_get_escaped_path
URL:getQuery() -> map(string, list(string))  url_get_query
isURL(string) -> bool  is_url_string
string:find(string) -> string  string_find_string
string:findAll(string) -> list(string)  string_find_all_string
string:findAll(string, int) -> list(string)  string_find_all_string_int
list(A):indexOf(A) -> int  list_a_index_of_int
list(A):lastIndexOf(A) -> int  list_a_last_index_of_int
Authorizer:path(string) -> PathCheck  authorizer_path
Authorizer:group(string) -> GroupCheck  authorizer_group
Authorizer:serviceAccount(string, string) -> Authorizer  authorizer_serviceaccount
GroupCheck:resource(string) -> ResourceCheck  groupcheck_resource
ResourceCheck:subresource(string) -> ResourceCheck  resourcecheck_subresource
ResourceCheck:namespace(string) -> ResourceCheck  resourcecheck_namespace
ResourceCheck:name(string) -> ResourceCheck  resourcecheck_name
PathCheck:check(string) -> Decision  pathcheck_check
ResourceCheck:check(string) -> Decision  resourcecheck_check
Decision:errored() -> bool  decision_errored
Decision:error() -> string  decision_error
Decision:allowed() -> bool  decision_allowed
Decision:reason() -> string  decision_reason
ResourceCheck:fieldSelector(string) -> ResourceCheck  authorizer_fieldselector
ResourceCheck:labelSelector(string) -> ResourceCheck  authorizer_labelselector
quantity(string) -> Quantity  string_to_quantity
isQuantity(string) -> bool  is_quantity_string
sign(Quantity) -> int  quantity_sign
Quantity:isGreaterThan(Quantity) -> bool  quantity_is_greater_than
Quantity:isLessThan(Quantity) -> bool  quantity_is_less_than
Quantity:compareTo(Quantity) -> int  quantity_compare_to
Quantity:asApproximateFloat() -> double  quantity_get_float
Quantity:asInteger() -> int  quantity_get_int
Quantity:isInteger() -> bool  quantity_is_integer
Quantity:add(Quantity) -> Quantity  quantity_add
Quantity:add(int) -> Quantity  quantity_add_int
Quantity:sub(Quantity) -> Quantity  quantity_sub
Quantity:sub(int) -> Quantity  quantity_sub_int
ip(string) -> IP  string_to_ip
IP:family() -> int  ip_family
ip.isCanonical(string) -> bool  ip_is_canonical
IP:isUnspecified() -> bool  ip_is_unspecified
IP:isLoopback() -> bool  ip_is_loopback
IP:isLinkLocalMulticast() -> bool  ip_is_link_local_multicast
IP:isLinkLocalUnicast() -> bool  ip_is_link_local_unicast
IP:isGlobalUnicast() -> bool  ip_is_global_unicast
isIP(string) -> bool  is_ip
string(IP) -> string  ip_to_string
cidr(string) -> CIDR  string_to_cidr
CIDR:containsIP(string) -> bool  cidr_contains_ip_string
CIDR:containsIP(IP) -> bool  cidr_contains_ip_ip
CIDR:containsCIDR(string) -> bool  cidr_contains_cidr_string
CIDR:containsCIDR(CIDR) -> bool  cidr_contains_cidr
CIDR:ip() -> IP  cidr_ip
CIDR:prefixLength() -> int  cidr_prefix_length
CIDR:masked() -> CIDR  cidr_masked
isCIDR(string) -> bool  is_cidr
string(CIDR) -> string  cidr_to_string
Format:validate(string) -> optional(list(string))  format-validate
format.named(string) -> optional(Format)  format-named
semver(string) -> Semver  string_to_semver
semver(string, bool) -> Semver  string_bool_to_semver
isSemver(string) -> bool  is_semver_string
isSemver(string, bool) -> bool  is_semver_string_bool
Semver:isGreaterThan(Semver) -> bool  semver_is_greater_than
Semver:isLessThan(Semver) -> bool  semver_is_less_than
Semver:compareTo(Semver) -> int  semver_compare_to
Semver:major() -> int  semver_major
Semver:minor() -> int  semver_minor
Semver:patch() -> int  semver_patch
"""

# format.<name>() for every name of k8s.io/apiserver/pkg/cel/library/format.go ConstantFormats
FORMAT_NAMES = ("dns1123Label", "dns1123Subdomain", "dns1035Label", "qualifiedName", "dns1123LabelPrefix",
                "dns1123SubdomainPrefix", "dns1035LabelPrefix", "labelValue", "uri", "uuid", "byte", "date",
                "datetime")


@dataclass(frozen=True)
class Overload:
    id: str
    member: bool  # called as receiver.name(args): the receiver is args[0]
    args: tuple[Type, ...]
    result: Type
    params: frozenset[str] = frozenset()  # the names of the type parameters in its signature


def _type_params(t: Type) -> set[str]:
    return ({t.name} if t.kind == "param" else set()).union(*(_type_params(p) for p in t.params))


def _generated() -> list[str]:
    """The overloads upstream builds in loops: relations, timestamp accessors, sort, sum/min/max."""
    lines = []
    for op, prefix in _RELATIONS.items():
        lines += [f"{op}({a}, {b}) -> bool  {prefix}_{suffix}" for a, b, suffix in _ORDERED]
    for name, part in _TIME_PARTS.items():
        tz_id = "timestamp_to_seconds_tz" if part == "seconds" else f"timestamp_to_{part}_with_tz"
        lines += [f"timestamp:{name}() -> int  timestamp_to_{part}", f"timestamp:{name}(string) -> int  {tz_id}"]
        if name in _DURATION_PARTS:
            lines.append(f"duration:{name}() -> int  duration_to_{part}")
    long_names = {"duration": "google.protobuf.Duration", "timestamp": "google.protobuf.Timestamp"}
    for t in _COMPARABLE:
        lines.append(f"list({t}):sort() -> list({t})  list_{long_names.get(t, t)}_sort")
        lines.append(f"list(T):@sortByAssociatedKeys(list({t})) -> list(T)  list_{long_names.get(t, t)}_sortByAssociatedKeys")
        lines.append(f"list({t}):isSorted() -> bool  list_{t}_is_sorted_bool")
        lines.append(f"list({t}):max() -> {t}  list_{t}_max_{t}")
        lines.append(f"list({t}):min() -> {t}  list_{t}_min_{t}")
    lines += [f"list({t}):sum() -> {t}  list_{t}_sum_{t}" for t in _SUMMABLE]
    lines += [f"format.{name}() -> Format  format.{name}" for name in FORMAT_NAMES]
    return lines


def _parse(line: str) -> tuple[str, Overload]:
    signature, overload_id = line.rsplit("  ", 1)
    call, result = signature.split(" -> ")
    depth, start = 0, len(call) - 1
    for start in range(len(call) - 1, -1, -1):  # the argument list: the parenthesis that closes the call
        depth += {")": 1, "(": -1}.get(call[start], 0)
        if depth == 0:
            break
    head, args = call[:start], call[start + 1:-1]
    named = {**_NAMED, **LIBRARY_TYPES}
    receiver, _, name = ("", "", head) if head == "_?_:_" else head.rpartition(":")
    receiver = receiver or None
    types_ = [parse_type(a, named) for a in _split(args)] if args.strip() else []
    if receiver is not None:
        types_.insert(0, parse_type(receiver, named))
    returned = parse_type(result, named)
    params = frozenset().union(*(_type_params(t) for t in (*types_, returned)))
    return name, Overload(overload_id.strip(), receiver is not None, tuple(types_), returned, params)


def _split(text: str) -> list[str]:
    """Top-level comma-separated parts of an argument list."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        current += ch
    return parts + [current]


@lru_cache(maxsize=1)
def functions() -> dict[str, tuple[Overload, ...]]:
    """Every function by name, its overloads in declaration order."""
    table: dict[str, list[Overload]] = {}
    text = "\n".join([STANDARD, OPTIONAL, STRINGS_EXT, SETS, LISTS_EXT, TWO_VARIABLE, KUBERNETES, *_generated()])
    for line in text.splitlines():
        if line.strip():
            name, overload = _parse(line.strip())
            table.setdefault(name, []).append(overload)
    return {name: tuple(overloads) for name, overloads in table.items()}

