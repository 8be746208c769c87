"""The speculation control loop's part of one resource's tick.

gather: the latest measurement from the metrics hub (in memory; the hub's poller runs one
grouped query set for every resource) and the ready serving pods (given by the tick);
learn: the measurement becomes a calibration sample of the setting in force once it has
settled (domain.learning); decide: domain.policy.decide on the state kept in status (so a
restart resumes), its Dynamic phase predicting from the calibrated model; the measured-slowdown
guard and bounded probes may then override what the pods run (domain.learning); act: set
num_draft_tokens on every pod through Triton's model control. The tick writes status; Events
come only from decisions that change something, probes, the guard and break-even moves.

A metrics outage is a measured state: the loop holds its last decision (still pushing it
to pods that lack it, e.g. new ones), sets MetricsUnavailable, and decides nothing until
fresh data returns.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import SpeculativeDeployment, SpeculativeDeploymentSpec
from specops.api.status import CalibrationStatus, PodsApplied, SpeculativeDeploymentStatus, SplitResultStatus
from specops.domain import control_status as cs
from specops.domain import learning, profile_prior, split_fleet
from specops.domain.calibration import CalibratedModel, CalibrationState, Fit, update
from specops.domain.discovery import PodEndpoint
from specops.domain.lifecycle import EventRecord
from specops.domain.metrics import REASON_PENDING, Measurement
from specops.domain.names import STABLE
from specops.domain.perf import expected_tokens, speculative_step_time
from specops.domain.policy import (
    PRIOR_ALPHA,
    Decision,
    Observation,
    PolicyConfig,
    PolicyState,
    decide,
    slower,
    spend_switch,
    steady,
    switch_allowed,
)
from specops.domain.profile import ProfileError, ServingProfile
from specops.domain.records import replace
from specops.ports import FleetResult, KubeApiError, KubePort, MetricsSource, ModelControl

PROFILE_REFRESH_S = 60.0  # a calibration profile's ConfigMap is read again at most this often


@dataclass
class ControlResult:
    """The control loop's part of status (speculation, baseline, observed) and what to tell people."""

    status: SpeculativeDeploymentStatus
    updates: list[ConditionUpdate] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)


