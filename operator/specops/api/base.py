"""The base of every API model, and the CEL rule helpers the models attach to their schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


def cel_rules(*rules: tuple[str, str] | tuple[str, str, str]) -> dict[str, Any]:
    """CEL `x-kubernetes-validations` for a model: (rule, message[, fieldPath])."""
    out = []
    for rule in rules:
        entry = {"rule": rule[0], "message": rule[1]}
        if len(rule) == 3:
            entry["fieldPath"] = rule[2]
        out.append(entry)
    return {"x-kubernetes-validations": out}


def immutable(message: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": message}]}


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields ignored (the server prunes them)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True, use_enum_values=True
    )
