"""Certificates for the webhook: a private CA, serving certificates, and live reloading."""