class ControlLoop:
    """One tick = gather, decide, act for one resource."""

    def __init__(
        self,
        metrics: MetricsSource,
        triton: ModelControl,
        *,
        retries: int = 2,
        rate_window_s: float = 60.0,
        kube: KubePort | None = None,
    ) -> None:
        self.metrics = metrics
        self.triton = triton
        self.kube = kube  # reads a calibration profile's ConfigMap
        self._profiles: dict[tuple[str, str], _LoadedProfile] = {}
        self.retries = retries
        self.rate_window_s = rate_window_s  # what one measurement spans: samples wait for it to settle
        # The policy and learning state between ticks, per resource (uid-checked). Status holds the
        # same state, written when a decision changes something and at least every refresh period,
        # so a restart resumes from status with at most that much smoothing and learning lost.
        self._memory: dict[tuple[str, str], _Memory] = {}
        # The policy's and learning's view of each resource's spec, kept while the tick hands the
        # same spec object (typed once per generation) with the same draft verdicts: building them
        # parsed the spec's sizes and durations again every tick.
        self._configs: dict[tuple[str, str], _Configs] = {}
        self.rest_ended = ""
        """Why the last ``rest`` that returned None ended the rest (one of REST_ENDS' keys)."""

    async def _profile(
        self,
        resource: SpeculativeDeployment,
        config: PolicyConfig,
        learn: learning.LearningConfig,
        now: datetime,
    ) -> _LoadedProfile | None:
        """The spec's calibration profile as prior statistics, read again at most every PROFILE_REFRESH_S;
        None when the spec names none. A missing or invalid one falls back to the roofline."""
        namespace, name = _key(resource)
        ref = resource.spec.speculation.calibration.profile
        if ref is None:
            self._profiles.pop((namespace, name), None)
            return None
        source = (ref.config_map_ref.name, ref.config_map_ref.key, resource.metadata.get("generation"))
        cached = self._profiles.get((namespace, name))
        if (
            cached is not None
            and cached.source == source
            and (now - cached.read_at).total_seconds() < PROFILE_REFRESH_S
        ):
            return cached
        where = f"ConfigMap {namespace}/{ref.config_map_ref.name} key {ref.config_map_ref.key!r}"

        def failed(reason: str, why: str) -> _LoadedProfile:
            message = f"{why}; deciding from the roofline prior instead"
            return _LoadedProfile(
                source, now, None, None, ConditionUpdate(cond.CALIBRATION_PROFILE, "False", reason, message)
            )

        if self.kube is None:
            loaded = failed(Reason.PROFILE_NOT_FOUND, f"cannot read {where}: no Kubernetes API client")
        else:
            try:
                config_map = await self.kube.get("v1", "ConfigMap", namespace, ref.config_map_ref.name)
            except KubeApiError as error:
                config_map, loaded = None, failed(Reason.PROFILE_NOT_FOUND, f"cannot read {where}: {error}")
            else:
                text = ((config_map or {}).get("data") or {}).get(ref.config_map_ref.key)
                if config_map is None:
                    loaded = failed(Reason.PROFILE_NOT_FOUND, f"{where}: the ConfigMap does not exist")
                elif not isinstance(text, str):
                    loaded = failed(Reason.PROFILE_NOT_FOUND, f"{where}: the ConfigMap has no such key")
                else:
                    try:
                        profile = ServingProfile.from_json(text)
                    except ProfileError as error:
                        loaded = failed(Reason.PROFILE_INVALID, f"{where} is not a serving profile: {error}")
                    else:
                        statistics = profile_prior.prior_statistics(
                            profile, config.setup, learn.calibration, max(1, config.max_length)
                        )
                        message = (
                            f"serving profile {profile.name!r} from {where} is the prior "
                            f"(break-even at alpha 0.8: {profile.break_even_batch(0.8) or 'none up to 1024'})"
                        )
                        condition = ConditionUpdate(
                            cond.CALIBRATION_PROFILE, "True", Reason.PROFILE_LOADED, message
                        )
                        loaded = _LoadedProfile(source, now, profile.name, statistics, condition)
        self._profiles[(namespace, name)] = loaded
        return loaded

    async def _apply_split(
        self, endpoints: Sequence[PodEndpoint], split: split_fleet.Split, probe: int, base: int
    ) -> FleetResult:
        """The probe setting on the split's pods and the decision on the others, at once."""
        probed = [e for e in endpoints if e.name in split.pods]
        others = [e for e in endpoints if e.name not in split.pods]
        results = await asyncio.gather(
            self.triton.apply_to_all(probed, num_draft_tokens=probe, retries=self.retries),
            self.triton.apply_to_all(others, num_draft_tokens=base, retries=self.retries),
        )
        return _merge(results)

    def _configs_of(
        self,
        namespace: str,
        name: str,
        spec: SpeculativeDeploymentSpec,
        draft_stale: bool,
        draft_unchecked: bool,
    ) -> tuple[PolicyConfig, learning.LearningConfig]:
        kept = self._configs.get((namespace, name))
        if kept is not None and kept.spec is spec and kept.verdicts == (draft_stale, draft_unchecked):
            return kept.policy, kept.learning
        policy = cs.policy_config(spec, draft_stale=draft_stale, draft_unchecked=draft_unchecked)
        learn = cs.learning_config(spec, self.rate_window_s)
        self._configs[(namespace, name)] = _Configs(spec, (draft_stale, draft_unchecked), policy, learn)
        return policy, learn

    def rest(
        self, resource: SpeculativeDeployment, endpoints: Sequence[PodEndpoint], now: datetime
    ) -> Measurement | None:
        """Rest instead of a tick when the last decision still holds: it was steady (see ``tick``), the
        same pods serve, the policy decides the same on the measurement now (same length and reason,
        still steady, a pending length vote allowed: its confirmation is a change, decided in
        full), and the slowdown guard counts no slow reading; where speculation runs and the
        guard is blind (no plain speed measured near the batch, or no guard), the token latency
        reads no slower (``policy.slower``); and a latency reading that appeared where the decision
        had none is looked at in full (one gone keeps the rest: nothing could judge it). A rest
        begun while the setting had not yet settled (``_Rest.settling``) ends at the first tick
        that finds it settled. The measurement it rested on (for the
        operator's gauges); None, and nothing changed, otherwise.

        Elsewhere a slower reading changes nothing a full tick would do: the guard judged it, or
        could not pair it with its load (the tick's guard could not either), or speculation is off.
        A 10 % tripwire everywhere was about one reading's noise in a noisy fleet: in the tick
        benchmark (200 resources paced as 2,000) it sent 419 of 4,000 ticks to a full tick that
        decided the same.

        Resting keeps that decision's policy state (its smoothed acceptance, evidence and switch
        credit move with time, as at every decision), learns the measurement as a tick would (the
        sample, the load it pairs with, the slowdown guard: a slowdown to count ends the rest), and
        skips the model's solve, probes, status and metrics: about a tenth of a tick.

        Three cheaper designs lost quality in the policy worlds: resting while the batch stayed
        within 10 % (it rested through the turn past break-even, where 10 % of batch is the whole
        hysteresis band); deciding again from the last full tick's state (the rest's time counted
        as evidence); pausing learning at rest (a sample needs the load held over the window, which
        only recent decisions' batches show, so the fit lost most samples)."""
        key = _key(resource)
        remembered = self._memory.get(key)
        if remembered is None or remembered.rest is None:
            self.rest_ended = "not-at-rest"
            return None
        rest = remembered.rest
        if remembered.uid != str(resource.metadata.get("uid", "")) or rest.pods != _serving(endpoints):
            self.rest_ended = "pods"
            return None  # another pod, or a restarted container (which reads its settings afresh)
        measurement = self._measure(resource, rest.draft_length, now)
        if not measurement.ok:
            self.rest_ended = "metrics"
            return None
        observation = cs.observation_from(measurement)
        seen = _seen(measurement, observation)
        if rest.tpot_s is None and seen.tpot_s is not None:
            # the latency learning reads appeared where the decision had none: looked at in full,
            # which takes it as the reading later looks compare with. One gone keeps the rest: a
            # full tick would decide the same and learn nothing from it (nor would the guard); a
            # cycle whose latency quantiles alone timed out keeps the mean, and the fleet's rests
            self.rest_ended = "latency-reading"
            return None
        # learning goes on, as in a full tick: the sample and the batch the load test pairs it
        # with, the model on the newest statistics (solved again when they hold news), the guard
        learn = rest.learn
        knowledge = learning.track_load(remembered.knowledge, seen.batch, learn, now)
        if rest.settling and learning.settled(knowledge, learn, now):
            self.rest_ended = "settled"
            return None  # the new setting now measures itself: the first settled look is in full
        knowledge = learning.observe(knowledge, seen, rest.config.setup, learn, now)
        config, fitted, fit = rest.config, rest.fitted, remembered.fit
        if learn.enabled and knowledge.calibration is not remembered.knowledge.calibration:
            # with learning the decision's model is the fit (``tick``): solved for the new sample
            model = profile_prior.model(
                config.setup, knowledge.calibration, learn.calibration, remembered.fit_prior, fit
            )
            config = replace(config, model=model, assured_model=model.assured())
            fitted = model if fitted is not None else None
            fit = model.fit
        again = decide(config, remembered.state, observation, now)
        if not (
            steady(again, voting=True, waiting=True)
            and again.num_draft_tokens == rest.draft_length
            and again.reason == rest.reason
        ):
            self.rest_ended = "decision"
            return None
        blind = fitted is None and rest.draft_length > 0  # speculating with no guard at all
        if fitted is not None:
            verdict = learning.guard(knowledge, fitted, seen, again.num_draft_tokens, learn, now)
            if verdict.fired or verdict.state.slowdown_streak:
                self.rest_ended = "slowdown"
                return None  # a slowdown to count: the tick does, from the state before this look
            knowledge, blind = verdict.state, verdict.blind
        if blind and slower(_expected_at(rest, observation), seen.tpot_s):
            self.rest_ended = "slower-unguarded"
            return None  # a slowdown the guard cannot see: the model is solved again on it in full
        if config is not rest.config:
            rest = replace(rest, config=config, fitted=fitted)
        self._memory[key] = replace(remembered, state=again.state, knowledge=knowledge, fit=fit, rest=rest)
        return measurement

    def _measure(self, resource: SpeculativeDeployment, draft_length: int, now: datetime) -> Measurement:
        """The stable variant's latest measurement, from the metrics hub's memory."""
        spec = resource.spec
        return self.metrics.lookup(
            spec.metrics.prometheus.url,
            spec.serving.backend,
            *_key(resource),
            STABLE,
            now,
            draft_length=draft_length or None,
        )

    def speculating(self, namespace: str, name: str) -> bool:
        """Whether the last full tick set the resource's pods to speculate (a new pod boots with it
        off and waits for the next tick: services/wakeups.py). What the pods were set to
        (``applied_length``), not the policy's state: a probe speculates on a resource whose policy
        has it off, and a guard holding it off leaves the policy's length in place."""
        remembered = self._memory.get((namespace, name))
        return remembered is not None and (remembered.knowledge.applied_length or 0) > 0

    def subscribe(self, resource: SpeculativeDeployment, interval_s: float) -> None:
        spec = resource.spec
        self.metrics.register(_key(resource), spec.metrics.prometheus.url, spec.serving.backend, interval_s)

    def unsubscribe(self, namespace: str, name: str) -> None:
        self.metrics.unregister((namespace, name))
        self._memory.pop((namespace, name), None)
        self._profiles.pop((namespace, name), None)
        self._configs.pop((namespace, name), None)

    async def tick(
        self,
        resource: SpeculativeDeployment,
        status: SpeculativeDeploymentStatus,
        endpoints: Sequence[PodEndpoint],
        now: datetime,
        *,
        draft_stale: bool,
        draft_unchecked: bool = False,
    ) -> ControlResult:
        spec = resource.spec
        namespace, name = _key(resource)
        current = status.speculation
        measurement = self._measure(resource, current.draft_length, now)
        updates: list[ConditionUpdate] = []
        events: list[EventRecord] = []
        # Every variant runs the same setting, so a canary is compared like for like.
        if not measurement.ok:
            # Hold: the last decision stays, pods that lack it still get it, nothing new is decided.
            held = 0 if draft_unchecked else current.draft_length
            fleet = await self.triton.apply_to_all(endpoints, num_draft_tokens=held, retries=self.retries)
            if measurement.reason != REASON_PENDING:  # the first poll after start-up is not an outage
                updates.append(
                    ConditionUpdate(
                        cond.METRICS_UNAVAILABLE,
                        "True",
                        measurement.reason or Reason.PROMETHEUS_UNREACHABLE,
                        f"{measurement.error}; holding num_draft_tokens={held}",
                    )
                )
            pods = PodsApplied(desired=fleet.desired, applied=fleet.applied)
            updates.append(cs.applied_condition(fleet.desired, fleet.applied, dict(fleet.errors), held))
            speculation = current.model_copy(update={"pods": pods})
            return ControlResult(status.model_copy(update={"speculation": speculation}), updates, events)

        config, learn = self._configs_of(namespace, name, spec, draft_stale, draft_unchecked)
        uid = str(resource.metadata.get("uid", ""))
        remembered = self._memory.get((namespace, name))
        if remembered is not None and remembered.uid == uid:
            state, knowledge, split = remembered.state, remembered.knowledge, remembered.split
            last_split = remembered.last_split
        else:
            state = cs.state_from_status(current, status.baseline, config, now)
            knowledge = learning.from_status(current.calibration, current.last_decision_time)
            split = _split_from_status(current.calibration, knowledge)
            last_split = current.calibration.last_split
        observation = cs.observation_from(measurement)
        seen = _seen(measurement, observation)
        knowledge = learning.track_load(knowledge, seen.batch, learn, now)
        if split is None:
            knowledge = learning.observe(knowledge, seen, config.setup, learn, now)
        elif (
            learn.enabled
            and learning.settled(knowledge, learn, now)
            and learning.load_held(knowledge, learn, now)
            and (now - split.since).total_seconds() >= (learn.settle_s)
        ):
            # the fleet's measurement mixes two settings: each pod is measured with its own
            split = split_fleet.measure(split, measurement.per_pod, observation.alpha)
        loaded = await self._profile(resource, config, learn, now)
        if loaded is not None:
            updates.append(loaded.condition)
        prior_stats = loaded.statistics if loaded is not None else None
        previous = None
        if remembered is not None and remembered.uid == uid and remembered.fit_prior == prior_stats:
            previous = remembered.fit
        fitted = profile_prior.model(
            config.setup, knowledge.calibration, learn.calibration, prior_stats, previous
        )
        prior_model = profile_prior.prior_model(config.setup, learn.calibration, prior_stats)
        if learn.enabled:
            config = replace(config, model=fitted, assured_model=fitted.assured())
        elif prior_stats is not None:  # no learning: the profile alone
            config = replace(config, model=prior_model)
        decision = decide(config, state, observation, now)
        smoothed = decision.state.alpha if decision.state.alpha is not None else PRIOR_ALPHA
        ending = split is not None and (
            status.canary is not None
            or knowledge.ledger.probing_until_s is None
            or now.timestamp() >= knowledge.ledger.probing_until_s
        )
        split_verdict = None
        if split is not None and ending:
            others = [p for p in measurement.per_pod if p not in split.pods]
            split_verdict = split_fleet.verdict(split, smoothed, others)
        elif split is not None and _split_decides(decision, state, config):
            decision = _held_for_split(decision, state, knowledge)
        warned: str | None = None  # the reason of a Warning Event already posted for the decision
        learns = (
            config.mode == "auto"
            and not (config.draft_stale_off or config.draft_unchecked_off)
            and decision.state.phase == "Dynamic"
        )
        learns = learns and state.phase == "Dynamic"
        if learns:
            verdict = learning.guard(knowledge, fitted, seen, decision.num_draft_tokens, learn, now)
            knowledge = verdict.state
            if verdict.fired and switch_allowed(config, decision.state, now, on=False):
                decision = _off(
                    decision,
                    now,
                    "SpeculationOffMeasuredSlowdown",
                    f"Speculation off: {verdict.evidence}.",
                    changed=True,
                    config=config,
                )
                events.append(EventRecord("Warning", decision.reason, decision.message))
                warned = decision.reason
            elif decision.num_draft_tokens > 0 and not state.enabled and learning.holds_off(knowledge, seen):
                # held off, not a switch: the switch on that `decide` made (its toggle time and
                # switch credit) never happens
                unswitched = replace(
                    decision.state,
                    last_toggle=state.last_toggle,
                    switch_credit=state.switch_credit,
                    credit_at=state.credit_at,
                )
                decision = _off(
                    replace(decision, state=unswitched),
                    now,
                    "HeldMeasuredSlowdown",
                    f"Speculation stays off: it was measured slower than plain at batch "
                    f"{knowledge.slowdown_batch or 0.0:.0f} and the batch is {seen.batch:.0f}.",
                    changed=decision.state.phase != state.phase,
                )
            step = decision.num_draft_tokens
            if (
                learn.enabled
                and step > 0
                and state.enabled
                and step != state.draft_length
                and (
                    knowledge.probe_length is not None
                    or (
                        knowledge.applied_length == state.draft_length
                        and not learning.settled(knowledge, learn, now)
                    )
                )
            ):
                # one length step per measured setting: the current one is measured before the next
                # (and none while a probe runs: the step would go unmeasured)
                decision = _hold_length(decision, state.draft_length, knowledge, learn, now, current.reason)
        acted = False
        if split_verdict is not None and learns:
            # the split's measured speedup at this very load outranks the model's prediction
            decision, acted = _split_decision(
                decision, state, config, split_verdict, now, told=warned is not None
            )
            if acted and decision.num_draft_tokens == 0:
                knowledge = replace(knowledge, slowdown_batch=split_verdict.batch)
                events.append(EventRecord("Warning", decision.reason, decision.message))
                warned = decision.reason
            elif acted:
                knowledge = replace(knowledge, slowdown_batch=None)
            else:
                events.append(
                    EventRecord(
                        "Normal",
                        "CalibrationSplitResult",
                        f"{_sentence(split_verdict.evidence())}; the decision stays "
                        f"{decision.num_draft_tokens}.",
                    )
                )
        if split_verdict is not None:
            last_split = _split_result(split_verdict, now, acted)
        alpha = decision.state.alpha if decision.state.alpha is not None else PRIOR_ALPHA
        bounds = (max(1, config.min_length), max(1, config.min_length, config.max_length))
        last = knowledge.decided_at
        dt = 0.0 if last is None else min(max(0.0, (now - last).total_seconds()), 3.0 * learn.settle_s)
        exploration = learning.explore(
            knowledge,
            fitted,
            allowed=learns and status.canary is None,
            enabled=decision.num_draft_tokens > 0,
            decided_length=decision.num_draft_tokens,
            decision_changed=decision.changed,
            alpha=alpha,
            batch=seen.batch,
            bounds=bounds,
            dt_s=dt if learns else 0.0,
            config=learn,
            now=now,
            probe_share=split.share if split is not None else 1.0,
        )
        knowledge = exploration.state
        tokens = exploration.num_draft_tokens
        names = [e.name for e in endpoints]
        if split is not None and (not exploration.probe or not set(split.pods) & set(names)):
            # the split ended: its per-pod samples join the fit (after its verdict: the split decides
            # first); every pod runs the decision again, so the fleet's samples wait to settle
            for sample in split.samples if learn.enabled else ():
                fit = update(knowledge.calibration, sample, config.setup, now.timestamp(), learn.calibration)
                knowledge = replace(knowledge, calibration=fit)
            split = None
            knowledge = replace(knowledge, applied_since=None)
            if exploration.probe:  # its probe pods are gone: end the probe with it
                ledger = replace(knowledge.ledger, probing_until_s=None, last_probe_end_s=now.timestamp())
                knowledge = replace(knowledge, ledger=ledger, probe_length=None)
                tokens = decision.num_draft_tokens
                exploration = replace(exploration, state=knowledge, num_draft_tokens=tokens, probe=False)
        started = exploration.probe and knowledge.last_probe_at == now
        if started and split is None and len(measurement.per_pod) >= split_fleet.SPLIT_MIN_PODS:
            split = split_fleet.start(names, knowledge.ledger.probes, tokens, decision.num_draft_tokens, now)
        if started:
            where = (
                f"on {', '.join(split.pods)} while the other {len(names) - len(split.pods)} pod(s) keep "
                f"{decision.num_draft_tokens} (split-fleet A/B)"
                if split is not None
                else "on every pod"
            )
            events.append(
                EventRecord(
                    "Normal",
                    "CalibrationProbe",
                    f"Probing num_draft_tokens={tokens} {where} for {learn.probes.probe_duration_s:.0f} s "
                    f"({exploration.reason}); the decision stays {decision.num_draft_tokens}.",
                )
            )
        if split is not None:
            base = decision.num_draft_tokens
            fleet = await self._apply_split(endpoints, split, tokens, base)
            knowledge = learning.applied(knowledge, base, now)
            if knowledge.applied_since is None:
                knowledge = replace(knowledge, applied_since=split.since)
            tokens_shown = base
        else:
            fleet = await self.triton.apply_to_all(endpoints, num_draft_tokens=tokens, retries=self.retries)
            if knowledge.applied_since is None:  # a split just ended: restart the settle clock
                knowledge = replace(knowledge, applied_length=None)
            knowledge = learning.applied(knowledge, tokens, now)
            tokens_shown = tokens
        computed = decision.state.phase == "Dynamic"
        break_even = prior_break_even = None
        if computed:
            break_even = learning.break_even(fitted, alpha, bounds)
            prior_break_even = learning.break_even(prior_model, alpha, bounds)
            knowledge, moved = learning.announce(knowledge, break_even, prior_break_even)
            if moved is not None:
                events.append(
                    EventRecord(
                        "Normal",
                        "CalibrationMovedBreakEven",
                        f"{moved} (alpha {alpha:.2f}, {knowledge.calibration.samples} samples, "
                        f"relative fit error {fitted.relative_fit_error() or 0.0:.3f}).",
                    )
                )
        knowledge = replace(knowledge, decided_at=now)
        at_rest = (
            steady(decision, voting=True, waiting=True)
            and not events
            and split is None
            and split_verdict is None
            and not exploration.probe
            and knowledge.probe_length is None
            and knowledge.ledger.probing_until_s is None
            and knowledge.slowdown_streak == 0
            and fleet.applied == fleet.desired
            and not fleet.errors
        )
        rest = (
            _Rest(
                observation,
                _serving(endpoints),
                tokens_shown,
                config,
                decision.reason,
                learn,
                fitted if learns else None,
                settling=learn.enabled and not learning.settled(knowledge, learn, now),
                tpot_s=seen.tpot_s,
            )
            if at_rest
            else None
        )
        self._memory[(namespace, name)] = _Memory(
            uid, decision.state, knowledge, split, last_split, fitted.fit, prior_stats, rest
        )
        updates.append(ConditionUpdate(cond.METRICS_UNAVAILABLE, "False", Reason.METRICS_OK, ""))
        updates.append(cs.acceptance_condition(decision, spec.slo.min_acceptance))
        updates.append(cs.applied_condition(fleet.desired, fleet.applied, dict(fleet.errors), tokens_shown))
        if decision.changed and decision.reason != warned:
            events.append(EventRecord("Normal", decision.reason, decision.message))
        pods = PodsApplied(desired=fleet.desired, applied=fleet.applied)
        speculation = cs.speculation_status(decision, observation, now, pods)
        calibration = learning.to_status(
            knowledge,
            fitted,
            learn,
            batch=seen.batch,
            break_even_batch=break_even,
            prior_break_even_batch=prior_break_even,
            computed=computed,
        )
        calibration = calibration.model_copy(
            update={
                **_probe_fields(current.calibration, exploration, split, last_split),
                **_prior_fields(loaded, knowledge, learn),
            }
        )
        speculation = speculation.model_copy(update={"calibration": calibration})
        if (
            exploration.probe and split is None
        ):  # state stays the decision's; draftLength is what the pods run
            speculation = speculation.model_copy(update={"draft_length": tokens})
        new_status = status.model_copy(
            update={
                "speculation": speculation,
                "baseline": cs.baseline_status(decision.state, status.baseline),
                "observed": cs.observed_status(measurement),
            }
        )
        return ControlResult(new_status, updates, events)


