"""Kubernetes semantics mirrored from upstream, each module naming the file it follows:
quantities, pod resources, LimitRanger, pod validation, image references, redaction of
secret-looking values, the cluster state, bounded YAML manifests and API types as strict models.

May import: nothing else of ours.
"""
