"""Build the long-lived clients and services once, at operator start-up (kept in Kopf's memo)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specops.adapters.kube import KubeApiError, KubeClient, load_connection_settings
from specops.adapters.prometheus import MetricsHub
from specops.adapters.triton import TritonModelControl
from specops.assets import bls_model_source
from specops.domain.lifecycle import EventRecord
from specops.domain.render import RenderOptions
from specops.services.canary import CanaryService
from specops.services.config import OperatorConfig
from specops.services.control import ControlLoop
from specops.services.drafts import DraftLifecycle
from specops.services.reconciler import Reconciler
from specops.services.retraining import RetrainingService

log = logging.getLogger(__name__)


@dataclass
class TickOutcome:
    """What one resource's periodic tick produced, for the daemon: when to come back, what to post."""

    interval_s: float
    gone: bool = False
    posts: list[tuple[dict[str, Any], list[EventRecord]]] = field(default_factory=list)


@dataclass
class Services:
    config: OperatorConfig
    kube: KubeClient
    metrics: MetricsHub
    reconciler: Reconciler
    control: ControlLoop
    drafts: DraftLifecycle

    async def tick(self, namespace: str, name: str, now: Callable[[], datetime]) -> TickOutcome:
        """The control loop, then the draft's life (canary, retraining). API errors are logged and
        retried at the next interval, never raised: one resource's trouble stops nothing else."""
        outcome = TickOutcome(interval_s=self.config.default_interval_s)
        try:
            result = await self.control.tick(namespace, name, now(), self.config.default_interval_s)
        except KubeApiError as error:
            log.warning("control tick of %s/%s failed: %s", namespace, name, error)
            return outcome
        outcome.interval_s = result.interval_s
        if result.body is None:
            outcome.gone = True
            return outcome
        outcome.posts.append((result.body, result.events))
        try:
            body, events = await self.drafts.tick(namespace, name, now())
        except KubeApiError as error:
            log.warning("canary/retraining tick of %s/%s failed: %s", namespace, name, error)
            return outcome
        if body is not None:
            outcome.posts.append((body, events))
        return outcome

    async def close(self) -> None:
        await self.metrics.close()
        await self.kube.close()


async def build_services(config: OperatorConfig | None = None) -> Services:
    config = config or OperatorConfig.from_env()
    kube = KubeClient(load_connection_settings())
    pod_monitor = config.pod_monitor
    if pod_monitor is None:
        pod_monitor = await kube.api_served("monitoring.coreos.com/v1")
    options = RenderOptions(
        bls_source=bls_model_source(), default_image=config.default_image, pod_monitor=pod_monitor
    )
    metrics = MetricsHub(scrape_interval_s=config.scrape_interval_s)
    triton = TritonModelControl()
    reconciler = Reconciler(kube, options)
    control = ControlLoop(kube, metrics, triton, retries=config.triton_retries)
    gateway_api = await kube.api_served("gateway.networking.k8s.io/v1")
    canary = CanaryService(kube, metrics, triton, reconciler, gateway_api=gateway_api)
    drafts = DraftLifecycle(kube, RetrainingService(kube), canary)
    return Services(
        config=config, kube=kube, metrics=metrics, reconciler=reconciler, control=control, drafts=drafts
    )
