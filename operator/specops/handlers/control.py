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
            for posted_body, events in outcome.posts:
                post_events(posted_body, events)
                operator_metrics.observe_status(
                    namespace, name, posted_body.get("status") or {}, posted_body.get("spec")
                )
            if outcome.gone:
                return
            await stopped.wait(outcome.interval_s)
    finally:
        services.control.unsubscribe(body)
        operator_metrics.forget(namespace, name)
