"""Policy engine: bundle schema, CEL evaluation, built-in checks and the effective-job model.

The server, the CLI and the tests all decide through :func:`policies.decide.engine.evaluate`.
"""