@dataclass(frozen=True)
class _LoadedProfile:
    """A calibration profile as last read: its prior statistics, or None when it could not be used."""

    source: tuple[object, ...]
    read_at: datetime
    name: str | None
    statistics: CalibrationState | None
    condition: ConditionUpdate


def _prior_fields(
    loaded: _LoadedProfile | None, knowledge: learning.LearningState, learn: learning.LearningConfig
) -> dict[str, object]:
    """Which prior the model starts from; the model source reads `profile` until a sample lands."""
    if loaded is None or loaded.statistics is None:
        return {"prior_source": "roofline", "profile_name": None}
    fields: dict[str, object] = {"prior_source": "profile", "profile_name": loaded.name}
    if not learn.enabled or knowledge.calibration.weight <= 0:
        fields["model_source"] = "profile"
    return fields


@dataclass(frozen=True)
class _Configs:
    """The policy and learning configurations built from one spec object and draft verdicts."""

    spec: SpeculativeDeploymentSpec
    verdicts: tuple[bool, bool]
    policy: PolicyConfig
    learning: learning.LearningConfig


@dataclass(frozen=True)
class _Rest:
    """A steady decision's inputs: while they hold, the decision need not be made again."""

    observation: Observation
    pods: tuple[tuple[str, str], ...]
    """Each serving pod's name and incarnation (`_serving`)."""
    draft_length: int
    config: PolicyConfig
    """The policy's configuration with the model the decision was made on."""
    reason: str
    learn: learning.LearningConfig
    fitted: CalibratedModel | None
    """The calibrated model the slowdown guard compares with; None where the guard does not run."""
    settling: bool = False
    """The setting in force had not yet held a rate window (`learning.settled`): the rest ends at
    the first tick that finds it settled, which is then decided in full."""
    tpot_s: float | None = None
    """The token latency at the decision, as learning reads it (``_seen``): what a look compares
    with where the slowdown guard is blind (`policy.slower`)."""


