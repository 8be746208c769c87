"""Canary rollout of a new draft: lossless gate, stepped traffic, analysis, promotion or rollback.

One tick per metrics interval, all progress in status.canary (a restart resumes the same
step with the same samples):

1. Start: spec.draft changed (or retraining produced a draft) -> canary pods with the new
   draft, kept out of traffic (`specops.dev/traffic: hold`, canary weight 0).
2. LosslessCheck: golden prompts at temperature 0 on a canary pod, speculation on and off;
   any difference fails the canary with NotLossless before it ever receives traffic.
3. Progressing: each step sets the canary weight (Gateway API backend weights, or the
   canary's share of replicas behind the shared Service), collects one sample per tick for
   each variant, and after the step's pause asks domain.canary.analyse / next_action.
4. Promoting: all traffic to the canary, the stable variant re-rendered with the new draft
   (status.draft), and once it has rolled, traffic back to stable and canary objects removed.
   Rollback: traffic to stable, canary objects removed, the draft remembered as rejected.

Manual gates are annotations: specops.dev/canary-paused: "true" holds everything; the
one-shot specops.dev/canary-action: promote | abort acts at the next tick and is removed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from specops.adapters.kube import MERGE_PATCH
from specops.adapters.ports import KubePort, MetricsSource, ModelControl
from specops.adapters.routing import GatewayApiRouter, achieved_weight, canary_replicas_for
from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate
from specops.api.models import API_VERSION, KIND, DraftSpec, SpeculativeDeployment
from specops.api.units import parse_duration
from specops.domain import canary as judgement
from specops.domain import drafts
from specops.domain.discovery import ready_endpoints
from specops.domain.lifecycle import EventRecord
from specops.domain.render import CANARY, STABLE, child_name, render_children, variant_service_name
from specops.services.reconciler import Reconciler

log = logging.getLogger(__name__)

CANARY_CONDITION = "CanaryRollout"
PAUSED_ANNOTATION = "specops.dev/canary-paused"
ACTION_ANNOTATION = "specops.dev/canary-action"
MAX_SAMPLES = 240
MIN_SAMPLES = judgement.DEFAULT_MIN_SAMPLES
# A step whose window is still too thin after max(factor x pause, extension) is judged anyway.
MAX_BAKE_FACTOR = 4.0
MIN_BAKE_EXTENSION_S = 60.0
LOSSLESS_ATTEMPTS = 10

# Used when a resource names no golden prompts: short, deterministic, varied.
DEFAULT_GOLDEN_PROMPTS = (
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three prime numbers greater than 100.",
)


@dataclass
class CanaryTick:
    events: list[EventRecord] = field(default_factory=list)
    body: dict[str, Any] | None = None
    finished: str | None = None  # "Promoted" | "RolledBack" when the canary ended this tick
    source: str | None = None
    evidence: str = ""  # why it ended, for retraining's record


def _sample_dict(sample: judgement.Sample) -> dict[str, Any]:
    return {
        "ok": sample.ok,
        "alpha": sample.alpha,
        "p99": sample.tpot_p99_s,
        "p50": sample.tpot_p50_s,
        "tps": sample.tokens_per_s,
    }


def _sample(data: Mapping[str, Any]) -> judgement.Sample:
    return judgement.Sample(
        alpha=data.get("alpha"),
        tpot_p99_s=data.get("p99"),
        tpot_p50_s=data.get("p50"),
        tokens_per_s=data.get("tps"),
        ok=bool(data.get("ok")),
    )


class CanaryService:
    def __init__(
        self,
        kube: KubePort,
        metrics: MetricsSource,
        triton: ModelControl,
        reconciler: Reconciler,
        *,
        gateway_api: bool,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.triton = triton
        self.reconciler = reconciler
        self.router = GatewayApiRouter(kube)
        self.gateway_api = gateway_api

    # ------------------------------------------------------------------ entry point

    async def tick(
        self, namespace: str, name: str, now: datetime, candidate: DraftSpec | None = None
    ) -> CanaryTick:
        """Advance the canary of one resource by at most one step.

        `candidate` is a draft from retraining waiting for its canary; spec.draft changes are
        detected here.
        """
        body = await self.kube.get(API_VERSION, KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return CanaryTick()
        try:
            resource = SpeculativeDeployment.model_validate(body)
        except ValidationError:
            return CanaryTick(body=body)
        status = body.get("status") or {}
        if status.get("phase") in (None, "Pending", "Invalid"):
            return CanaryTick(body=body)
        canary = status.get("canary")
        if not canary:
            return await self._maybe_start(resource, body, candidate, now)
        annotations = body["metadata"].get("annotations") or {}
        action = annotations.get(ACTION_ANNOTATION)
        if action == "abort":
            await self._clear_action(namespace, name)
            return await self._rollback(
                resource, body, "CanaryAborted", "aborted by specops.dev/canary-action", now
            )
        if action == "promote":
            await self._clear_action(namespace, name)
            return await self._start_promotion(resource, body, "promoted by specops.dev/canary-action", now)
        if annotations.get(PAUSED_ANNOTATION) == "true":
            return await self._write(resource, body, {"canary": {**canary, "paused": True}}, [], now)
        if canary.get("paused"):
            canary = {**canary, "paused": False}
        phase = canary.get("phase")
        if phase == "LosslessCheck":
            return await self._lossless_check(resource, body, canary, now)
        if phase == "Progressing":
            return await self._progress(resource, body, canary, now)
        if phase == "Promoting":
            return await self._finish_promotion(resource, body, canary, now)
        return CanaryTick(body=body)

    # ------------------------------------------------------------------ start

    async def _maybe_start(
        self,
        resource: SpeculativeDeployment,
        body: dict[str, Any],
        candidate: DraftSpec | None,
        now: datetime,
    ) -> CanaryTick:
        status = body.get("status") or {}
        spec_key = drafts.draft_key(resource.spec.draft)
        source = None
        if status.get("observedSpecDraft") not in (None, spec_key) and spec_key != status.get(
            "rejectedDraft"
        ):
            draft, source = resource.spec.draft, "Spec"
        elif candidate is not None and drafts.draft_key(candidate) != status.get("rejectedDraft"):
            draft, source = candidate, "Retraining"
        if source is None:
            return CanaryTick(body=body)
        await self.reconciler.apply(
            self._canary_children(resource, draft, replicas=1, traffic=False), body["metadata"]["uid"]
        )
        canary = {
            "phase": "LosslessCheck",
            "source": source,
            "draft": drafts.draft_to_status(draft, source),
            "startedAt": cond.format_time(now),
            "step": -1,
            "weight": 0,
            "trafficRouting": self._routing(resource),
            "counters": {"failures": 0, "inconclusives": 0, "consecutiveErrors": 0},
            "losslessAttempts": 0,
        }
        patch: dict[str, Any] = {"canary": canary, "phase": "Canary"}
        if source == "Spec":
            patch["observedSpecDraft"] = spec_key
        message = (
            f"canary of draft {draft.version} ({source.lower()}) started: lossless check before any traffic"
        )
        update = ConditionUpdate(CANARY_CONDITION, "True", "CanaryStarted", message)
        tick = await self._write(resource, body, patch, [update], now)
        tick.events.append(EventRecord("Normal", "CanaryStarted", message))
        return tick

    def _routing(self, resource: SpeculativeDeployment) -> str:
        if resource.spec.canary.traffic_routing.gateway_api is not None and self.gateway_api:
            return "GatewayAPI"
        return "ReplicaRatio"

    def _canary_children(
        self, resource: SpeculativeDeployment, draft: DraftSpec, *, replicas: int, traffic: bool
    ) -> list[dict[str, Any]]:
        return render_children(
            resource,
            self.reconciler.render_options,
            variant=CANARY,
            draft=draft,
            replicas=replicas,
            receives_traffic=traffic,
        )

    # ------------------------------------------------------------------ lossless gate

    async def _golden_prompts(self, resource: SpeculativeDeployment, namespace: str) -> list[str]:
        golden = resource.spec.canary.golden_prompts
        prompts = list(golden.prompts)
        if golden.config_map_ref is not None:
            config_map = await self.kube.get("v1", "ConfigMap", namespace, golden.config_map_ref.name)
            text = ((config_map or {}).get("data") or {}).get(golden.config_map_ref.key, "")
            prompts += [line for line in text.splitlines() if line.strip()]
        return prompts or list(DEFAULT_GOLDEN_PROMPTS)

    async def _lossless_check(
        self, resource: SpeculativeDeployment, body: dict[str, Any], canary: dict[str, Any], now: datetime
    ) -> CanaryTick:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        pods = await self.kube.list(
            "v1", "Pod", namespace, {"specops.dev/deployment": name, "specops.dev/variant": CANARY}
        )
        endpoints = ready_endpoints(pods)
        if not endpoints:
            return CanaryTick(body=body)  # canary pods still starting
        endpoint = endpoints[0]
        length = min(
            resource.spec.speculation.draft_length.initial, resource.spec.target.engine.max_draft_len
        )
        max_tokens = resource.spec.canary.golden_prompts.max_tokens
        for index, prompt in enumerate(await self._golden_prompts(resource, namespace)):
            plain = await self.triton.generate(endpoint, prompt, max_tokens, num_draft_tokens=0)
            speculative = await self.triton.generate(endpoint, prompt, max_tokens, num_draft_tokens=length)
            if not (plain.ok and speculative.ok):
                attempts = int(canary.get("losslessAttempts") or 0) + 1
                if attempts >= LOSSLESS_ATTEMPTS:
                    detail = plain.message or speculative.message
                    return await self._rollback(
                        resource,
                        body,
                        "LosslessCheckFailed",
                        f"golden prompts could not be run: {detail}",
                        now,
                    )
                return await self._write(
                    resource, body, {"canary": {**canary, "losslessAttempts": attempts}}, [], now
                )
            if plain.text != speculative.text:
                evidence = (
                    f"golden prompt #{index + 1} differs with speculation on (num_draft_tokens={length}) "
                    f"vs off at temperature 0: {speculative.text[:80]!r} != {plain.text[:80]!r}"
                )
                return await self._rollback(resource, body, "NotLossless", evidence, now)
        await self.reconciler.apply(
            self._canary_children(resource, self._draft(canary, resource), replicas=1, traffic=True),
            body["metadata"]["uid"],
        )
        canary = {**canary, "phase": "Progressing", "losslessCheck": "Passed"}
        tick = await self._enter_step(resource, body, canary, 0, now)
        tick.events.insert(
            0,
            EventRecord(
                "Normal", "LosslessCheckPassed", "golden prompts identical with speculation on and off"
            ),
        )
        return tick

    # ------------------------------------------------------------------ steps

    def _draft(self, canary: Mapping[str, Any], resource: SpeculativeDeployment) -> DraftSpec:
        return drafts.draft_from_status(canary.get("draft"), resource.spec.draft)

    async def _set_traffic(
        self, resource: SpeculativeDeployment, body: dict[str, Any], canary: Mapping[str, Any], weight: int
    ) -> tuple[bool, int, str]:
        """Route `weight` % to the canary; returns (ok, achieved weight, message)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        stable_replicas = resource.spec.serving.replicas
        if canary.get("trafficRouting") == "GatewayAPI" and resource.spec.canary.traffic_routing.gateway_api:
            route = resource.spec.canary.traffic_routing.gateway_api.http_route
            result = await self.router.set_weight(
                namespace,
                route,
                variant_service_name(name, STABLE),
                variant_service_name(name, CANARY),
                weight,
            )
            replicas = (
                max(1, canary_replicas_for(weight, stable_replicas))
                if weight < 100
                else max(1, stable_replicas)
            )
            await self._scale_canary(resource, body, canary, replicas)
            return result.ok, result.weight, result.message
        replicas = canary_replicas_for(weight, stable_replicas)
        await self._scale_canary(resource, body, canary, max(1, replicas))
        return True, achieved_weight(max(1, replicas), stable_replicas), ""

    async def _scale_canary(
        self, resource: SpeculativeDeployment, body: dict[str, Any], canary: Mapping[str, Any], replicas: int
    ) -> None:
        children = self._canary_children(
            resource, self._draft(canary, resource), replicas=replicas, traffic=True
        )
        await self.reconciler.apply(children, body["metadata"]["uid"])

    async def _enter_step(
        self,
        resource: SpeculativeDeployment,
        body: dict[str, Any],
        canary: dict[str, Any],
        step: int,
        now: datetime,
    ) -> CanaryTick:
        weight = resource.spec.canary.steps[step].weight
        ok, achieved, message = await self._set_traffic(resource, body, canary, weight)
        if not ok:
            update = ConditionUpdate(CANARY_CONDITION, "True", "TrafficSplitFailed", message)
            return await self._write(resource, body, {"canary": canary}, [update], now)
        canary = {
            **canary,
            "step": step,
            "weight": achieved,
            "requestedWeight": weight,
            "stepStartedAt": cond.format_time(now),
            "samples": {"stable": [], "canary": []},
        }
        text = f"step {step + 1}/{len(resource.spec.canary.steps)}: canary weight {achieved}% ({canary['trafficRouting']})"
        update = ConditionUpdate(CANARY_CONDITION, "True", "CanaryProgressing", text)
        tick = await self._write(resource, body, {"canary": canary}, [update], now)
        tick.events.append(EventRecord("Normal", "CanaryStepStarted", text))
        return tick

    async def _progress(
        self, resource: SpeculativeDeployment, body: dict[str, Any], canary: dict[str, Any], now: datetime
    ) -> CanaryTick:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        spec = resource.spec
        samples = canary.get("samples") or {"stable": [], "canary": []}
        for variant in (STABLE, CANARY):
            measurement = self.metrics.lookup(
                spec.metrics.prometheus.url, spec.serving.backend, namespace, name, variant, now
            )
            samples[variant] = [
                *samples.get(variant, []),
                _sample_dict(judgement.sample_from_measurement(measurement)),
            ][-MAX_SAMPLES:]
        canary = {**canary, "samples": samples}
        step = int(canary.get("step") or 0)
        pause_s = parse_duration(spec.canary.steps[step].pause)
        step_started = cond.parse_time(canary.get("stepStartedAt")) or now
        elapsed_s = (now - step_started).total_seconds()
        if elapsed_s < pause_s:
            return await self._write(resource, body, {"canary": canary}, [], now)
        canary_window = _warmed_up([_sample(s) for s in samples[CANARY]])
        stable_window = _warmed_up([_sample(s) for s in samples[STABLE]])
        healthy_now = bool(canary_window and canary_window[-1].ok and stable_window and stable_window[-1].ok)
        if (
            healthy_now
            and min(_usable(canary_window), _usable(stable_window)) < MIN_SAMPLES
            and elapsed_s < max(MAX_BAKE_FACTOR * pause_s, MIN_BAKE_EXTENSION_S)
        ):
            # New canary pods are scraped a few intervals late: bake on rather than judge thin evidence.
            return await self._write(resource, body, {"canary": canary}, [], now)

        baseline = (body.get("status") or {}).get("baseline") or {}
        baseline_p50 = (
            parse_duration(baseline["perTokenLatencyP50"]) if baseline.get("perTokenLatencyP50") else None
        )
        slo = parse_duration(spec.slo.per_token_latency_p99) if spec.slo.per_token_latency_p99 else None
        verdict, evidence = judgement.analyse(
            canary_window,
            stable_window,
            confidence=spec.canary.analysis.confidence,
            slo_p99_s=slo,
            baseline_p50_s=baseline_p50,
        )
        counters_data = canary.get("counters") or {}
        counters = judgement.CanaryCounters(
            failures=int(counters_data.get("failures", 0)),
            inconclusives=int(counters_data.get("inconclusives", 0)),
            consecutive_errors=int(counters_data.get("consecutiveErrors", 0)),
        )
        action, counters, reason = judgement.next_action(verdict, counters, spec.canary.analysis)
        canary = {
            **canary,
            "counters": {
                "failures": counters.failures,
                "inconclusives": counters.inconclusives,
                "consecutiveErrors": counters.consecutive_errors,
            },
            "lastAnalysis": {
                "verdict": str(verdict.value),
                "reason": reason,
                "pValue": None if evidence.p_value is None else round(evidence.p_value, 4),
                "canaryAlpha": evidence.canary_alpha,
                "stableAlpha": evidence.stable_alpha,
                "summary": evidence.summary,
                "at": cond.format_time(now),
            },
        }
        if action == "rollback":
            return await self._rollback(resource, body, reason, evidence.summary, now, canary=canary)
        if action == "advance":
            # The last step, or a 100 % step (nothing left to compare against), ends in promotion.
            if step + 1 >= len(spec.canary.steps) or spec.canary.steps[step + 1].weight >= 100:
                return await self._start_promotion(resource, body, evidence.summary, now, canary=canary)
            tick = await self._enter_step(resource, body, canary, step + 1, now)
            tick.events.insert(0, EventRecord("Normal", reason, evidence.summary))
            return tick
        if action == "hold":
            canary = {
                **canary,
                "stepStartedAt": cond.format_time(now),
                "samples": {"stable": [], "canary": []},
            }
            update = ConditionUpdate(CANARY_CONDITION, "True", reason, evidence.summary)
            tick = await self._write(resource, body, {"canary": canary}, [update], now)
            tick.events.append(EventRecord("Warning", reason, evidence.summary))
            return tick
        # pause: metrics unavailable; judge again next tick, never advance or roll back
        update = ConditionUpdate(CANARY_CONDITION, "True", reason, evidence.summary)
        return await self._write(resource, body, {"canary": canary}, [update], now)

    # ------------------------------------------------------------------ endings

    async def _start_promotion(
        self,
        resource: SpeculativeDeployment,
        body: dict[str, Any],
        evidence: str,
        now: datetime,
        canary: dict[str, Any] | None = None,
    ) -> CanaryTick:
        canary = dict(canary or (body.get("status") or {}).get("canary") or {})
        await self._set_traffic(resource, body, canary, 100)
        draft = self._draft(canary, resource)
        canary = {**canary, "phase": "Promoting", "weight": 100, "promotionEvidence": evidence}
        patch = {"canary": canary, "draft": drafts.draft_to_status(draft, str(canary.get("source", "Spec")))}
        update = ConditionUpdate(
            CANARY_CONDITION, "True", "CanaryPromoting", f"rolling stable onto draft {draft.version}"
        )
        tick = await self._write(resource, body, patch, [update], now)
        if tick.body is not None:
            await self.reconciler.apply(
                self.reconciler.render_stable(resource, tick.body), body["metadata"]["uid"]
            )
        return tick

    async def _finish_promotion(
        self, resource: SpeculativeDeployment, body: dict[str, Any], canary: dict[str, Any], now: datetime
    ) -> CanaryTick:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        draft = self._draft(canary, resource)
        await self.reconciler.apply(self.reconciler.render_stable(resource, body), body["metadata"]["uid"])
        deployment = await self.kube.get("apps/v1", "Deployment", namespace, child_name(name, STABLE))
        if not _rolled_out(deployment, resource.spec.serving.replicas, draft.version):
            return CanaryTick(body=body)
        await self._set_traffic(resource, body, canary, 0)
        await self._delete_canary(namespace, name)
        message = f"draft {draft.version} promoted: {canary.get('promotionEvidence', '')}".strip()
        update = ConditionUpdate(CANARY_CONDITION, "False", "CanaryPromoted", message)
        patch = {"canary": None, "phase": self._serving_phase(body)}
        tick = await self._write(resource, body, patch, [update], now)
        tick.events.append(EventRecord("Normal", "CanaryPromoted", message))
        tick.finished, tick.source, tick.evidence = "Promoted", str(canary.get("source")), message
        return tick

    async def _rollback(
        self,
        resource: SpeculativeDeployment,
        body: dict[str, Any],
        reason: str,
        evidence: str,
        now: datetime,
        canary: dict[str, Any] | None = None,
    ) -> CanaryTick:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        canary = dict(canary or (body.get("status") or {}).get("canary") or {})
        if canary.get("trafficRouting") == "GatewayAPI" and resource.spec.canary.traffic_routing.gateway_api:
            await self.router.set_weight(
                namespace,
                resource.spec.canary.traffic_routing.gateway_api.http_route,
                variant_service_name(name, STABLE),
                variant_service_name(name, CANARY),
                0,
            )
        await self._delete_canary(namespace, name)
        draft = self._draft(canary, resource)
        message = f"draft {draft.version} rolled back ({reason}): {evidence}"
        update = ConditionUpdate(CANARY_CONDITION, "False", "CanaryRolledBack", message[:1000])
        patch = {
            "canary": None,
            "phase": self._serving_phase(body),
            "rejectedDraft": drafts.draft_key(draft),
            "lastCanary": {
                "draft": draft.version,
                "result": "RolledBack",
                "reason": reason,
                "evidence": evidence[:500],
            },
        }
        tick = await self._write(resource, body, patch, [update], now)
        tick.events.append(EventRecord("Warning", "CanaryRolledBack", message[:1000]))
        tick.finished, tick.source, tick.evidence = "RolledBack", str(canary.get("source")), message
        return tick

    async def release(self, body: Mapping[str, Any]) -> list[EventRecord]:
        """On delete: take the canary out of the user's HTTPRoute (garbage collection cannot)."""
        canary = (body.get("status") or {}).get("canary") or {}
        if canary.get("trafficRouting") != "GatewayAPI":
            return []
        try:
            resource = SpeculativeDeployment.model_validate(dict(body))
        except ValidationError:
            return []
        routing = resource.spec.canary.traffic_routing.gateway_api
        if routing is None:
            return []
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        result = await self.router.set_weight(
            namespace,
            routing.http_route,
            variant_service_name(name, STABLE),
            variant_service_name(name, CANARY),
            0,
        )
        if not result.ok:
            return [EventRecord("Warning", "RouteNotReleased", result.message)]
        return [
            EventRecord("Normal", "RouteReleased", f"HTTPRoute {routing.http_route}: canary backend removed")
        ]

    async def _delete_canary(self, namespace: str, name: str) -> None:
        labels = {"specops.dev/deployment": name, "specops.dev/variant": CANARY}
        for api_version, kind in (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap")):
            for obj in await self.kube.list(api_version, kind, namespace, labels):
                await self.kube.delete(api_version, kind, namespace, obj["metadata"]["name"])

    async def _clear_action(self, namespace: str, name: str) -> None:
        patch = {"metadata": {"annotations": {ACTION_ANNOTATION: None}}}
        await self.kube.patch(API_VERSION, KIND, namespace, name, patch, content_type=MERGE_PATCH)

    @staticmethod
    def _serving_phase(body: Mapping[str, Any]) -> str:
        speculation = ((body.get("status") or {}).get("speculation")) or {}
        return str(speculation.get("controlPhase") or "Baseline")

    # ------------------------------------------------------------------ status

    async def _write(
        self,
        resource: SpeculativeDeployment,
        body: dict[str, Any],
        patch: dict[str, Any],
        updates: Sequence[ConditionUpdate],
        now: datetime,
    ) -> CanaryTick:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        generation = int(body["metadata"].get("generation") or 1)
        expected = ((body.get("status") or {}).get("canary") or {}).get("startedAt")

        def mutate(live: dict[str, Any]) -> dict[str, Any] | None:
            status = live.get("status") or {}
            if ((status.get("canary") or {}).get("startedAt")) != expected:
                return None  # another writer moved the canary on meanwhile
            out = {key: value for key, value in patch.items() if status.get(key) != value}
            conditions = list(status.get("conditions") or [])
            new_conditions = cond.set_conditions(conditions, list(updates), now, generation)
            if new_conditions != conditions:
                out["conditions"] = new_conditions
            return out or None

        written = await self.kube.update_status(API_VERSION, KIND, namespace, name, mutate)
        return CanaryTick(body=written or body)


def _warmed_up(samples: list[judgement.Sample]) -> list[judgement.Sample]:
    """Drop the not-ok samples before a variant's first ok one: new pods' series are not scraped yet.

    Later gaps stay in the window, so an outage still reads as an outage.
    """
    for index, sample in enumerate(samples):
        if sample.ok:
            return samples[index:]
    return samples


def _usable(samples: list[judgement.Sample]) -> int:
    return sum(1 for sample in samples if sample.ok and sample.alpha is not None)


def _rolled_out(deployment: Mapping[str, Any] | None, replicas: int, draft_version: str) -> bool:
    if deployment is None:
        return False
    status = deployment.get("status") or {}
    labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
    return (
        labels.get("specops.dev/draft-version") == draft_version
        and int(status.get("observedGeneration") or 0) >= int(deployment["metadata"].get("generation") or 0)
        and int(status.get("updatedReplicas") or 0) >= replicas
        and int(status.get("readyReplicas") or 0) >= replicas
    )
