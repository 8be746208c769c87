"""A resource named like a model, longer than a label allows, served end to end.

The real operator against the emulated API server (which refuses the names and labels a
cluster refuses), Debian's Prometheus and simulated engines: the Services get valid
names, the pods and their metrics are found through the derived label value, and deletion
removes every child and the finalizer.
"""

from __future__ import annotations

from typing import Any

import pytest

from specops.adapters.kube import KubeClient
from specops.domain.names import label_value, service_name, variant_service_name
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import ServingController
from tests.e2e.conftest import Operator
from tests.e2e.test_control_loop import fast_resource
from tests.e2e.waiting import eventually, resource

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]

NAME = "llama-3.1-70b-instruct-with-a-very-long-descriptive-suffix-for-production"


async def test_a_long_dotted_name_serves_measures_and_deletes_cleanly(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    body = fast_resource(prometheus)
    body["metadata"]["name"] = NAME
    await kube.create(body)

    # Measured: the Prometheus series carry label_value(NAME), and the lookup uses the same value
    async def measured() -> dict[str, Any] | None:
        live = await resource(kube, NAME)
        status = (live or {}).get("status", {})
        dynamic = status.get("speculation", {}).get("controlPhase") == "Dynamic"
        return live if dynamic and status.get("observed", {}).get("alpha") else None

    live = await eventually(measured, timeout_s=60, interval_s=0.25, what="Dynamic with measured alpha")
    assert len(label_value(NAME)) <= 63 and label_value(NAME) != NAME
    services = {s["metadata"]["name"] for s in await kube.list("v1", "Service", "default", {})}
    assert {service_name(NAME), variant_service_name(NAME, "stable")} <= services
    assert all("." not in s for s in services)
    assert live["status"]["speculation"]["pods"]["desired"] == 2

    # Deleted: every child labelled with the derived value goes, and so does the resource
    await kube.delete("specops.dev/v1alpha1", "SpeculativeDeployment", "default", NAME)

    async def gone() -> bool | None:
        left = [
            o
            for kind in ("Deployment", "Service", "ConfigMap")
            for o in await kube.list("apps/v1" if kind == "Deployment" else "v1", kind, "default", {})
        ]
        return True if not left and await resource(kube, NAME) is None else None

    await eventually(gone, timeout_s=30, interval_s=0.25, what="children and resource deleted")
