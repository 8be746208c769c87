"""What the API server does with a CRD's structural schema before it stores an object.

A real API server defaults, validates (OpenAPI v3) and runs the CEL rules of
``x-kubernetes-validations`` for every create and update of a custom resource.
The emulated server has none of that, so a test could store objects that a
cluster refuses. ``CrdAdmission`` replays those steps from the CRD itself so
tests see the same 422 answers, with the same field paths, as users do.

Simplifications (each one is also listed in README.md):

- nothing is pruned: unknown fields are kept, as with
  ``x-kubernetes-preserve-unknown-fields`` everywhere;
- ``status`` is neither defaulted nor validated (the server validates writes to
  ``/status`` too; tests write status through the operator only);
- string ``format`` values are not checked;
- validation ratcheting (unchanged invalid values pass) is not emulated;
- list items are correlated with ``oldSelf`` only for ``x-kubernetes-list-type: map``.

CEL: the ``cel`` package (cel-rust) gives the core language: macros (``has``,
``all``, ``exists``, ``exists_one``, ``map``, ``filter``), ``size``, conversions,
``duration()``, ``timestamp()``, string ``contains/startsWith/endsWith/matches``,
optionals through ``OptionalValue``. ``cel.stdlib`` adds the cel-go string, math,
list and set extensions. Kubernetes' own extensions are added here: ``isSorted()``,
``quantity()`` (as a number), ``isQuantity()``, ``isGreaterThan()``,
``isLessThan()``, ``compareTo()``, ``asInteger()``, ``asApproximateFloat()``.
Missing: ``url()``, ``ip()``, ``cidr()``, ``format.*``, ``authorizer``, ``indexOf``
on lists, the ``.?`` optional field syntax and ``fold``.
"""

from __future__ import annotations

import copy
import dataclasses
import decimal
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import cel
import openapi_schema_validator
from cel import stdlib as cel_stdlib
from jsonschema.exceptions import ValidationError

MISSING: Final = object()  # "no old value" for CEL correlation; None is a legal JSON value


@dataclasses.dataclass(frozen=True)
class FieldCause:
    """One refused field, shaped like a ``details.causes`` entry of a Kubernetes Status."""

    field: str
    reason: str
    message: str  # without the field prefix, as Kubernetes puts it in causes

    def describe(self) -> str:
        return f"{self.field}: {self.message}"

    def as_status_cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


class AdmissionError(Exception):
    """Raised by an admission hook; the emulated server answers 422 Invalid with these causes."""

    def __init__(self, causes: Sequence[FieldCause]) -> None:
        super().__init__("; ".join(cause.describe() for cause in causes))
        self.causes: tuple[FieldCause, ...] = tuple(causes)


class CrdAdmission:
    """Defaulting, schema validation and CEL rules of one CRD, as an emulator admission hook.

    Call it as ``admission(operation, new_obj, old_obj)`` with operation ``CREATE`` or
    ``UPDATE``; it returns the defaulted object or raises ``AdmissionError``.
    """

    def __init__(self, crd: Mapping[str, Any]) -> None:
        spec = crd["spec"]
        self.group: str = spec["group"]
        self.kind: str = spec["names"]["kind"]
        self.plural: str = spec["names"]["plural"]
        self._schemas: dict[str, dict[str, Any]] = {
            version["name"]: _without_status(version.get("schema", {}).get("openAPIV3Schema", {}))
            for version in spec["versions"]
        }
        self._validators = {
            name: openapi_schema_validator.OAS30Validator(_to_json_schema(schema))
            for name, schema in self._schemas.items()
        }

    def __call__(
        self, operation: str, new_obj: dict[str, Any], old_obj: dict[str, Any] | None
    ) -> dict[str, Any]:
        version = str(new_obj.get("apiVersion", "")).rsplit("/", 1)[-1]
        schema = self._schemas.get(version) or next(iter(self._schemas.values()))
        validator = self._validators.get(version) or next(iter(self._validators.values()))

        status = new_obj.get("status", MISSING)
        obj = {key: copy.deepcopy(value) for key, value in new_obj.items() if key != "status"}
        apply_defaults(schema, obj)  # fills in place

        causes = list(schema_causes(validator, obj))
        if any(cause.reason in _BLOCKING_REASONS for cause in causes):
            if _has_rules(schema):  # the server does not run CEL on a wrongly typed object
                causes.append(_RULES_NOT_CHECKED)
        else:
            old_view: Any = MISSING
            if operation == "UPDATE" and old_obj is not None:
                old_view = {key: value for key, value in old_obj.items() if key != "status"}
            causes += cel_causes(schema, obj, old_view)
        if causes:
            raise AdmissionError(causes)
        if status is not MISSING:
            obj["status"] = status
        return obj


