"""The admission path: the aiohttp server (``server``), one review (``reviewer``), AdmissionReview
parsing and answers (``protocol``), the decision record (``record``), callers and the in-flight
bound, the authorizer's SubjectAccessReviews (``access``) and the runtime snapshot read.

May import: policies, certs, webhook.kube, webhook.decisionlog, webhook.metrics, webhook.inject,
webhook.loops.
"""
