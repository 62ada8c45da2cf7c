"""Policy bundles: the schema (``schema``; the checks' settings come from their modules), every
CEL expression of a document compiled by its path (``expressions``), compiling a document into a
``Bundle`` with located problems (``compile``), reading files, directories and built-ins
(``load``), admin-written mutations, and where each value was written (``yamlpos``).

May import: policies.k8s, policies.cel, policies.job, policies.capacity, policies.checks.
"""