_BLOCKING_REASONS: Final = ("FieldValueTypeInvalid", "FieldValueNotSupported")
_RULES_NOT_CHECKED: Final = FieldCause(
    "<nil>",
    "FieldValueInvalid",
    'Invalid value: "null": some validation rules were not checked because the object was invalid; '
    "correct the existing errors to complete validation",
)


def _has_rules(schema: Any) -> bool:
    if isinstance(schema, Mapping):
        return "x-kubernetes-validations" in schema or any(_has_rules(value) for value in schema.values())
    if isinstance(schema, list):
        return any(_has_rules(item) for item in schema)
    return False


def _without_status(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The root schema minus ``status``: status writes are not validated here."""
    result = dict(schema)
    result["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k != "status"}
    if "required" in result:
        result["required"] = [name for name in result["required"] if name != "status"]
    return result


# --- defaulting -----------------------------------------------------------------------------------


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """Fill missing fields from ``default``, recursively, also inside values that defaults created."""
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties") or {}
        for name, subschema in properties.items():
            if name not in value and "default" in subschema:
                value[name] = copy.deepcopy(subschema["default"])
        for name, subschema in properties.items():
            if value.get(name) is not None:
                value[name] = apply_defaults(subschema, value[name])
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for name in value:
                if name not in properties and value[name] is not None:
                    value[name] = apply_defaults(additional, value[name])
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            value[:] = [apply_defaults(items, item) if item is not None else item for item in value]
    return value


# --- OpenAPI validation ---------------------------------------------------------------------------

_SCHEMA_CHILDREN: Final = ("items", "additionalProperties", "not")
_SCHEMA_LISTS: Final = ("allOf", "anyOf", "oneOf")


def _to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Translate Kubernetes' structural-schema dialect into plain OpenAPI 3.0 for the validator."""
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key == "default":
            continue
        if key == "properties":
            result[key] = {name: _to_json_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_CHILDREN and isinstance(value, Mapping):
            result[key] = _to_json_schema(value)
        elif key in _SCHEMA_LISTS:
            result[key] = [_to_json_schema(sub) for sub in value]
        else:
            result[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        result.pop("type", None)
        result.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    return result


def render_path(parts: Iterable[str | int]) -> str:
    """``spec``, ``items``, 0, ``name`` -> ``spec.items[0].name`` (Kubernetes field-path style)."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


_JSON_TYPES: Final = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return "number"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def schema_causes(validator: Any, obj: Mapping[str, Any]) -> Iterable[FieldCause]:
    """Every schema violation as a Kubernetes-style cause, sorted by field for stable messages."""
    causes: list[FieldCause] = []
    for error in validator.iter_errors(obj):
        causes.extend(_error_causes(error))
    return sorted(set(causes), key=lambda cause: (cause.field, cause.message))


def _error_causes(error: ValidationError) -> Iterable[FieldCause]:
    parts = list(error.absolute_path)
    field = render_path(parts)
    value = error.instance
    kind = error.validator
    bound = error.validator_value
    if kind == "required":
        present = value if isinstance(value, Mapping) else {}
        for name in bound:
            if name not in present:
                yield FieldCause(render_path([*parts, name]), "FieldValueRequired", "Required value")
        return
    if kind == "enum":
        supported = ", ".join(_json(option) for option in bound)
        message = f"Unsupported value: {_json(value)}: supported values: {supported}"
        yield FieldCause(field, "FieldValueNotSupported", message)
        return
    if kind == "type":
        actual = _json_type(value)
        message = f'Invalid value: "{actual}": {field} in body must be of type {bound}: "{actual}"'
        yield FieldCause(field, "FieldValueTypeInvalid", message)
        return
    templates: dict[str, str] = {
        "maximum": "should be less than or equal to {bound}",
        "minimum": "should be greater than or equal to {bound}",
        "exclusiveMaximum": "should be less than {bound}",
        "exclusiveMinimum": "should be greater than {bound}",
        "maxLength": "should be at most {bound} chars long",
        "minLength": "should be at least {bound} chars long",
        "pattern": "should match '{bound}'",
        "maxItems": "should have at most {bound} items",
        "minItems": "should have at least {bound} items",
        "maxProperties": "should have at most {bound} properties",
        "minProperties": "should have at least {bound} properties",
        "multipleOf": "should be a multiple of {bound}",
    }
    if kind in ("maximum", "minimum") and error.schema.get(f"exclusive{kind.capitalize()}") is True:
        kind = f"exclusive{kind.capitalize()}"  # OpenAPI 3.0 boolean form
    template = templates.get(kind)
    detail = f"{field} in body {template.format(bound=bound)}" if template else error.message
    yield FieldCause(field, "FieldValueInvalid", f"Invalid value: {_json(value)}: {detail}")


# --- CEL rules ------------------------------------------------------------------------------------


_QUANTITY: Final = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)
_QUANTITY_SCALE: Final = {
    "n": "1e-9", "u": "1e-6", "m": "1e-3", "": "1", "k": "1e3", "M": "1e6", "G": "1e9", "T": "1e12",
    "P": "1e15", "E": "1e18", "Ki": str(2**10), "Mi": str(2**20), "Gi": str(2**30), "Ti": str(2**40),
    "Pi": str(2**50), "Ei": str(2**60),
}  # fmt: skip


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity (``500m``, ``1Gi``, ``2e3``) as a number; CEL compares it natively."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"invalid quantity: {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return float(decimal.Decimal(number) * decimal.Decimal(10) ** int(suffix[1:]))
    return float(decimal.Decimal(number) * decimal.Decimal(_QUANTITY_SCALE[suffix]))


def _is_quantity(text: str) -> bool:
    return _QUANTITY.match(text.strip()) is not None


def _compare(a: float, b: float) -> int:
    return (a > b) - (a < b)


def _kubernetes_functions() -> dict[str, Callable[..., Any]]:
    return {
        "isSorted": lambda items: list(items) == sorted(items),
        "quantity": parse_quantity,
        "isQuantity": _is_quantity,
        "isGreaterThan": lambda a, b: a > b,
        "isLessThan": lambda a, b: a < b,
        "compareTo": _compare,
        "asInteger": int,
        "asApproximateFloat": float,
    }


@functools.cache
def _functions() -> dict[str, Callable[..., Any]]:
    context = cel.Context()
    cel_stdlib.add_stdlib_to_context(context)
    return {**context.functions, **_kubernetes_functions()}


@functools.cache
def _program(expression: str) -> Any:
    return cel.compile(expression)


@functools.cache
def _references_old_self(expression: str) -> bool:
    return "oldSelf" in _program(expression).variables()


@functools.cache
def _functions_of(expression: str) -> dict[str, Callable[..., Any]]:
    """The Python functions an expression calls (a namespaced one, ``math.abs``, is listed by the
    program under its last part). A context wraps every function it is given before its first
    evaluation: with all 55 that was most of a rule's cost, and no rule of ours calls one."""
    used = set(_program(expression).functions())
    return {name: f for name, f in _functions().items() if name in used or name.rsplit(".", 1)[-1] in used}


def _evaluate(expression: str, variables: dict[str, Any]) -> Any:
    functions = _functions_of(expression)
    context = cel.Context(variables=variables, functions=functions) if functions else variables
    return _program(expression).execute(context)


def _field_path(base: list[str | int], relative: str) -> str:
    """Append a rule's ``fieldPath`` (``.a.b`` or ``.a['b']``) to the node's own path."""
    parts: list[str | int] = list(base)
    for name in re.findall(r"\.([A-Za-z_][A-Za-z0-9_]*)|\['([^']*)'\]|\[(\d+)\]", relative):
        dotted, quoted, index = name
        parts.append(dotted or quoted if not index else int(index))
    return render_path(parts)


def cel_causes(schema: Mapping[str, Any], obj: Any, old: Any) -> list[FieldCause]:
    """Evaluate ``x-kubernetes-validations`` at every level; ``old`` is MISSING on create."""
    causes: list[FieldCause] = []
    _walk_rules(schema, obj, old, [], causes)
    return causes


def _walk_rules(
    schema: Mapping[str, Any], value: Any, old: Any, path: list[str | int], causes: list[FieldCause]
) -> None:
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations") or []:
        cause = _check_rule(rule, schema, value, old, path)
        if cause is not None:
            causes.append(cause)
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for name, item in value.items():
            subschema = properties.get(name, additional if isinstance(additional, Mapping) else None)
            if subschema is not None:
                old_item = old.get(name, MISSING) if isinstance(old, dict) else MISSING
                _walk_rules(subschema, item, old_item, [*path, name], causes)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        old_items = _correlate_list(schema, value, old)
        for index, item in enumerate(value):
            _walk_rules(schema["items"], item, old_items[index], [*path, index], causes)


def _correlate_list(schema: Mapping[str, Any], value: list[Any], old: Any) -> list[Any]:
    """Old counterparts of list items: by key for ``listType: map``, none for atomic lists."""
    keys = schema.get("x-kubernetes-list-map-keys") or []
    if schema.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
        return [MISSING] * len(value)

    def key_of(item: Any) -> tuple[Any, ...] | None:
        return tuple(item.get(key) for key in keys) if isinstance(item, dict) else None

    old_by_key = {key_of(item): item for item in old}
    return [old_by_key.get(key_of(item), MISSING) for item in value]


def _check_rule(
    rule: Mapping[str, Any], schema: Mapping[str, Any], value: Any, old: Any, path: list[str | int]
) -> FieldCause | None:
    expression: str = rule["rule"]
    variables: dict[str, Any] = {"self": value}
    if _references_old_self(expression):
        if rule.get("optionalOldSelf"):
            variables["oldSelf"] = cel.OptionalValue.none() if old is MISSING else cel.OptionalValue.of(old)
        elif old is MISSING:
            return None  # a transition rule runs only on update, when the old value exists
        else:
            variables["oldSelf"] = old
    field = _field_path(path, rule.get("fieldPath", ""))
    shown_type = schema.get("type", "object")
    try:
        result = _evaluate(expression, variables)
    except Exception as exc:  # an evaluation error refuses the object, as on a real server
        return FieldCause(
            field, "FieldValueInvalid", f'Invalid value: "{shown_type}": {exc} evaluating rule: {expression}'
        )
    if result is True:
        return None
    message = (
        _rule_message(rule, variables) if result is False else f"rule did not evaluate to bool: {expression}"
    )
    reason = rule.get("reason", "FieldValueInvalid")
    prefixes = {
        "FieldValueForbidden": "Forbidden: ",
        "FieldValueRequired": "Required value: ",
        "FieldValueDuplicate": f'Duplicate value: "{shown_type}": ',
    }
    return FieldCause(field, reason, prefixes.get(reason, f'Invalid value: "{shown_type}": ') + message)


def _rule_message(rule: Mapping[str, Any], variables: dict[str, Any]) -> str:
    if "messageExpression" in rule:
        try:
            text = _evaluate(rule["messageExpression"], variables)
        except Exception:  # the server falls back to the static message on errors
            text = None
        if isinstance(text, str) and text.strip():
            return text
    return str(rule.get("message") or f"failed rule: {rule['rule']}")


def prune_unknown(schema: Mapping[str, Any], obj: Any) -> list[str]:
    """Drop fields a structural schema does not declare, in place, as the API server prunes; their paths.

    At the root (and in ``x-kubernetes-embedded-resource`` objects) apiVersion, kind and metadata
    are always kept; ``x-kubernetes-preserve-unknown-fields`` keeps unknown fields but still prunes
    inside declared ones; ``additionalProperties`` applies its schema to every key.
    """
    unknown: list[str] = []
    _prune(schema, obj, [], unknown, embedded=True)
    return unknown


_EMBEDDED_KEYS = ("apiVersion", "kind", "metadata")


def _prune(
    schema: Mapping[str, Any], value: Any, path: list[str | int], unknown: list[str], *, embedded: bool
) -> None:
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                _prune(
                    items,
                    item,
                    [*path, index],
                    unknown,
                    embedded=bool(items.get("x-kubernetes-embedded-resource")),
                )
        return
    if not isinstance(value, dict):
        return
    properties = schema.get("properties")
    additional = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    for key in list(value):
        if embedded and key in _EMBEDDED_KEYS:
            continue  # ObjectMeta is decoded by the server itself, whatever the schema says
        if isinstance(properties, Mapping) and key in properties:
            child = properties[key]
            _prune(
                child,
                value[key],
                [*path, key],
                unknown,
                embedded=bool(child.get("x-kubernetes-embedded-resource")),
            )
        elif isinstance(additional, Mapping):
            _prune(additional, value[key], [*path, key], unknown, embedded=False)
        elif preserve or additional is True:
            continue
        else:
            unknown.append(render_path([*path, key]))
            del value[key]
