"""MetricsHub registration: every tick registers again (a no-op when unchanged); the poller keeps the fastest interval."""

from __future__ import annotations

from specops.adapters.prometheus import MetricsHub

URL = "http://127.0.0.1:9"  # never reached: the pollers' first poll fails quietly


async def test_the_poller_follows_the_fastest_registered_interval() -> None:
    hub = MetricsHub()
    try:
        hub.register("a", URL, "triton", 15.0)
        hub.register("b", URL, "triton", 5.0)
        poller = hub.poller(URL, "triton")
        assert poller is not None and poller.interval_s == 5.0
        hub.register("b", URL, "triton", 30.0)  # the fastest one slowed down
        assert poller.interval_s == 15.0
        hub.register("a", URL, "triton", 15.0)  # unchanged
        assert poller.interval_s == 15.0
        hub.unregister("a")
        assert poller.interval_s == 30.0
    finally:
        await hub.close()
