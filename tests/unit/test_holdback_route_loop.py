"""The traffic lever through ControlLoop itself: 4 pods, one held back plain on the user's HTTPRoute,
in a world where speculating is slower than plain. The route's weights are written through a
stand-in of the Gateway API router that records them and can refuse."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from specops.api.models import SpeculativeDeployment
from specops.api.status import SpeculativeDeploymentStatus
from specops.ports import RouteResult
from specops.services.control import ControlLoop
from specops.services.reconciler import stable_plan
from tests.unit.test_control_loop import T0, World, fresh, resource, slow_world

PODS = 4


class Route:
    """The user's HTTPRoute as the router leaves it: the holdback Service's weight, or a refusal."""

    def __init__(self, failures: int = 0) -> None:
        self.weight = 0
        self.writes: list[tuple[str, str, str, int]] = []
        self.seconds: list[int] = []
        """The tick of each write."""
        self.second = 0
        self.failures = failures

    async def set_route_weight(
        self, namespace: str, route: str, stable_service: str, other_service: str, weight: int
    ) -> RouteResult:
        self.writes.append((route, stable_service, other_service, weight))
        self.seconds.append(self.second)
        if self.failures:
            self.failures -= 1
            return RouteResult(False, self.weight, "503 ServiceUnavailable: etcd timeout")
        self.weight = weight
        return RouteResult(True, weight)


def routed() -> SpeculativeDeployment:
    sdep = resource(PODS, rollout={"baseline": "60s", "soak": "20s"})
    body = sdep.model_dump(by_alias=True, exclude_none=True)
    body["spec"]["canary"]["trafficRouting"] = {"gatewayAPI": {"httpRoute": "chat-route"}}
    return SpeculativeDeployment.model_validate(body)


async def replay(route: Route, seconds: int) -> tuple[SpeculativeDeploymentStatus, list[Any], list[int], int]:
    """Tick every second; returns the last status, the Events, the second of each rollout, and the
    second the speculating pods first served."""
    sdep = routed()
    world = World(slow_world(), batch=48, replicas=PODS)
    world.revision, world.holdback = stable_plan(sdep)
    loop = ControlLoop(world, rate_window_s=2.0, routes=route)
    status, events, rolls = fresh(), [], []
    for second in range(seconds):
        world.second = route.second = second
        result = await loop.tick(
            sdep, status, world.pods(), T0 + timedelta(seconds=second), draft_stale=False
        )
        events.extend(result.events)
        status = result.status
        if result.roll_to is not None:  # the rollout completes by the next tick
            world.revision, world.holdback = result.roll_to, status.speculation.holdback is not None
            rolls.append(second)
    return status, events, rolls, 0


async def test_a_measured_slowdown_moves_the_route_weight_within_two_intervals_before_any_restart() -> None:
    route = Route()
    status, events, rolls, _ = await replay(route, 12)
    # no weight for the holdback's Service before its pod is Ready (tick 0: the pods start)
    assert route.writes[0][3] == 0 and route.seconds[0] == 0
    moved = [w for w in route.writes if w[3] > 25]
    assert moved, route.writes
    assert moved[0][:3] == ("chat-route", "llama-70b-chat-stable", "llama-70b-chat-holdback")
    moved_at = route.seconds[route.writes.index(moved[0])]
    assert moved_at <= 2  # the first reading of the speculating pods moves it (1 s intervals here)
    assert rolls[0] == 0 and all(second > moved_at for second in rolls[1:])  # before any restart
    assert any(e.reason == "TrafficMoved" and e.type == "Warning" for e in events)
    # the slowdown persisted: a plain revision followed, and the holdback left the route
    assert len(rolls) == 2 and status.speculation.revision is not None
    assert status.speculation.revision.mode == "plain" and status.speculation.holdback is None
    assert route.weight == 0 and route.writes[-1][3] == 0


async def test_a_refused_weight_is_said_once_shown_as_not_set_and_written_again() -> None:
    route = Route(failures=3)
    status, events, _, _ = await replay(route, 4)
    refused = [e for e in events if e.reason == "HoldbackWeightNotSet"]
    assert len(refused) == 1 and "chat-route" in refused[0].message and "503" in refused[0].message
    assert len(route.writes) >= 4  # tried again every tick until the route took it
    assert route.weight > 0 and status.speculation.holdback is not None
    assert status.speculation.holdback.weight == route.weight


class Services:
    """The API server as far as the holdback's Service goes: absent until ``created``."""

    def __init__(self) -> None:
        self.created = False

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert (kind, name) == ("Service", "llama-70b-chat-holdback")
        return {"metadata": {"name": name}} if self.created else None


async def test_the_holdback_joins_the_route_only_once_its_service_exists() -> None:
    sdep = routed()
    world = World(slow_world(), batch=48, replicas=PODS)
    world.revision, world.holdback = stable_plan(sdep)
    route, services = Route(), Services()
    loop = ControlLoop(world, rate_window_s=2.0, routes=route, kube=services)  # type: ignore[arg-type]
    status, events = fresh(), []
    for second in range(4):
        services.created = second >= 2  # the holdback's apply failed before its Service, once
        route.second = second
        result = await loop.tick(
            sdep, status, world.pods(), T0 + timedelta(seconds=second), draft_stale=False
        )
        events.extend(result.events)
        status = result.status
        if result.roll_to is not None:
            world.revision, world.holdback = result.roll_to, status.speculation.holdback is not None
    assert route.writes[0][3] == 0 and all(
        w[3] == 0 for w, s in zip(route.writes, route.seconds, strict=True) if s < 2
    )
    assert any(w[3] > 0 for w in route.writes)  # it joined once the Service was there
    missing = [e for e in events if e.reason == "HoldbackWeightNotSet"]
    assert len(missing) == 1 and "does not exist yet" in missing[0].message
