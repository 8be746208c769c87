"""The per-resource control-loop daemon: one tick per metrics interval, stopped with the resource."""

from __future__ import annotations

from typing import Any

import kopf

from specops.adapters import operator_metrics
from specops.api.models import GROUP, PLURAL, VERSION
from specops.handlers.lifecycle import now, post_events
from specops.services.container import Services


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def speculation_control(
    stopped: kopf.DaemonStopped, name: str, namespace: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    assert namespace is not None  # SpeculativeDeployments are namespaced
    services: Services = memo.services
    try:
        while not stopped:
            with operator_metrics.time_tick():
                outcome = await services.tick(namespace, name, now)
            if outcome.events:
                post_events(outcome.body or body, outcome.events)
            if outcome.body is not None:
                operator_metrics.observe_status(
                    namespace, name, outcome.body.get("status") or {}, outcome.body.get("spec")
                )
            if outcome.gone:
                return
            await stopped.wait(outcome.interval_s)
    finally:
        services.forget(namespace, name)
        operator_metrics.forget(namespace, name)