@dataclass(frozen=True)
class _Memory:
    uid: str
    state: PolicyState
    knowledge: learning.LearningState
    split: split_fleet.Split | None = None
    last_split: SplitResultStatus | None = None
    fit: Fit | None = None
    """The last tick's solve of the model, and the prior it came from: kept while the data hold no news."""
    fit_prior: CalibrationState | None = None
    rest: _Rest | None = None
    """Set when the tick ended at rest (see ControlLoop.rest)."""


SPLIT_MEASURED_SWITCHES = frozenset(
    {
        "SpeculationDisabledHighBatch",
        "SpeculationDisabledNoMeasuredGain",
        "SpeculationDisabledLowAcceptance",
        "SpeculationEnabledLowBatch",
    }
)
"""The model's own switches: what a running split measures at this very load."""


def _split_decides(decision: Decision, before: PolicyState, config: PolicyConfig) -> bool:
    """A model's switch while a split runs waits for the split's verdict (at most one probe
    duration): the split measures both settings at this load, where the model extrapolates. The
    slowdown guard, explicit batch limits and forced modes are not the model's and go through."""
    return (
        decision.state.enabled != before.enabled
        and decision.reason in SPLIT_MEASURED_SWITCHES
        and config.off_above_batch is None
        and config.on_below_batch is None
    )


