"""The wiring module: builds the adapters and services once, at operator start-up (kept in Kopf's memo).

It is the only module of services/ that names an adapter; every other service depends on
the ports (specops.ports), which an import-linter contract enforces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specops.adapters.engine_client import EngineHttpClient
from specops.adapters.kube import KubeClient, load_connection_settings
from specops.adapters.prometheus import KubeCredentialReader, MetricsHub
from specops.adapters.routing import GatewayApiRouter, ReplicaRatioRouter
from specops.assets import llmapi_model_source
from specops.domain.discovery import PodEndpoint
from specops.domain.metrics import rate_window_s
from specops.domain.render import RenderOptions
from specops.ports import TrafficRouter, TrafficRouting
from specops.services.canary import CanaryService
from specops.services.config import OperatorConfig
from specops.services.control import ControlLoop
from specops.services.reconciler import Reconciler
from specops.services.retraining import RetrainingService
from specops.services.tick import ResourceTick, TickOutcome

__all__ = ["Services", "TickOutcome", "build_services"]


@dataclass
class Services:
    config: OperatorConfig
    kube: KubeClient
    metrics: MetricsHub
    reconciler: Reconciler
    control: ControlLoop
    retraining: RetrainingService
    canary: CanaryService
    ticker: ResourceTick
    engines: EngineHttpClient | None = None  # closed with the services

    async def tick(
        self,
        namespace: str,
        name: str,
        now: Callable[[], datetime],
        watched: Mapping[str, Any] | None = None,
        serving: Sequence[PodEndpoint] | None = None,
    ) -> TickOutcome:
        """One resource's periodic tick; API errors are logged and retried next interval, never raised."""
        return await self.ticker.run(namespace, name, now(), watched, serving)

    def forget(self, namespace: str, name: str) -> None:
        """The resource's daemon stopped: stop polling for it and drop its in-memory state."""
        self.control.unsubscribe(namespace, name)
        self.ticker.forget(namespace, name)

    async def close(self) -> None:
        await self.canary.checks.close()
        await self.metrics.close()
        if self.engines is not None:
            await self.engines.close()
        await self.kube.close()


async def build_services(config: OperatorConfig | None = None) -> Services:
    config = config or OperatorConfig.from_env()
    kube = KubeClient(load_connection_settings())
    pod_monitor = config.pod_monitor
    if pod_monitor is None:
        pod_monitor = await kube.api_served("monitoring.coreos.com/v1")
    options = RenderOptions(
        triton_model_source=llmapi_model_source(), default_image=config.default_image, pod_monitor=pod_monitor
    )
    metrics = MetricsHub(
        scrape_interval_s=config.scrape_interval_s,
        window_s=config.rate_window_s,
        default_url=config.prometheus_url,
        credentials=KubeCredentialReader(kube),
    )
    engines = EngineHttpClient()
    reconciler = Reconciler(kube, options, routes=GatewayApiRouter(kube))
    gateway = GatewayApiRouter(kube)
    control = ControlLoop(
        metrics,
        rate_window_s=config.rate_window_s or rate_window_s(config.scrape_interval_s),
        kube=kube,
        routes=gateway,
    )
    routers: dict[TrafficRouting, TrafficRouter] = {
        "GatewayAPI": gateway,
        "ReplicaRatio": ReplicaRatioRouter(),
    }
    gateway_api = await kube.api_served("gateway.networking.k8s.io/v1")
    canary = CanaryService(
        kube,
        metrics,
        engines,
        reconciler,
        routers=routers,
        gateway_api=gateway_api,
        rate_window_s=config.rate_window_s or rate_window_s(config.scrape_interval_s),
        engine_deadline_s=config.engine_deadline_s,
        release_timeout_s=config.route_release_timeout_s,
    )
    retraining = RetrainingService(kube)
    ticker = ResourceTick(kube, control, retraining, canary, default_interval_s=config.default_interval_s)
    return Services(
        config=config,
        kube=kube,
        metrics=metrics,
        reconciler=reconciler,
        control=control,
        retraining=retraining,
        canary=canary,
        ticker=ticker,
        engines=engines,
    )
