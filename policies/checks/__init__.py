"""Built-in checks. Each module exposes ``check(context, settings) -> list[Finding]``: what is
wrong, with the numbers, and the fix; an empty list means the check passed. How to add one:
docs/architecture.md, "Adding a built-in check"."""