def _held_for_split(decision: Decision, before: PolicyState, knowledge: learning.LearningState) -> Decision:
    """The switch the model wanted, not made: the toggle clock, switch budget and evidence stay."""
    state = replace(
        decision.state,
        enabled=before.enabled,
        draft_length=before.draft_length,
        last_toggle=before.last_toggle,
        enable_evidence=before.enable_evidence,
        evidence_at=before.evidence_at,
        switch_credit=before.switch_credit,
        credit_at=before.credit_at,
    )
    until = knowledge.ledger.probing_until_s
    ends = "" if until is None else f" until {datetime.fromtimestamp(until, UTC).strftime('%H:%M:%SZ')}"
    message = (
        f"Held for the split-fleet A/B measuring this load{ends}: its verdict comes first. "
        f"The model alone would say: {decision.message}"
    )
    length = before.draft_length if before.enabled else 0
    return Decision(state, length, "HeldForSplit", message, decision.predicted_speedup, changed=False)


def _split_decision(
    decision: Decision,
    before: PolicyState,
    config: PolicyConfig,
    verdict: split_fleet.SplitVerdict,
    now: datetime,
    *,
    told: bool = False,
) -> tuple[Decision, bool]:
    """The decision after a split's verdict: off when it measured speculation slower, on when it
    measured a clear gain while off (past the minimum dwell; explicit batch limits still rule)."""
    if config.off_above_batch is not None or config.on_below_batch is not None:
        return decision, False
    if verdict.slower:
        message = f"Speculation off: {verdict.evidence()}."
        if decision.num_draft_tokens > 0 and switch_allowed(config, before, now, on=False):
            return _off(
                decision, now, "SpeculationOffSplitSlowdown", message, changed=before.enabled, config=config
            ), True
        if decision.num_draft_tokens == 0 and decision.changed and before.enabled and not told:
            # the model switched off in this very tick: the same switch (already paid for), told
            # with the stronger evidence, the two settings measured side by side at this load
            # (unless a Warning already told it: the slowdown guard's)
            return replace(decision, reason="SpeculationOffSplitSlowdown", message=message), True
    on_above = 1.0 + config.margin + config.hysteresis
    since = None if before.last_toggle is None else (now - before.last_toggle).total_seconds()
    if (
        verdict.speedup > on_above
        and decision.num_draft_tokens == 0
        and not before.enabled
        and (since is None or since >= config.min_dwell_s)
        and switch_allowed(config, before, now, on=True)
    ):
        state = replace(
            spend_switch(config, decision.state, now),
            enabled=True,
            draft_length=verdict.on_length,
            last_toggle=now,
            enable_evidence=0.0,
            evidence_at=None,
        )
        message = f"Speculation on at draft length {verdict.on_length}: {verdict.evidence()}."
        return Decision(
            state, verdict.on_length, "SpeculationOnSplitGain", message, verdict.speedup, True
        ), True
    return decision, False


