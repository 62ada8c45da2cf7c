"""Kubernetes API types a bundle's settings hold, as strict pydantic models checked the way the API
server validates them (metav1.LabelSelector, core/v1 Toleration and NodeSelectorRequirement, label
values, quantities), and ``Strict``: a model that refuses unknown fields, as the API server's
Strict field validation does."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .quantity import QuantityError, to_decimal


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

class LabelSelectorRequirement(Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = []

class LabelSelector(Strict):
    matchLabels: dict[str, str] = {}
    matchExpressions: list[LabelSelectorRequirement] = []

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.matchLabels.items()):
            return False
        for req in self.matchExpressions:
            present = req.key in labels
            if req.operator == "In" and not (present and labels[req.key] in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True

def checked_quantity(value: str | None) -> str | None:
    """A settings field's quantity, refused where the API server would refuse it."""
    if value is not None:
        try:
            to_decimal(value)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
    return value


# A node label value (apimachinery IsValidLabelValue), as affinity values must be.
LabelValue = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")]

class Toleration(Strict):
    """A core/v1 Toleration, checked as the API server validates one (ValidateTolerations)."""

    key: str = Field(default="", max_length=316)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None  # None: every effect
    tolerationSeconds: int | None = None

    @model_validator(mode="after")
    def _valid(self) -> "Toleration":
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists has no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key must have operator Exists")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies only to effect NoExecute")
        return self

class NodeSelectorRequirement(Strict):
    """A core/v1 NodeSelectorRequirement (a matchExpressions item of a nodeSelectorTerm)."""

    key: str = Field(min_length=1, max_length=316)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[LabelValue] = Field(default=[], max_length=256)

    @model_validator(mode="after")
    def _valid(self) -> "NodeSelectorRequirement":
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not self.values[0].lstrip("-").isdigit()):
            raise ValueError(f"operator {self.operator} takes one integer value")
        return self
