"""Operator-wide settings, read once at start-up from the environment (the chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _flag(value: str | None, default: bool | None) -> bool | None:
    if value is None or value.strip().lower() in ("", "auto"):
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class OperatorConfig:
    default_image: str | None = None
    # None = detect: render PodMonitors only when the monitoring.coreos.com API is served.
    pod_monitor: bool | None = None
    # Seconds between control-loop ticks when a resource gives no metrics interval.
    default_interval_s: float = 15.0
    # Pod-level retries when applying a setting to Triton pods.
    triton_retries: int = 3
    # Prometheus' scrape interval of the serving pods: rate windows span several scrapes.
    scrape_interval_s: float = 15.0
    # How long one tick waits for the pods to take a setting: a slow or hung pod is reported as
    # not applied and keeps trying in the background, so it never holds the others' decisions.
    triton_deadline_s: float = 5.0
    triton_confirm_s: float = 60.0
    """How long a pod's confirmed BLS settings are trusted before the control loop reads them again."""
    # The span of one measurement's rates; None = max(4 scrapes, 10 s).
    rate_window_s: float | None = None
    route_release_timeout_s: float = 300.0
    """How long a deletion waits for a route that still names the canary before deleting anyway."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        env = dict(os.environ) if env is None else env
        return cls(
            default_image=env.get("SPECOPS_DEFAULT_IMAGE") or None,
            pod_monitor=_flag(env.get("SPECOPS_POD_MONITOR"), None),
            default_interval_s=float(env.get("SPECOPS_DEFAULT_INTERVAL_SECONDS", "15")),
            triton_retries=int(env.get("SPECOPS_TRITON_RETRIES", "3")),
            scrape_interval_s=float(env.get("SPECOPS_SCRAPE_INTERVAL_SECONDS", "15")),
            triton_deadline_s=float(env.get("SPECOPS_TRITON_DEADLINE_SECONDS", "5")),
            triton_confirm_s=float(env.get("SPECOPS_TRITON_CONFIRM_SECONDS", "60")),
            rate_window_s=float(env["SPECOPS_RATE_WINDOW_SECONDS"])
            if float(env.get("SPECOPS_RATE_WINDOW_SECONDS") or 0) > 0
            else None,
            route_release_timeout_s=float(env.get("SPECOPS_ROUTE_RELEASE_TIMEOUT_SECONDS", "300")),
        )
