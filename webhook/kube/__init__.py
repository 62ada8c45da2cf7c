"""The Kubernetes API as the service uses it: one REST client with one set of errors
(``client``), the same on the event loop (``aio``), the resources it reads and writes
(``resources``), list+watch caches (``watch``), the cluster state fed from them (``statewatch``),
bounded calls for the event loop (``calls``) and request deadlines (``deadline``).

May import: policies.
"""
