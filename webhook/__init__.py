"""The service and the command line: the HTTPS admission server, injections, background loops,
the decision log and the Kubernetes API client.

Layers, lowest first; a package imports only those below it (tests/unit/test_imports.py):
kube, decisionlog, metrics, inject, loops, admission, startup, cli. Every layer may import
policies; certs is for admission, startup and cli.

May import: policies, certs.
"""


class ServiceError(Exception):
    """The root of every error raised by webhook/: ``except ServiceError`` catches them all."""
