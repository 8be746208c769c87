"""Names and labels of everything specops creates, shared by serving and training objects.

Names longer than 63 characters are cut and suffixed with a hash so they stay valid
DNS labels and label values; the same rule gives the label values, and selectors use
the same derived values.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from specops.api.models import API_VERSION, KIND

STABLE = "stable"
CANARY = "canary"
HOLDBACK = "holdback"
"""The variant of the plain pod held back beside the speculating stable pods."""
GPU_RESOURCE = "nvidia.com/gpu"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_DEPLOYMENT = "specops.dev/deployment"
LABEL_VARIANT = "specops.dev/variant"
LABEL_DRAFT_VERSION = "specops.dev/draft-version"
LABEL_DRAFT = "specops.dev/draft"
"""The identity of the draft a pod serves (``draft_label``); Prometheus sees it as ``specops_draft``."""
LABEL_TRAFFIC = "specops.dev/traffic"
TRAFFIC_SERVE = "serve"
TRAFFIC_HOLD = "hold"
ANNOTATION_CONFIG_HASH = "specops.dev/config-hash"
APP_NAME = "specops-serving"
"""A fixed app name: model names may be longer than a label value allows or hold '/'."""
COMPONENT_SERVING = "serving"
COMPONENT_REPOSITORY = "engine-config"
COMPONENT_MONITORING = "monitoring"

_MAX_NAME = 63
_HASH_LEN = 8

_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
DNS1035_PREFIX = "sd-"
"""Put before a Service name that would start with a digit (``70b-chat`` -> ``sd-70b-chat-<hash>``)."""


class RenderError(ValueError):
    """The resource cannot be rendered; ``field`` is the path to fix (e.g. ``spec.serving.image``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_HASH_LEN]


def _with_digest(cleaned: str, original: str, limit: int, strip: str) -> str:
    """``cleaned`` cut to fit ``limit`` with ``-<hash of original>`` after it: stable and distinct."""
    head = cleaned[: limit - _HASH_LEN - 1].rstrip(strip)
    return f"{head}-{_digest(original)}" if head else _digest(original)


def bounded(text: str, limit: int = _MAX_NAME) -> str:
    """``text`` if short enough, else a prefix and a hash of the whole, at most ``limit`` characters."""
    if len(text) <= limit:
        return text
    return _with_digest(text, text, limit, "-._")


def dns1123_name(text: str, limit: int = _MAX_NAME) -> str:
    """A valid DNS-1123 subdomain of at most ``limit`` characters derived from ``text``.

    ``text`` itself when valid; otherwise lower-cased, every other character run turned
    into ``-``, cut, and suffixed with a hash of the original so two inputs never meet.
    """
    if len(text) <= limit and _DNS1123_SUBDOMAIN.fullmatch(text):
        return text
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return _with_digest(cleaned, text, limit, "-")


def dns1035_name(text: str) -> str:
    """A valid DNS-1035 label (what a Service name must be) derived from ``text``.

    ``text`` itself when valid; otherwise dots and other characters become ``-``, a name
    that would start with a digit gets the ``sd-`` prefix, and a hash of the original
    follows, so ``llama-3.1-70b`` -> ``llama-3-1-70b-<hash>`` never meets a resource
    named ``llama-3-1-70b``.
    """
    if len(text) <= _MAX_NAME and _DNS1035_LABEL.fullmatch(text):
        return text
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not cleaned[:1].isalpha():
        cleaned = f"{DNS1035_PREFIX}{cleaned}"
    return _with_digest(cleaned, text, _MAX_NAME, "-")


def child_name(resource_name: str, variant: str) -> str:
    """Name of a variant's Deployment: ``<name>`` for stable, ``<name>-<variant>`` otherwise."""
    return dns1123_name(resource_name if variant == STABLE else f"{resource_name}-{variant}")


def variant_service_name(resource_name: str, variant: str) -> str:
    """The Service of one variant's pods (a Gateway API backend): ``<name>-<variant>``, DNS-1035."""
    return dns1035_name(f"{resource_name}-{variant}")


def service_name(resource_name: str) -> str:
    """The user-facing Service selecting every variant's pods: ``<name>``, made a DNS-1035 label."""
    return dns1035_name(resource_name)


def repository_configmap_name(resource_name: str, variant: str) -> str:
    """The variant's engine config ConfigMap: ``<child>-engine-config``."""
    prefix = resource_name if variant == STABLE else f"{resource_name}-{variant}"
    return dns1123_name(f"{prefix}-engine-config")


def label_value(resource_name: str) -> str:
    """The value of ``specops.dev/deployment`` (and the Prometheus label ``specops_deployment``).

    At most 63 characters of the label-value alphabet; every selector, LIST and metrics
    lookup uses this value, never the raw name.
    """
    if len(resource_name) <= _MAX_NAME and _LABEL_VALUE.fullmatch(resource_name):
        return resource_name
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", resource_name).strip("-_.")
    return _with_digest(cleaned, resource_name, _MAX_NAME, "-_.")


def draft_label(version: str, identity: str) -> str:
    """The value of ``specops.dev/draft``: the version, readable, then a hash of the whole identity.

    Two drafts with the same version but another engine get different values, so their
    series never mix; the value is a valid label value whatever the version holds.
    """
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", version).strip("-_.")
    return _with_digest(cleaned, identity, _MAX_NAME, "-_.")


def label_problem(key: str, value: str) -> str | None:
    """Why the API server would refuse the label ``key: value``; None when it accepts it."""
    prefix, slash, label_name = key.rpartition("/")
    if slash and not (prefix and len(prefix) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return f"label key {key!r}: the prefix must be a DNS-1123 subdomain of at most 253 characters"
    if not (len(label_name) <= _MAX_NAME and _LABEL_NAME.fullmatch(label_name)):
        return (
            f"label key {key!r}: the name must be 1-63 characters of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    if not (len(value) <= _MAX_NAME and _LABEL_VALUE.fullmatch(value)):
        return (
            f"label value {value!r}: at most 63 characters of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def selector_labels(resource_name: str, variant: str) -> dict[str, str]:
    """Labels that select one variant's serving pods (Deployment selector, per-variant Service)."""
    return {LABEL_DEPLOYMENT: label_value(resource_name), LABEL_VARIANT: variant}


def shared_selector_labels(resource_name: str) -> dict[str, str]:
    """Labels that select every variant's serving pods (shared Service, PodMonitor)."""
    return {LABEL_COMPONENT: COMPONENT_SERVING, LABEL_DEPLOYMENT: label_value(resource_name)}


def traffic_selector_labels(resource_name: str) -> dict[str, str]:
    """Labels of the pods the shared Service sends traffic to: every variant cleared for traffic.

    A canary's pods carry ``specops.dev/traffic: hold`` until its lossless check passed, so
    with the replica-ratio split they receive nothing before that.
    """
    return {**shared_selector_labels(resource_name), LABEL_TRAFFIC: TRAFFIC_SERVE}


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    """The ownerReference every child carries: garbage-collected with its SpeculativeDeployment."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