def _split_result(verdict: split_fleet.SplitVerdict, now: datetime, acted: bool) -> SplitResultStatus:
    return SplitResultStatus(
        time=now,
        on_pods=list(verdict.on_pods),
        off_pods=list(verdict.off_pods),
        on_length=verdict.on_length,
        on_tpot_seconds=round(verdict.on_tpot_s, 6),
        off_tpot_seconds=round(verdict.off_tpot_s, 6),
        batch=round(verdict.batch, 2),
        alpha=round(verdict.alpha, 4),
        measured_speedup=round(verdict.speedup, 4),
        comparisons=verdict.comparisons,
        acted=acted,
    )


def _probe_fields(
    previous: CalibrationStatus,
    exploration: learning.Exploration,
    split: split_fleet.Split | None,
    last_split: SplitResultStatus | None,
) -> dict[str, object]:
    """status.speculation.calibration's probe kind, pods and share, and the last split's result."""
    kind = previous.probe_kind
    if exploration.probe:
        kind = "split" if split is not None else "fleet"
    return {
        "probe_kind": kind,
        "probe_pods": list(split.pods) if split is not None else [],
        "probe_share": round(split.share, 4) if split is not None else (1.0 if exploration.probe else None),
        "last_split": last_split,
    }


def _split_from_status(
    shown: CalibrationStatus, knowledge: learning.LearningState
) -> split_fleet.Split | None:
    """The split in progress as status recorded it (its measurements start again)."""
    if not shown.probing or shown.probe_kind != "split" or not shown.probe_pods or shown.probe_length is None:
        return None
    since = shown.last_probe_time or knowledge.applied_since
    if since is None:
        return None
    base = knowledge.applied_length if knowledge.applied_length is not None else 0
    return split_fleet.Split(
        tuple(shown.probe_pods), shown.probe_length, base, since, shown.probe_share or 0.5
    )


