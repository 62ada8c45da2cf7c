"""The names of the rules the service reports itself, which no CEL rule may take (results, the
decision log and exceptions name rules: two rules of one name would be one). A leaf module, so
that the bundle schema can refuse them without importing the checks, which import the schema;
tests/unit/test_bundle_cel.py keeps CHECK_RULES equal to policies/checks/registry.py CHECKS."""
from __future__ import annotations

CHECK_RULES = ("quota", "gpu-limits", "job-shape", "pod-security", "limit-range", "duration", "image-policy",
               "schedulability", "kueue")
MATCH_CONDITION = "match-condition"  # a bundle's matchCondition that could not be evaluated
AUDIT_ANNOTATION = "audit-annotation"  # an auditAnnotation that could not be evaluated
CUSTOM_MUTATION = "custom-mutation"  # an admin-written mutation that could not be applied
PARAMS = "params"  # a paramRef bundle found no params object (policies/decide/paramref.py)
FIELD_VALIDATION = "field-validation"  # the API server's strict field validation (offline review; bundle "kubernetes")
# the job could not be modelled; it is over the input limits; a GPU product the bundle does not offer
ENGINE_RULES = ("job-model", "input-limits", "gpu-node-targeting", MATCH_CONDITION, AUDIT_ANNOTATION,
                CUSTOM_MUTATION, PARAMS, FIELD_VALIDATION)
BUILTIN_RULES = CHECK_RULES + ENGINE_RULES
