"""What runs beside the requests: the hot-reloaded bundle set (``bundleset``) and the PolicyBundle
objects that feed it (``clusterbundles``), the background audit (``auditscan``, ``policyreports``),
deadline warnings, the decision log's checkpoints and the reservation feed.

May import: policies, webhook.kube, webhook.decisionlog, webhook.metrics, webhook.inject.
"""
