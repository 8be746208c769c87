"""Canary rollout of a new draft: gather this tick's evidence, take one pure step, act.

The state machine is `domain.canary_rollout.step`; this service gathers its inputs (golden
prompts run through the engines' own API on a canary pod and on a stable pod, this tick's
samples of both variants, whether the stable variant rolled out) and carries out the actions it returns, in order. When an action fails
(a route write answered an error, say) the canary keeps its previous state, so the step is
tried again next tick and status never claims what did not happen.

Traffic goes through a router per mode (Gateway API backend weights, or replicas behind the
shared Service); the canary's replica count follows the weight in both modes.

Manual gates are annotations: specops.dev/canary-paused: "true" holds everything; the
one-shot specops.dev/canary-action: promote | abort | retry acts at the next tick and is removed
(retry: spec.draft names the draft a canary rolled back, whose canary runs again).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import API_VERSION, KIND, DraftSpec, SpeculativeDeployment
from specops.api.status import CanaryStatus, DraftSource, SpeculativeDeploymentStatus
from specops.api.units import parse_duration
from specops.domain import canary as judgement
from specops.domain import canary_rollout as rollout
from specops.domain import drafts, lossless, profile_prior
from specops.domain.calibration import CalibrationConfig
from specops.domain.discovery import PodEndpoint
from specops.domain.engines.schedule import Revision
from specops.domain.lifecycle import EventRecord
from specops.domain.names import (
    CANARY,
    HOLDBACK,
    LABEL_DEPLOYMENT,
    LABEL_VARIANT,
    STABLE,
    child_name,
    label_value,
    variant_service_name,
)
from specops.domain.render import render_children
from specops.domain.revision_step import config_from_spec, first_revision, speculating
from specops.domain.traffic import canary_replicas_for
from specops.ports import (
    MERGE_PATCH,
    EngineClient,
    KubeApiError,
    KubePort,
    MetricsSource,
    RouteResult,
    TrafficRouter,
    TrafficRouting,
)
from specops.services.outlasting import Outlasting
from specops.services.reconciler import Reconciler, stable_revision, status_change

log = logging.getLogger(__name__)

CHECK_POD_REFRESH_S = 60.0
"""A first-draft check pod whose inputs did not move is applied again at most this often."""


@dataclass(frozen=True)
class _CheckPod:
    """A first-draft check pod as last applied: what it was rendered from, when, and its objects."""

    key: tuple[object, ...]
    at: datetime
    children: list[dict[str, Any]]


PAUSED_ANNOTATION = "specops.dev/canary-paused"
ACTION_ANNOTATION = "specops.dev/canary-action"

# Used when a resource names no golden prompts: short, deterministic, varied.
DEFAULT_GOLDEN_PROMPTS = (
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three prime numbers greater than 100.",
)


@dataclass
class CanaryResult:
    """The canary's part of this tick: the status it wants, and what to tell people."""

    status: SpeculativeDeploymentStatus
    updates: list[ConditionUpdate] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    after_write: tuple[rollout.Action, ...] = ()
    finished: str | None = None  # "Promoted" | "RolledBack" when the canary ended this tick
    source: DraftSource | None = None
    evidence: str = ""  # why it ended, for retraining's record


class RouteNotReleased(Exception):
    """The user's route still sends traffic to the canary; its objects must not be deleted yet."""


class ActionFailed(Exception):
    """An action of the canary step did not take effect; the step is retried next tick."""


