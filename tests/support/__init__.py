"""Test support shared by tests/ and bench/ (import as ``tests.support.<module>``; bench scripts put
the repository root on sys.path first).

- ``net``: ``free_port()``, a free TCP port on loopback; ``refused_at_tls()``, a client refused in the handshake
- ``serve``: ``Serve``, `trainjob-admission serve` in its own process, ready over TLS, stopped cleanly
- ``service``: that process on the test control plane (``start_service``, ``register``, least-privilege
  kubeconfig) and the hack/cluster module as ``cluster``
- ``objects``: the TrainJob and runtime builders (``trainjob``, ``example_job``, ``runtime``)
- ``metrics``: ``reloads(metrics_text)``, parsed from a /metrics page
"""
