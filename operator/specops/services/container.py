"""Build the long-lived clients and services once, at operator start-up (kept in Kopf's memo)."""

from __future__ import annotations

from dataclasses import dataclass

from specops.adapters.kube import KubeClient, load_connection_settings
from specops.adapters.prometheus import MetricsHub
from specops.adapters.triton import TritonModelControl
from specops.assets import bls_model_source
from specops.domain.render import RenderOptions
from specops.services.config import OperatorConfig
from specops.services.control import ControlLoop
from specops.services.reconciler import Reconciler


@dataclass
class Services:
    config: OperatorConfig
    kube: KubeClient
    metrics: MetricsHub
    reconciler: Reconciler
    control: ControlLoop

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
    control = ControlLoop(kube, metrics, TritonModelControl(), retries=config.triton_retries)
    return Services(
        config=config, kube=kube, metrics=metrics, reconciler=Reconciler(kube, options), control=control
    )
