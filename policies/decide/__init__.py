"""The decision: ``engine.evaluate`` (the single decision path), ``Decision``, mutations and the
injection plans, PolicyExceptions, paramRef, input limits, and the judgement of a stored object.

May import: policies.k8s, policies.cel, policies.job, policies.capacity, policies.checks, policies.bundle.
"""
