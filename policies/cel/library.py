"""Kubernetes' CEL environment as kube-apiserver v1.36 builds it for ValidatingAdmissionPolicy
(k8s.io/apiserver@v0.36.3 pkg/cel/environment/base.go): cel-go's standard library, Kubernetes'
URLs, regex, lists, authz (with selectors), quantity, IP, CIDR, format and semver (version 1)
libraries, and cel-go's strings (version 2), sets, optional types, two-variable comprehensions
and lists (version 3) extensions. Nothing else: base.go enables no math, encoders or bindings
extension, so ``math.greatest()`` or ``base64.encode()`` are unknown functions here as there.

:data:`REGISTRY` holds every overload in cel-go's order; :data:`FUNCTIONS` the functions an
expression may call by name (operators and cel-go's internal ``@`` helpers left out), which the
admin guide's table lists (tests/unit/test_docs.py) and tests/unit/test_cel_library.py compares
with cel-go's own declarations.
"""
from __future__ import annotations

from . import authz, lists, network, operators, optionals, quantity, semver, sets, stdlib, strings, urls, formats
from .functions import Overload, Registry

REGISTRY = Registry([*operators.OVERLOADS, *stdlib.OVERLOADS, *urls.OVERLOADS, *strings.OVERLOADS, *lists.OVERLOADS,
                     *authz.OVERLOADS, *quantity.OVERLOADS, *optionals.OVERLOADS, *sets.OVERLOADS,
                     *network.OVERLOADS, *formats.OVERLOADS, *semver.OVERLOADS])


def _callable(name: str) -> bool:
    return not name.startswith("@") and not (name.startswith("_") and name.endswith("_")) and name not in ("!_", "-_")


FUNCTIONS: dict[str, list[Overload]] = {name: overloads for name, overloads in REGISTRY.by_name.items()
                                        if _callable(name)}
# cel-go's macros (parser/macro.go, ext/comprehensions.go, ext/lists.go sortBy, optMap/optFlatMap),
# with the argument counts each takes; policies/cel/ast.py expands them.
MACROS: dict[str, tuple[int, ...]] = {
    "has": (1,), "all": (2, 3), "exists": (2, 3), "exists_one": (2, 3), "existsOne": (3,), "map": (2, 3),
    "filter": (2,), "transformList": (3, 4), "transformMap": (3, 4), "transformMapEntry": (3, 4), "sortBy": (2,),
    "optMap": (2,), "optFlatMap": (2,),
}


def signature(item: Overload) -> str:
    """An overload as the admin guide writes it: ``<string>.startsWith(string) -> bool``."""
    args = list(item.args)
    if item.member:
        receiver = args.pop(0)
        return f"<{receiver}>.{item.name}({', '.join(args)}) -> {item.result}"
    return f"{item.name}({', '.join(args)}) -> {item.result}"


def reference_rows() -> list[tuple[str, str, str, str]]:
    """The admin guide's "Kubernetes CEL functions" table: per function, its overloads, its
    library and an example (tests/unit/test_docs.py keeps the guide equal to this)."""
    rows = []
    for name, overloads in FUNCTIONS.items():
        libraries = sorted({o.library for o in overloads})
        notes = [f"`{o.example[0]}` is `{o.example[1]}`" for o in overloads if o.example]
        notes += [o.doc for o in overloads if o.doc]
        rows.append((name, "<br>".join(f"`{signature(o)}`" for o in overloads), ", ".join(libraries),
                     "; ".join(dict.fromkeys(notes)).replace("|", "\\|")))
    return sorted(rows, key=lambda row: (row[2], row[0]))
