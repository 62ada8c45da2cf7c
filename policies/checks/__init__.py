"""Built-in checks, one module each holding its settings model and its function
``check(context, settings) -> list[Finding]``: what is wrong, with the numbers, and the fix (an
empty list means the check passed). ``registry`` lists them; adding one is one module and one
line there (docs/architecture.md, "Adding a built-in check").

May import: policies.k8s, policies.cel, policies.job, policies.capacity.
"""
