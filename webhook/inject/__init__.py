"""What the service creates beside a job: the early injections a /mutate starts and its /validate
finishes (``early``), the creations themselves (``injector``), SSH keys (``keys``), the HMAC that
marks our objects (``provenance``) and the owner references and orphan clean-up (``reconciler``).

May import: policies, webhook.kube, webhook.decisionlog, webhook.metrics.
"""
