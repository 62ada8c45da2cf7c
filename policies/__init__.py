"""What is decided, with no I/O: the effective job, CEL, the built-in checks, bundles and the
decision. The server, the CLI and the tests all decide through
:func:`trainjob_admission.policies.decide.engine.evaluate`.

Layers, lowest first; a package imports only those below it (tests/unit/test_imports.py):
k8s, cel, job, capacity, checks, bundle, decide, offline.

May import: nothing of webhook or certs.
"""


class PolicyError(Exception):
    """The root of every error raised by policies/: ``except PolicyError`` catches them all."""
