"""``policy lint`` advice on bundles that compile: what is legal but will confuse submitters.

Errors (schema, CEL syntax, unknown variables and functions) stop a bundle from loading and
are ``bundle.BundleError``; these warnings never do.
"""
from __future__ import annotations

from dataclasses import dataclass

from .bundle import Bundle


@dataclass(frozen=True)
class LintWarning:
    source: str
    bundle: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: bundle {self.bundle}: rule {self.rule}: {self.message}"


def lint(bundle: Bundle) -> list[LintWarning]:
    """Every warning for one compiled bundle, in rule order."""
    return [LintWarning(bundle.source, bundle.name, compiled.rule.name,
                        "no message; submitters will only see the expression")
            for compiled in bundle.rules
            if not (compiled.rule.message or compiled.rule.messageExpression)]
