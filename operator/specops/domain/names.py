"""Names and labels of everything specops creates, shared by serving and training objects.

Names longer than 63 characters are cut and suffixed with a hash so they stay valid
DNS labels and label values; the same rule gives the label values, and selectors use
the same derived values.
"""

from __future__ import annotations

import hashlib
from typing import Any

from specops.api.models import API_VERSION, KIND

STABLE = "stable"
CANARY = "canary"
GPU_RESOURCE = "nvidia.com/gpu"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_DEPLOYMENT = "specops.dev/deployment"
LABEL_VARIANT = "specops.dev/variant"
LABEL_DRAFT_VERSION = "specops.dev/draft-version"
LABEL_TRAFFIC = "specops.dev/traffic"
TRAFFIC_SERVE = "serve"
TRAFFIC_HOLD = "hold"
ANNOTATION_CONFIG_HASH = "specops.dev/config-hash"
APP_NAME = "specops-serving"
"""A fixed app name: model names may be longer than a label value allows or hold '/'."""
COMPONENT_SERVING = "serving"
COMPONENT_REPOSITORY = "model-repository"
COMPONENT_MONITORING = "monitoring"

_MAX_NAME = 63


class RenderError(ValueError):
    """The resource cannot be rendered; ``field`` is the path to fix (e.g. ``spec.serving.image``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def bounded(text: str, limit: int = _MAX_NAME) -> str:
    """``text`` if short enough, else a prefix and a hash of the whole, at most ``limit`` characters."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return f"{text[: limit - 9].rstrip('-.')}-{digest}"


def child_name(resource_name: str, variant: str) -> str:
    """Name of a variant's Deployment: ``<name>`` for stable, ``<name>-<variant>`` otherwise."""
    return bounded(resource_name if variant == STABLE else f"{resource_name}-{variant}")


def variant_service_name(resource_name: str, variant: str) -> str:
    """The Service of one variant's pods (a Gateway API backend): ``<name>-<variant>``."""
    return bounded(f"{resource_name}-{variant}")


def service_name(resource_name: str) -> str:
    """The user-facing Service selecting every variant's pods: ``<name>``."""
    return bounded(resource_name)


def repository_configmap_name(resource_name: str, variant: str) -> str:
    """The variant's model-repository ConfigMap: ``<child>-model-repository``."""
    prefix = resource_name if variant == STABLE else f"{resource_name}-{variant}"
    return bounded(f"{prefix}-model-repository")


def label_value(resource_name: str) -> str:
    """The value of ``specops.dev/deployment`` (and the Prometheus label ``specops_deployment``)."""
    return bounded(resource_name)


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
