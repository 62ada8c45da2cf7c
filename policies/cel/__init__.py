"""CEL as bundles use it: the parser and its cached tables, the environment (variables,
functions, compile, lint, evaluation under a budget), the compiled closures and the authorizer.

May import: policies.k8s.
"""
