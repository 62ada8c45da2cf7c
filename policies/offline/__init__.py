"""What runs on decisions without a request: the background audit, ``policy test`` cases and their
reports, lint, renderings of a decision, and CSV a spreadsheet opens safely.

May import: policies.k8s, policies.cel, policies.job, policies.capacity, policies.checks, policies.bundle,
policies.decide.
"""
