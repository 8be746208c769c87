"""Operator-wide settings, read once at start-up from the environment (the chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from specops.api.models import DEFAULT_PROMETHEUS_URL


def _flag(value: str | None, default: bool | None) -> bool | None:
    if value is None or value.strip().lower() in ("", "auto"):
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class OperatorConfig:
    default_image: str | None = None
    """Serving image for every backend when a spec names none; None: each backend's own default."""
    # None = detect: render PodMonitors only when the monitoring.coreos.com API is served.
    pod_monitor: bool | None = None
    # Seconds between control-loop ticks when a resource gives no metrics interval.
    default_interval_s: float = 15.0
    # Prometheus' scrape interval of the serving pods: rate windows span several scrapes.
    scrape_interval_s: float = 15.0
    # How long one call to a serving engine may take (lossless check, health): a hung pod never
    # holds the others' decisions longer.
    engine_deadline_s: float = 30.0
    # The span of one measurement's rates; None = max(4 scrapes, 10 s).
    rate_window_s: float | None = None
    route_release_timeout_s: float = 300.0
    """How long a deletion waits for a route that still names the canary before deleting anyway."""
    prometheus_url: str = DEFAULT_PROMETHEUS_URL
    """The Prometheus of every resource whose spec.metrics.prometheus.url is empty."""
    # Leader election (specops run --leader-election): client-go's defaults.
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        env = dict(os.environ) if env is None else env
        return cls(
            default_image=env.get("SPECOPS_DEFAULT_IMAGE") or None,
            pod_monitor=_flag(env.get("SPECOPS_POD_MONITOR"), None),
            default_interval_s=float(env.get("SPECOPS_DEFAULT_INTERVAL_SECONDS", "15")),
            scrape_interval_s=float(env.get("SPECOPS_SCRAPE_INTERVAL_SECONDS", "15")),
            engine_deadline_s=float(env.get("SPECOPS_ENGINE_DEADLINE_SECONDS", "30")),
            rate_window_s=float(env["SPECOPS_RATE_WINDOW_SECONDS"])
            if float(env.get("SPECOPS_RATE_WINDOW_SECONDS") or 0) > 0
            else None,
            route_release_timeout_s=float(env.get("SPECOPS_ROUTE_RELEASE_TIMEOUT_SECONDS", "300")),
            prometheus_url=env.get("SPECOPS_PROMETHEUS_URL") or DEFAULT_PROMETHEUS_URL,
            lease_duration_s=float(env.get("SPECOPS_LEASE_DURATION_SECONDS") or 15),
            renew_deadline_s=float(env.get("SPECOPS_LEASE_RENEW_DEADLINE_SECONDS") or 10),
            retry_period_s=float(env.get("SPECOPS_LEASE_RETRY_PERIOD_SECONDS") or 2),
        )
