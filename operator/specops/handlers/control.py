"""The per-resource control-loop daemon: one tick per metrics interval, stopped with the resource."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from specops.adapters.kube import KubeApiError
from specops.api.models import GROUP, PLURAL, VERSION
from specops.handlers.lifecycle import now, post_events
from specops.services.container import Services

log = logging.getLogger(__name__)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def speculation_control(
    stopped: kopf.DaemonStopped, name: str, namespace: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    assert namespace is not None  # SpeculativeDeployments are namespaced
    services: Services = memo.services
    interval_s = services.config.default_interval_s
    try:
        while not stopped:
            try:
                result = await services.control.tick(
                    namespace, name, now(), services.config.default_interval_s
                )
            except KubeApiError as error:
                log.warning("control tick of %s/%s failed: %s", namespace, name, error)
            else:
                interval_s = result.interval_s
                if result.body is None:
                    return
                post_events(result.body, result.events)
                try:
                    body_now, events = await services.drafts.tick(namespace, name, now())
                except KubeApiError as error:
                    log.warning("canary/retraining tick of %s/%s failed: %s", namespace, name, error)
                else:
                    if body_now is not None:
                        post_events(body_now, events)
            await stopped.wait(interval_s)
    finally:
        services.control.unsubscribe(body)
