"""Samples the SpeculativeDeployments of a running local stack into timelines (what `local demo` and
`local up` draw).

Each sample of a resource: the batch its pods are offered and the batch Prometheus-fed status
observed, the model's break-even batch at the observed acceptance, alpha, the K its stable
engines drafted and the schedule's largest K, TPOT p50/p99 from Prometheus, the TPOT plain
decoding would have given its engines at the same batch, and its canary weight. Decisions (a
new status reason, an Event about the resource) become markers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from specops.api.models import SpeculativeDeployment
from specops.api.units import parse_duration
from specops.domain import perf
from specops.domain.metrics import PROFILES, Q_TPOT_P50, Q_TPOT_P99
from specops.domain.revision_step import config_from_spec
from specops_local.sim import SimEngine
from specops_local.stack import LocalStack
from specops_local.timeline import Marker, Sample, Timeline

SAMPLE_INTERVAL_S = 0.5
TPOT_WINDOW_S = 5.0


def model_setup(body: dict[str, Any]) -> perf.ModelSetup:
    """The roofline world of a resource's spec (what the operator's prior starts from)."""
    spec = SpeculativeDeployment.model_validate(body).spec
    return config_from_spec(spec, spec.draft).setup


def serving_engines(stack: LocalStack, name: str) -> list[SimEngine]:
    """The stable variant's ready engines (a pod that is still loading drafts nothing)."""
    return [pod for pod in stack.pods(name, "stable") if pod.ready]


class TimelineRecorder:
    """One Timeline per resource of the stack's namespace, sampled every SAMPLE_INTERVAL_S.

    ``names``: record only these resources (default: every one, as it appears; ``bodies`` holds
    them all either way); ``started``: the
    monotonic time the timelines' t = 0 stands for."""

    def __init__(
        self, stack: LocalStack, *, names: Sequence[str] | None = None, started: float | None = None
    ) -> None:
        self.stack = stack
        self.names = list(names) if names is not None else None
        self.started = time.monotonic() if started is None else started
        self.timelines: dict[str, Timeline] = {name: Timeline(name) for name in self.names or ()}
        self.bodies: list[dict[str, Any]] = []
        """The resources as last sampled."""
        self.prometheus = httpx.AsyncClient(base_url=stack.prometheus.url, timeout=2.0)
        self._seen_events: set[str] = set()
        self._last_decision: dict[str, str] = {}
        self._break_even: dict[tuple[str, str, float], int | None] = {}

    async def close(self) -> None:
        await self.prometheus.aclose()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    async def run(self, after_sample: Callable[[TimelineRecorder], None] = lambda _: None) -> None:
        """Sample until cancelled; a missed sample leaves a gap in the picture, nothing else."""
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                await self.sample()
                after_sample(self)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def finish(self) -> None:
        for timeline in self.timelines.values():
            timeline.finish(self.elapsed())

    async def tpot_ms(self, backend: str, name: str) -> dict[str, float | None]:
        queries = PROFILES[backend].queries(TPOT_WINDOW_S)
        found: dict[str, float | None] = {"p50": None, "p99": None}
        for key, query in (("p50", queries[Q_TPOT_P50]), ("p99", queries[Q_TPOT_P99])):
            response = await self.prometheus.get("/api/v1/query", params={"query": query})
            for series in response.json().get("data", {}).get("result", []):
                labels = series["metric"]
                if labels.get("specops_deployment") == name and labels.get("variant") == "stable":
                    value = float(series["value"][1])
                    found[key] = value * 1e3 if value == value else None  # NaN: no tokens in the window
        return found

    def break_even(self, body: dict[str, Any], alpha: float | None) -> int | None:
        if alpha is None:
            return None
        key = (body["metadata"]["name"], body["metadata"].get("resourceVersion", ""), round(alpha, 2))
        if key not in self._break_even:
            self._break_even[key] = perf.best_length_break_even_batch(model_setup(body), round(alpha, 2), 8)
        return self._break_even[key]

    async def sample(self) -> None:
        stack = self.stack
        bodies = await stack.kube.list("specops.dev/v1alpha1", "SpeculativeDeployment", stack.namespace)
        self.bodies = sorted(bodies, key=lambda b: b["metadata"]["name"])
        t = self.elapsed()
        for body in self.bodies:
            if self.names is None or body["metadata"]["name"] in self.names:
                await self._sample_one(body, t)
        for event in await stack.kube.list("v1", "Event", stack.namespace):
            uid = event["metadata"].get("uid", "")
            timeline = self.timelines.get((event.get("involvedObject") or {}).get("name", ""))
            if uid in self._seen_events or timeline is None:
                continue
            self._seen_events.add(uid)
            timeline.markers.append(Marker(t, event.get("reason", ""), event.get("message", "")))

    async def _sample_one(self, body: dict[str, Any], t: float) -> None:
        name = body["metadata"]["name"]
        timeline = self.timelines.setdefault(name, Timeline(name))
        spec, status = body.get("spec") or {}, body.get("status") or {}
        speculation, observed = status.get("speculation") or {}, status.get("observed") or {}
        alpha = observed.get("alpha")
        engines = serving_engines(self.stack, name)
        pods = self.stack.pods(name, "stable")
        tpot = await self.tpot_ms(str((spec.get("serving") or {}).get("backend") or "triton"), name)
        timeline.samples.append(
            Sample(
                t=t,
                offered_batch=pods[0].load_point.batch if pods else None,
                observed_batch=observed.get("batch"),
                break_even_batch=self.break_even(body, alpha),
                alpha=alpha,
                k=sum(p.k for p in engines) / len(engines) if engines else None,
                schedule_k=speculation.get("draftLength"),
                tpot_p50_ms=tpot["p50"],
                tpot_p99_ms=tpot["p99"],
                plain_tpot_ms=(
                    sum(p.step_seconds(max(1, round(p.batch)), 0) for p in engines) / len(engines) * 1e3
                    if engines
                    else None
                ),
                canary_weight=float((status.get("canary") or {}).get("weight") or 0),
            )
        )
        if slo := (spec.get("slo") or {}).get("perTokenLatencyP99"):
            timeline.slo_p99_ms = parse_duration(slo) * 1e3
        decision = speculation.get("lastDecisionTime")
        if decision and decision != self._last_decision.get(name) and speculation.get("reason"):
            self._last_decision[name] = decision
            timeline.markers.append(Marker(t, speculation["reason"], speculation.get("message") or ""))