def _off(
    decision: Decision,
    now: datetime,
    reason: str,
    message: str,
    *,
    changed: bool,
    config: PolicyConfig | None = None,
) -> Decision:
    """The decision turned into speculation off (the guard's verdict outranks the model's; a
    switch it makes is paid from the switch budget when `config` is given)."""
    state = decision.state if config is None else spend_switch(config, decision.state, now)
    state = replace(
        state,
        enabled=False,
        last_toggle=now if changed else decision.state.last_toggle,
        enable_evidence=0.0,
        evidence_at=now,
    )
    return Decision(state, 0, reason, message, 1.0, changed=changed)


def _hold_length(
    decision: Decision,
    length: int,
    knowledge: learning.LearningState,
    learn: learning.LearningConfig,
    now: datetime,
    reason: str | None,
) -> Decision:
    """Keep the length (and the last reason: a wait is not a new decision; the message says why)."""
    since = 0.0 if knowledge.applied_since is None else (now - knowledge.applied_since).total_seconds()
    message = (
        f"Keeping draft length {length} until it is measured ({since:.0f}/{learn.settle_s:.0f} s); "
        f"then toward {decision.num_draft_tokens}. {decision.message}"
    )
    state = replace(decision.state, draft_length=length)
    shown = reason or "BestModelledSpeedup"
    return Decision(state, length, shown, message, decision.predicted_speedup, changed=False)


