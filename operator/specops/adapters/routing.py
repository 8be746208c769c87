"""Traffic split between the stable and canary variants: Gateway API weights, or replica ratio.

With a Gateway API HTTPRoute, specops owns only the backendRefs of the rules that
point at the resource's stable Service; the user keeps parentRefs, matches and
filters. Without one, both variants sit behind the shared Service and the split is
the canary's share of ready replicas (the achieved weight is reported, not assumed).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from specops.api.models import SpeculativeDeploymentSpec
from specops.domain.names import CANARY, STABLE, variant_service_name
from specops.domain.traffic import achieved_weight, canary_replicas_for
from specops.ports import KubeApiError, KubePort, RouteResult, TrafficRouting

HTTPROUTE_API = "gateway.networking.k8s.io/v1"
SERVING_PORT = 8000
ROUTE_ATTEMPTS = 4
ROUTE_BACKOFF_S = 0.2


def split_backend_refs(
    rules: list[dict[str, Any]], stable: str, canary: str, weight: int
) -> list[dict[str, Any]]:
    """Rules with our backends re-weighted; rules that never named our stable Service are untouched."""
    out = copy.deepcopy(rules)
    for rule in out:
        refs = rule.get("backendRefs") or []
        ours = [ref for ref in refs if ref.get("name") in (stable, canary)]
        if not any(ref.get("name") == stable for ref in ours):
            continue
        port = next((ref.get("port") for ref in ours if ref.get("port")), SERVING_PORT)
        others = [ref for ref in refs if ref.get("name") not in (stable, canary)]
        new_refs = [{"name": stable, "port": port, "weight": 100 - weight}]
        if weight > 0:
            new_refs.append({"name": canary, "port": port, "weight": weight})
        rule["backendRefs"] = others + new_refs
    return out


def route_carries(rules: list[dict[str, Any]], stable: str, canary: str, weight: int) -> bool:
    """Whether every rule that routes to our stable Service gives the canary `weight` % of its traffic.

    Shares are compared, not raw weights: the API server defaults a missing weight to 1, and a
    lone stable backend of weight 1 already carries 100 %. Only our two backends are looked at.
    """
    found = False
    for rule in rules:
        refs = [ref for ref in rule.get("backendRefs") or [] if ref.get("name") in (stable, canary)]
        if not any(ref.get("name") == stable for ref in refs):
            continue
        found = True
        stable_weight = sum(int(ref.get("weight", 1)) for ref in refs if ref.get("name") == stable)
        canary_weight = sum(int(ref.get("weight", 1)) for ref in refs if ref.get("name") == canary)
        total = stable_weight + canary_weight
        share = 100 * canary_weight / total if total else 0.0
        if abs(share - weight) > 0.5:
            return False
    return found


class ReplicaRatioRouter:
    """Both variants behind the shared Service: the split is the canary's share of ready replicas."""

    routing: TrafficRouting = "ReplicaRatio"

    def achievable(self, weight: int, stable_replicas: int) -> int:
        if weight <= 0:
            return 0
        return achieved_weight(max(1, canary_replicas_for(weight, stable_replicas)), stable_replicas)

    async def set_weight(
        self, namespace: str, name: str, spec: SpeculativeDeploymentSpec, weight: int
    ) -> RouteResult:
        # Nothing to write: the canary service scales the canary, the shared Service selects both.
        return RouteResult(True, self.achievable(weight, spec.serving.replicas))


class GatewayApiRouter:
    """Sets real backend weights on a user's HTTPRoute (spec.canary.trafficRouting.gatewayAPI)."""

    routing: TrafficRouting = "GatewayAPI"

    def __init__(self, kube: KubePort) -> None:
        self.kube = kube

    def achievable(self, weight: int, stable_replicas: int) -> int:
        return max(0, min(100, weight))

    async def set_weight(
        self, namespace: str, name: str, spec: SpeculativeDeploymentSpec, weight: int
    ) -> RouteResult:
        gateway_api = spec.canary.traffic_routing.gateway_api
        if gateway_api is None:
            return RouteResult(False, 0, "spec.canary.trafficRouting.gatewayAPI is not set")
        return await self.set_route_weight(
            namespace,
            gateway_api.http_route,
            variant_service_name(name, STABLE),
            variant_service_name(name, CANARY),
            weight,
        )

    async def set_route_weight(
        self, namespace: str, route: str, stable_service: str, canary_service: str, weight: int
    ) -> RouteResult:
        """Write the weights, then read them back: only a route seen to carry them counts as done.

        Conflicts (someone else edited the route), 5xx answers and an unreachable API server
        are retried with a short backoff; the caller retries again at its next tick.
        """
        last_error = ""
        wrote = False
        for attempt in range(ROUTE_ATTEMPTS):
            if attempt:
                await asyncio.sleep(ROUTE_BACKOFF_S * attempt)
            try:
                live = await self.kube.get(HTTPROUTE_API, "HTTPRoute", namespace, route)
            except KubeApiError as error:
                last_error = str(error)
                continue
            if live is None:
                if weight == 0:  # nothing can send traffic to the canary through a route that is gone
                    return RouteResult(
                        True, 0, f"HTTPRoute {namespace}/{route} not found: nothing to release"
                    )
                return RouteResult(False, 0, f"HTTPRoute {namespace}/{route} not found")
            rules = list((live.get("spec") or {}).get("rules") or [])
            wanted = split_backend_refs(rules, stable_service, canary_service, weight)
            if not any(
                ref.get("name") == stable_service for r in wanted for ref in r.get("backendRefs") or []
            ):
                if weight == 0 and not any(
                    ref.get("name") == canary_service for r in rules for ref in r.get("backendRefs") or []
                ):  # a route that never named the canary sends it nothing: there is nothing to release
                    return RouteResult(
                        True, 0, f"HTTPRoute {route} names no Service {canary_service}: nothing to release"
                    )
                return RouteResult(
                    False, 0, f"HTTPRoute {route} has no backendRef to Service {stable_service}"
                )
            if route_carries(rules, stable_service, canary_service, weight):
                done = "canary backend removed" if weight == 0 else f"canary weight {weight}%"
                return RouteResult(True, weight, f"HTTPRoute {route}: {done}", changed=wrote)
            patch = {
                "metadata": {"resourceVersion": live["metadata"]["resourceVersion"]},
                "spec": {"rules": wanted},
            }
            try:
                wrote = True
                await self.kube.patch(HTTPROUTE_API, "HTTPRoute", namespace, route, patch)
            except KubeApiError as error:
                if not (error.conflict or error.status >= 500 or error.status == 0):
                    return RouteResult(False, 0, str(error))
                last_error = str(error)
            # Written (or conflicted): the next pass reads the route back and checks it.
        return RouteResult(
            False, 0, f"HTTPRoute {route}: weights not confirmed after {ROUTE_ATTEMPTS} tries ({last_error})"
        )
