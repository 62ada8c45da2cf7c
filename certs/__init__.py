"""Certificates for the webhook: a private CA, serving certificates, client-certificate checks and
live reloading.

May import: nothing else of ours.
"""


class CertificateError(Exception):
    """The root of every error raised by certs/."""