def _expected_at(rest: _Rest, now: Observation) -> float | None:
    """The token latency the rest's decision read, carried to the batch and acceptance now by the
    model it was decided on (the fit where learning runs, else the roofline): what a reading now
    is compared with where the slowdown guard is blind (`policy.slower`). A heavier batch is
    slower with no slowdown at all: at 2,000 noisy pods, comparing the readings as they were
    ended 37 rests a cycle on the load's own noise."""
    then = rest.observation
    length = rest.draft_length
    if rest.tpot_s is None or length <= 0:
        return rest.tpot_s
    alpha_then = then.alpha if then.alpha is not None else PRIOR_ALPHA
    alpha_now = now.alpha if now.alpha is not None else alpha_then
    if rest.fitted is not None:
        step_then, step_now = rest.fitted.step_s(length, then.batch), rest.fitted.step_s(length, now.batch)
    else:
        setup = rest.config.setup
        step_then = speculative_step_time(setup, max(1.0, then.batch), length)
        step_now = speculative_step_time(setup, max(1.0, now.batch), length)
    per_token_then = step_then / expected_tokens(alpha_then, length)
    if per_token_then <= 0.0 or not math.isfinite(per_token_then):
        return rest.tpot_s
    return rest.tpot_s * (step_now / expected_tokens(alpha_now, length)) / per_token_then


def _seen(measurement: Measurement, observation: Observation) -> learning.Observed:
    """What learning and the slowdown guard take from a measurement: the mean token latency where
    the engine reports one, else the median."""
    tpot = measurement.tpot_mean_s if measurement.tpot_mean_s is not None else measurement.tpot_p50_s
    return learning.Observed(observation.batch, tpot, observation.alpha)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _merge(results: Sequence[FleetResult]) -> FleetResult:
    return FleetResult(
        desired=sum(r.desired for r in results),
        applied=sum(r.applied for r in results),
        changed=sum(r.changed for r in results),
        errors={pod: message for r in results for pod, message in r.errors.items()},
        results=tuple(x for r in results for x in r.results),
    )


def _serving(endpoints: Sequence[PodEndpoint]) -> tuple[tuple[str, str], ...]:
    """The pods a decision was made for, each with its incarnation (`PodEndpoint.incarnation`): a
    serving container that restarted loads its model configuration from the repository again, and
    only a full tick sets it back to the decided length. Its readiness flaps while it restarts,
    but a restart within one interval can fall between two ticks: the incarnation still tells."""
    return tuple((e.name, e.incarnation) for e in endpoints)


def _key(resource: SpeculativeDeployment) -> tuple[str, str]:
    return (str(resource.metadata["namespace"]), str(resource.metadata["name"]))
