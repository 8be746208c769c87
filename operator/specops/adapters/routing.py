"""Traffic split between the stable and canary variants: Gateway API weights, or replica ratio.

With a Gateway API HTTPRoute, specops owns only the backendRefs of the rules that
point at the resource's stable Service; the user keeps parentRefs, matches and
filters. Without one, both variants sit behind the shared Service and the split is
the canary's share of ready replicas (the achieved weight is reported, not assumed).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from specops.adapters.kube import KubeApiError
from specops.adapters.ports import KubePort

HTTPROUTE_API = "gateway.networking.k8s.io/v1"
SERVING_PORT = 8000


@dataclass(frozen=True)
class RouteResult:
    ok: bool
    weight: int  # canary percent actually configured
    message: str = ""


def canary_replicas_for(weight: int, stable_replicas: int) -> int:
    """Canary replicas so that canary / (canary + stable) is as close as possible to weight %."""
    if weight <= 0:
        return 0
    if weight >= 100 or stable_replicas <= 0:
        return max(1, stable_replicas)
    return max(1, math.ceil(weight * stable_replicas / (100 - weight)))


def achieved_weight(canary_replicas: int, stable_replicas: int) -> int:
    total = canary_replicas + stable_replicas
    return round(100 * canary_replicas / total) if total else 0


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


class GatewayApiRouter:
    """Sets real backend weights on a user's HTTPRoute."""

    def __init__(self, kube: KubePort) -> None:
        self.kube = kube

    async def set_weight(
        self, namespace: str, route: str, stable_service: str, canary_service: str, weight: int
    ) -> RouteResult:
        for _ in range(3):
            live = await self.kube.get(HTTPROUTE_API, "HTTPRoute", namespace, route)
            if live is None:
                return RouteResult(False, 0, f"HTTPRoute {namespace}/{route} not found")
            rules = list((live.get("spec") or {}).get("rules") or [])
            wanted = split_backend_refs(rules, stable_service, canary_service, weight)
            if not any(
                ref.get("name") == stable_service for r in wanted for ref in r.get("backendRefs") or []
            ):
                return RouteResult(
                    False, 0, f"HTTPRoute {route} has no backendRef to Service {stable_service}"
                )
            if wanted == rules:
                return RouteResult(True, weight)
            patch = {
                "metadata": {"resourceVersion": live["metadata"]["resourceVersion"]},
                "spec": {"rules": wanted},
            }
            try:
                await self.kube.patch(HTTPROUTE_API, "HTTPRoute", namespace, route, patch)
            except KubeApiError as error:
                if error.conflict:
                    continue
                return RouteResult(False, 0, str(error))
            return RouteResult(True, weight)
        return RouteResult(False, 0, f"HTTPRoute {route} kept changing")