class CanaryService:
    def __init__(
        self,
        kube: KubePort,
        metrics: MetricsSource,
        engines: EngineClient,
        reconciler: Reconciler,
        *,
        routers: Mapping[TrafficRouting, TrafficRouter],
        gateway_api: bool,
        rate_window_s: float = 60.0,
        engine_deadline_s: float = 30.0,
        release_timeout_s: float = 300.0,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.engines = engines
        self.engine_deadline_s = engine_deadline_s
        """How long one golden prompt may take on one pod (a hung pod fails the try, not the tick forever)."""
        self.checks: Outlasting[rollout.LosslessOutcome] = Outlasting()
        """Lossless checks under way: each tick waits for one at most half its resource's interval."""
        self._check_pods: dict[tuple[str, str], _CheckPod] = {}
        """First-draft check pods as last applied: what they were rendered from, and when."""
        self.reconciler = reconciler
        self.routers = routers
        self.gateway_api = gateway_api
        self.rate_window_s = rate_window_s
        """What one measurement spans: a canary's samples start once its pods served traffic this long."""
        self.release_timeout_s = release_timeout_s
        """How long a deletion waits for a route that still names the canary before it goes on."""

    # ------------------------------------------------------------------ the tick

    async def tick(
        self,
        resource: SpeculativeDeployment,
        status: SpeculativeDeploymentStatus,
        endpoints: Sequence[PodEndpoint],
        now: datetime,
        candidate: DraftSpec | None = None,
    ) -> CanaryResult:
        """Advance the canary of one resource by at most one step.

        `candidate` is a draft from retraining waiting for its canary; spec.draft changes are
        detected by the step itself.
        """
        repaired = await self._repair_route(resource, status)
        checked = status.canary is None and status.draft.lossless_check != "Pending"
        if checked and any(e.variant == CANARY for e in endpoints):  # the first draft's check pod, done
            await self._delete_canary(resource.metadata["namespace"], resource.metadata["name"])
        inputs = await self._gather(resource, status, endpoints, now, candidate)
        result = rollout.step(inputs)
        canary = result.status.canary or status.canary
        router = self._router(canary, resource)
        draft = drafts.draft_from_status(canary.draft if canary else None, resource.spec.draft)
        try:
            for action in result.actions:
                await self._act(action, resource, router, draft)
        except ActionFailed as failure:
            update = ConditionUpdate(cond.CANARY_ROLLOUT, "True", Reason.TRAFFIC_SPLIT_FAILED, str(failure))
            return CanaryResult(status=status, updates=[update])
        stepped = result.status.model_copy(
            update={"spec_draft": rollout.spec_draft_text(resource.spec, result.status)}
        )
        return CanaryResult(
            status=stepped,
            updates=[*result.updates, rollout.spec_draft_condition(resource.spec, stepped)],
            events=[*repaired, *result.events],
            after_write=result.after_write,
            finished=result.finished,
            source=result.source,
            evidence=result.evidence,
        )

    async def _repair_route(
        self, resource: SpeculativeDeployment, status: SpeculativeDeploymentStatus
    ) -> list[EventRecord]:
        """No canary runs: no managed route may send traffic to a canary backend (an invariant, checked
        every tick, so a lost write or a hand edit never strands users on a Service that is gone)."""
        if status.canary is not None:
            return []
        router = self._router(None, resource)
        meta = resource.metadata
        result = await router.set_weight(meta["namespace"], meta["name"], resource.spec, 0)
        if not result.ok:
            # A route that names neither variant, or one being edited: the next canary reports it.
            log.debug("route of %s/%s not checked: %s", meta["namespace"], meta["name"], result.message)
            return []
        if result.changed:
            return [EventRecord("Warning", Reason.ROUTE_REPAIRED, f"{result.message} (no canary runs)")]
        return []

    async def after_write(self, resource: SpeculativeDeployment, actions: Sequence[rollout.Action]) -> None:
        """Actions that read the status just written (the stable variant rolls onto status.draft)."""
        router = self._router(None, resource)
        for action in actions:
            await self._act(action, resource, router, resource.spec.draft)

    # ------------------------------------------------------------------ gather

    async def _gather(
        self,
        resource: SpeculativeDeployment,
        status: SpeculativeDeploymentStatus,
        endpoints: Sequence[PodEndpoint],
        now: datetime,
        candidate: DraftSpec | None,
    ) -> rollout.CanaryInputs:
        spec = resource.spec
        annotations = resource.metadata.get("annotations") or {}
        action = annotations.get(ACTION_ANNOTATION)
        canary = status.canary
        router = self._router(canary, resource)
        inputs = rollout.CanaryInputs(
            spec=spec,
            status=status,
            now=now,
            routing=router.routing,
            achievable=lambda weight: router.achievable(weight, spec.serving.replicas),
            candidate=candidate,
            warm_up_s=self.rate_window_s,
            paused=annotations.get(PAUSED_ANNOTATION) == "true",
            action=action if action in ("promote", "abort", "retry") else None,
        )
        if canary is None and status.draft.lossless_check == "Pending" and not inputs.paused:
            if not rollout.first_check_due(status, now):
                return inputs  # the last try could not run: waiting before the next
            # The first draft: a check pod speculating with it (never in traffic) against a plain
            # stable pod, at temperature 0; the check pod goes once the verdict is written.
            checks = [e for e in endpoints if e.variant == CANARY and e.mode == "spec"]
            references = [e for e in endpoints if e.variant in (STABLE, HOLDBACK) and e.mode == "plain"]
            if checks and references:
                return replace(inputs, lossless=await self._lossless(resource, checks[0], references[0]))
            await self._apply_check_pod(resource, drafts.stable_draft(spec.draft, status), now)
            return inputs
        if canary is None or inputs.action in ("promote", "abort") or inputs.paused:
            return inputs
        if rollout.superseded(spec, status):
            return inputs  # spec.draft moved on: the canary ends this tick, nothing to measure
        namespace, name = resource.metadata["namespace"], resource.metadata["name"]
        if canary.phase == "LosslessCheck":
            canary_pods = [endpoint for endpoint in endpoints if endpoint.variant == CANARY]
            if not canary_pods:
                return replace(inputs, canary_missing=await self._canary_missing(namespace, name))
            stable_pods = sorted(
                (e for e in endpoints if e.variant == STABLE), key=lambda e: (e.mode != "plain", e.name)
            )
            if not stable_pods:
                return replace(
                    inputs, lossless=rollout.LosslessUnrunnable("no ready stable pod to compare with")
                )
            return replace(inputs, lossless=await self._lossless(resource, canary_pods[0], stable_pods[0]))
        if canary.phase == "Progressing":
            url, backend = spec.metrics.prometheus, spec.serving.backend
            # Each variant's series of its own draft only: never what an earlier draft left in the window.
            stable_draft = drafts.draft_identity(drafts.stable_draft(spec.draft, status))
            canary_draft = drafts.draft_identity(drafts.draft_from_status(canary.draft, spec.draft))
            # g for engines that count no verification steps (Triton, trtllm-serve, SGLang): each
            # variant's largest K, as the control loop reads it (without it no alpha, no analysis)
            ks = [
                r.schedule.max_k if r.schedule else None
                for r in (
                    stable_revision(resource),
                    canary_revision(resource, drafts.draft_from_status(canary.draft, spec.draft)),
                )
            ]
            stable = self.metrics.lookup(
                url, backend, namespace, name, STABLE, now, ks[0], draft=stable_draft
            )
            tested = self.metrics.lookup(
                url, backend, namespace, name, CANARY, now, ks[1], draft=canary_draft
            )
            missing = not tested.ok and await self._canary_missing(namespace, name)
            return replace(
                inputs,
                stable_sample=judgement.sample_from_measurement(stable),
                canary_sample=judgement.sample_from_measurement(tested),
                canary_missing=missing,
            )
        deployment = await self.kube.get("apps/v1", "Deployment", namespace, child_name(name, STABLE))
        draft = drafts.draft_from_status(canary.draft, spec.draft)
        return replace(
            inputs, stable_rolled_out=_rolled_out(deployment, spec.serving.replicas, draft.version)
        )

    async def _canary_missing(self, namespace: str, name: str) -> bool:
        return await self.kube.get("apps/v1", "Deployment", namespace, child_name(name, CANARY)) is None

    def _router(self, canary: CanaryStatus | None, resource: SpeculativeDeployment) -> TrafficRouter:
        """A running canary keeps the router it started with; a new one uses Gateway API when it can."""
        if canary is not None:
            return self.routers[canary.traffic_routing]
        if resource.spec.canary.traffic_routing.gateway_api is not None and self.gateway_api:
            return self.routers["GatewayAPI"]
        return self.routers["ReplicaRatio"]

    async def _golden_prompts(self, resource: SpeculativeDeployment) -> list[str]:
        golden = resource.spec.canary.golden_prompts
        prompts = list(golden.prompts)
        if golden.config_map_ref is not None:
            namespace = resource.metadata["namespace"]
            config_map = await self.kube.get("v1", "ConfigMap", namespace, golden.config_map_ref.name)
            text = ((config_map or {}).get("data") or {}).get(golden.config_map_ref.key, "")
            prompts += [line for line in text.splitlines() if line.strip()]
        return prompts or list(DEFAULT_GOLDEN_PROMPTS)

    async def _lossless(
        self, resource: SpeculativeDeployment, candidate: PodEndpoint, reference: PodEndpoint
    ) -> rollout.LosslessOutcome | None:
        """The lossless check of ``candidate`` against ``reference``, run in the background: the tick
        waits for it at most half the resource's interval (a slow or hung pod never holds the
        resource's decisions longer); None while it runs, and a later tick takes its verdict."""
        prompts = await self._golden_prompts(resource)
        meta = resource.metadata
        return await self.checks.within(
            (meta["namespace"], meta["name"]),
            (candidate.name, candidate.url, reference.name, reference.url, tuple(prompts)),
            lambda: self._compare(resource, candidate, reference, prompts),
            parse_duration(resource.spec.metrics.interval) / 2,
        )

    async def _compare(
        self,
        resource: SpeculativeDeployment,
        candidate: PodEndpoint,
        reference: PodEndpoint,
        prompts: Sequence[str],
    ) -> rollout.LosslessOutcome:
        """The golden prompts at temperature 0 on a speculating pod and on a reference pod (plain
        where one serves) through the engine's own API: token for token, or within the allowed
        divergence; a failure says where the outputs part."""
        spec = resource.spec
        golden = spec.canary.golden_prompts
        backend, model = spec.serving.backend, spec.target.model
        comparisons = []
        for index, prompt in enumerate(prompts):
            plain = await self.engines.generate(
                reference.url, backend, model, prompt, golden.max_tokens, self.engine_deadline_s
            )
            speculative = await self.engines.generate(
                candidate.url, backend, model, prompt, golden.max_tokens, self.engine_deadline_s
            )
            if not (plain.ok and speculative.ok):
                failed = reference if not plain.ok else candidate
                return rollout.LosslessUnrunnable(f"{failed.name}: {plain.error or speculative.error}")
            comparison = lossless.compare(plain.text, speculative.text)
            comparisons.append(comparison)
            if golden.max_divergence == 0 and not comparison.identical:
                return rollout.LosslessDiffers(
                    f"golden prompt #{index + 1} at temperature 0: {candidate.name} (revision "
                    f"{candidate.revision}) parts from {reference.name} ({reference.mode or 'reference'}): "
                    f"{comparison.describe()}"
                )
        rate = lossless.match_rate(comparisons)
        if not lossless.passes(comparisons, golden.max_divergence):
            return rollout.LosslessDiffers(
                f"token match rate {rate:.4f} over {len(comparisons)} golden prompts is below "
                f"{1 - golden.max_divergence:.4f} (canary.goldenPrompts.maxDivergence {golden.max_divergence})"
            )
        return rollout.LosslessPassed()

    # ------------------------------------------------------------------ act

    async def _act(
        self,
        action: rollout.Action,
        resource: SpeculativeDeployment,
        router: TrafficRouter,
        canary_draft: DraftSpec,
    ) -> None:
        meta = resource.metadata
        namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
        spec = resource.spec
        if isinstance(action, rollout.ApplyCanary):
            await self._apply_canary(resource, action.draft, replicas=1, traffic=action.receives_traffic)
        elif isinstance(action, rollout.SetWeight):
            result = await router.set_weight(namespace, name, spec, action.weight)
            if not result.ok:
                raise ActionFailed(result.message)
            if action.weight > 0:
                replicas = max(1, canary_replicas_for(action.weight, spec.serving.replicas))
                await self._apply_canary(resource, canary_draft, replicas=replicas, traffic=True)
        elif isinstance(action, rollout.RolloutStable):
            await self.reconciler.apply(
                render_children(
                    resource, self.reconciler.render_options, stable_revision(resource), draft=action.draft
                ),
                uid,
            )
        elif isinstance(action, rollout.DeleteCanary):
            await self._delete_canary(namespace, name)
        else:
            patch = {"metadata": {"annotations": {ACTION_ANNOTATION: None}}}
            await self.kube.patch(API_VERSION, KIND, namespace, name, patch, content_type=MERGE_PATCH)

    async def _apply_canary(
        self, resource: SpeculativeDeployment, draft: DraftSpec, *, replicas: int, traffic: bool
    ) -> None:
        children = self._render_canary(resource, draft, replicas=replicas, traffic=traffic)
        await self.reconciler.apply(children, resource.metadata.get("uid", ""))

    def _render_canary(
        self, resource: SpeculativeDeployment, draft: DraftSpec, *, replicas: int, traffic: bool
    ) -> list[dict[str, Any]]:
        return render_children(
            resource,
            self.reconciler.render_options,
            canary_revision(resource, draft),
            variant=CANARY,
            draft=draft,
            replicas=replicas,
            receives_traffic=traffic,
        )

    async def _apply_check_pod(
        self, resource: SpeculativeDeployment, draft: DraftSpec, now: datetime
    ) -> None:
        """The first draft's check pod: one canary-variant pod speculating with it, out of traffic.

        Rendered only when what it is rendered from moved (the spec's generation, the draft, the
        stable revision in status), and applied again only then or once CHECK_POD_REFRESH_S passed
        (a pod deleted by hand comes back): a fleet starting up waits for thousands of them, and
        rendering and comparing each every tick was most of a tick's CPU."""
        meta = resource.metadata
        key = (
            str(meta.get("uid", "")),
            meta.get("generation"),
            drafts.draft_identity(draft),
            resource.status.speculation.revision.digest if resource.status.speculation.revision else None,
        )
        where = (str(meta["namespace"]), str(meta["name"]))
        applied = self._check_pods.get(where)
        if applied is not None and applied.key == key:
            if (now - applied.at).total_seconds() < CHECK_POD_REFRESH_S:
                return
            children = applied.children
        else:
            children = self._render_canary(resource, draft, replicas=1, traffic=False)
        await self.reconciler.apply(children, meta.get("uid", ""))
        self._check_pods[where] = _CheckPod(key, now, children)

    async def _delete_canary(self, namespace: str, name: str) -> None:
        self._check_pods.pop((namespace, name), None)
        labels = {LABEL_DEPLOYMENT: label_value(name), LABEL_VARIANT: CANARY}
        for api_version, kind in (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap")):
            for obj in await self.kube.list(api_version, kind, namespace, labels):
                await self.kube.delete(api_version, kind, namespace, obj["metadata"]["name"])

    async def release(
        self, body: Mapping[str, Any], *, now: datetime | None = None, waited_s: float = 0.0
    ) -> list[EventRecord]:
        """On delete: take the canary out of the user's route (garbage collection cannot).

        A route that never named the canary's Service needs no release. One that still names it
        and cannot be released (it no longer names the stable Service, the write keeps failing,
        403) holds the deletion for at most ``release_timeout_s`` (``waited_s`` is how long the
        delete handler has run): meanwhile RouteNotReleased is raised and the condition
        Degraded=True/RouteNotReleased says why; past the bound the children are deleted anyway
        with a Warning Event RouteReleaseAbandoned naming the route to fix.
        """
        try:
            resource = SpeculativeDeployment.model_validate(dict(body))
        except ValueError:
            return []
        canary = resource.status.canary
        meta = resource.metadata
        gateway_api = resource.spec.canary.traffic_routing.gateway_api
        results: list[tuple[str, RouteResult]] = []
        if canary is not None:
            router = self.routers[canary.traffic_routing]
            result = await router.set_weight(meta["namespace"], meta["name"], resource.spec, 0)
            results.append((variant_service_name(meta["name"], CANARY), result))
        if resource.status.speculation.holdback is not None and gateway_api is not None:
            # a holdback's Service on the route: dropped from it like the canary's
            result = await self.reconciler.release_holdback(
                meta["namespace"], meta["name"], gateway_api.http_route
            )
            results.append((variant_service_name(meta["name"], HOLDBACK), result))
        failed = [(service, result) for service, result in results if not result.ok]
        if not failed:
            return [
                EventRecord("Normal", Reason.ROUTE_RELEASED, result.message)
                for _, result in results
                if result.message
            ]
        canary_service, result = failed[0]
        if waited_s >= self.release_timeout_s:
            return [
                EventRecord(
                    "Warning",
                    Reason.ROUTE_RELEASE_ABANDONED,
                    f"{result.message}; deleted after waiting {self.release_timeout_s:.0f} s: "
                    f"remove Service {canary_service} from the route by hand",
                )
            ]
        message = (
            f"deletion waits for the route ({result.message}); the serving objects are deleted "
            f"anyway once it has waited {self.release_timeout_s:.0f} s ({waited_s:.0f} s so far)"
        )
        update = ConditionUpdate(cond.DEGRADED, "True", Reason.ROUTE_NOT_RELEASED, message)

        def change(status: SpeculativeDeploymentStatus) -> SpeculativeDeploymentStatus:
            conditions = cond.set_condition(
                status.conditions, update, now or datetime.now(UTC), status.observed_generation
            )
            return status.model_copy(update={"conditions": conditions})

        try:
            await self.kube.update_status(
                API_VERSION, KIND, meta["namespace"], meta["name"], status_change(change), base=body
            )
        except KubeApiError as error:  # the route is the news; the condition is tried again next retry
            log.warning("could not write why %s/%s waits: %s", meta["namespace"], meta["name"], error)
        raise RouteNotReleased(message)


def canary_revision(resource: SpeculativeDeployment, draft: DraftSpec) -> Revision:
    """What canary pods run: the stable's schedule with the draft under test (a like-for-like
    comparison), or, while the stable pods run plain, the draft's first schedule from the prior."""
    config = config_from_spec(resource.spec, draft)
    stable = stable_revision(resource)
    if stable.mode == "spec" and stable.schedule is not None:
        return speculating(config, stable.schedule)
    prior = profile_prior.prior_model(config.setup, CalibrationConfig(), None)
    return first_revision(config, prior)


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
