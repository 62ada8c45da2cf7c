"""Built-in checks. Each module exposes ``check(context, settings) -> list[Finding]``: what is
wrong, with the numbers, and the fix; an empty list means the check passed. Adding a check is
its module, its settings model on ``bundle.Checks`` and one line in ``registry.CHECKS``."""
