"""The name and label rules a real API server applies to every object it stores.

Kubernetes refuses, with 422 Invalid, object names and labels that are not valid for
their kind. The messages and regexes below are apimachinery's (``validation.IsDNS1123Subdomain``,
``IsDNS1035Label``, ``IsQualifiedName``, ``IsValidLabelValue``), so a test sees the same
answer a cluster gives:

- names: a DNS-1123 subdomain (at most 253 characters) for most kinds; a DNS-1035 label
  (at most 63, starting with a letter, no dots) for Services; a DNS-1123 label for
  Namespaces; a Job's name is also its pods' ``job-name`` label value, so at most 63;
- label keys: an optional DNS-1123 subdomain prefix and ``/``, then a name of at most 63
  characters (alphanumerics, ``-``, ``_``, ``.``, starting and ending alphanumeric);
- label values: at most 63 characters of the same alphabet, or empty;
- the same label rules for ``spec.selector`` (Services), ``spec.selector.matchLabels`` and
  ``spec.template.metadata.labels`` (Deployments, Jobs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

DNS1123_LABEL_MAX: Final = 63
DNS1123_SUBDOMAIN_MAX: Final = 253
DNS1035_LABEL_MAX: Final = 63
LABEL_VALUE_MAX: Final = 63
QUALIFIED_NAME_MAX: Final = 63

_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_DNS1035_LABEL = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"

_MAX_LENGTH = "must be no more than {limit} characters"


def _check(value: str, regex: str, limit: int, what: str, example: str) -> list[str]:
    errors = []
    if len(value) > limit:
        errors.append(_MAX_LENGTH.format(limit=limit))
    if not re.fullmatch(regex, value):
        errors.append(f"{what} (e.g. {example}, regex used for validation is '{regex}')")
    return errors


def dns1123_label_errors(value: str) -> list[str]:
    return _check(
        value,
        _DNS1123_LABEL,
        DNS1123_LABEL_MAX,
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
        "and must start and end with an alphanumeric character",
        "'my-name',  or '123-abc'",
    )


def dns1123_subdomain_errors(value: str) -> list[str]:
    return _check(
        value,
        _DNS1123_SUBDOMAIN,
        DNS1123_SUBDOMAIN_MAX,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
        "and must start and end with an alphanumeric character",
        "'example.com'",
    )


def dns1035_label_errors(value: str) -> list[str]:
    return _check(
        value,
        _DNS1035_LABEL,
        DNS1035_LABEL_MAX,
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
        "alphabetic character, and end with an alphanumeric character",
        "'my-name',  or 'abc-123'",
    )


def label_value_errors(value: str) -> list[str]:
    return _check(
        value,
        _LABEL_VALUE,
        LABEL_VALUE_MAX,
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
        "and must start and end with an alphanumeric character",
        "'MyValue',  or 'my_value',  or '12345'",
    )


def label_key_errors(key: str) -> list[str]:
    prefix, slash, name = key.rpartition("/")
    errors = []
    if slash:
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += [f"prefix part {error}" for error in dns1123_subdomain_errors(prefix)]
    if not name:
        errors.append("name part must be non-empty")
    else:
        errors += [
            f"name part {error}"
            for error in _check(
                name,
                _QUALIFIED_NAME,
                QUALIFIED_NAME_MAX,
                "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character",
                "'MyName',  or 'my.name',  or '123-abc'",
            )
        ]
    return errors


NAME_RULES: Final = {
    "Service": dns1035_label_errors,
    "Namespace": dns1123_label_errors,
}
"""Kinds whose names follow a stricter rule than a DNS-1123 subdomain."""


def name_errors(kind: str, name: str) -> list[str]:
    """Why the server refuses ``name`` for an object of ``kind`` (empty when it is valid)."""
    errors = NAME_RULES.get(kind, dns1123_subdomain_errors)(name)
    if kind == "Job" and len(name) > LABEL_VALUE_MAX:
        # The Job's name becomes its pods' batch.kubernetes.io/job-name label value.
        errors.append(f"must be no more than {LABEL_VALUE_MAX} characters")
    return errors


def _labels_causes(path: str, labels: Any) -> list[tuple[str, str]]:
    if not isinstance(labels, Mapping):
        return []
    causes = []
    for key, value in labels.items():
        for error in label_key_errors(str(key)):
            causes.append((path, f'Invalid value: "{key}": {error}'))
        for error in label_value_errors(str(value) if value is not None else ""):
            causes.append((f"{path}", f'Invalid value: "{value}": {error}'))
    return causes


def metadata_causes(kind: str, obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for every name or label the real server would refuse in ``obj``."""
    meta = obj.get("metadata") or {}
    causes = [
        ("metadata.name", f'Invalid value: "{meta.get("name", "")}": {error}')
        for error in name_errors(kind, str(meta.get("name", "")))
    ]
    causes += _labels_causes("metadata.labels", meta.get("labels"))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return causes
    if kind == "Service":
        causes += _labels_causes("spec.selector", spec.get("selector"))
    elif kind in ("Deployment", "Job", "ReplicaSet", "StatefulSet", "DaemonSet"):
        selector = spec.get("selector")
        if isinstance(selector, Mapping):
            causes += _labels_causes("spec.selector.matchLabels", selector.get("matchLabels"))
        template = spec.get("template")
        if isinstance(template, Mapping):
            causes += _labels_causes(
                "spec.template.metadata.labels", (template.get("metadata") or {}).get("labels")
            )
    return causes
