"""What `kubectl specops get` and `list` show: one resource as a tree, many as kubectl's table.

The tree answers the questions a person watching a rollout asks: is it speculating and with
which draft length, is acceptance good, is the batch below break-even, is p99 within the SLO,
where is the canary and with which weights, which retraining round runs, and why the last
decisions were taken (status reasons and recent Events).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from specops.api import columns
from specops.api.conditions import find_condition
from specops.api.crd import PRINTER_COLUMNS
from specops.api.status import CanaryStatus, CanaryVariantWindow, SpeculativeDeploymentStatus
from specops.api.units import format_duration, parse_duration
from specops.domain import canary_window, perf
from specops.domain.engine_pod import LABEL_REVISION
from specops.domain.names import LABEL_VARIANT
from specops.plan import PlanInputs, inputs_from_spec, read_spec

RECENT_EVENTS = 6


@functools.lru_cache(maxsize=64)
def _break_even(
    gpu: str, target: float, draft: float, dtype: str, tp: int, max_len: int, alpha: float
) -> int | None:
    inputs = PlanInputs(gpu=gpu, target_params=target, draft_params=draft, dtype=dtype, tensor_parallel=tp)
    return perf.best_length_break_even_batch(inputs.setup_with(draft), alpha, max_len)


def break_even_batch(body: Mapping[str, Any], alpha: float | None) -> int | None:
    """The performance model's break-even batch for this resource at this alpha (None: none or unknown)."""
    if alpha is None or alpha <= 0:
        return None
    try:
        values = inputs_from_spec(read_spec(body.get("spec")))
    except ValueError:
        return None
    return _break_even(
        values["gpu"],
        values["active_params"] or values["target_params"],
        values["draft_params"],
        values["dtype"],
        values["tensor_parallel"],
        values["max_draft_len"],
        round(alpha, 3),
    )


def _seconds(text: str | None) -> float | None:
    try:
        return parse_duration(text) if text else None
    except ValueError:
        return None


def _status(body: Mapping[str, Any]) -> SpeculativeDeploymentStatus:
    """The typed status; one the schema would refuse (written by hand) shows as empty, never a crash."""
    try:
        return SpeculativeDeploymentStatus.from_wire(body.get("status"))
    except ValueError:
        return SpeculativeDeploymentStatus()


def shown_break_even(body: Mapping[str, Any], status: SpeculativeDeploymentStatus) -> tuple[int | None, str]:
    """The break-even batch the decisions use, and where it comes from.

    Once the deployment has learned its own curve (or runs from a measured profile), that is
    what the control loop acts on, so that is what the view shows; before, the roofline prior.
    """
    calibration = status.speculation.calibration
    if calibration.break_even_known and calibration.model_source != "prior":
        return calibration.break_even_batch, calibration.model_source
    return break_even_batch(body, status.observed.alpha or status.speculation.smoothed_alpha), "roofline"


def _variant(window: CanaryVariantWindow) -> dict[str, Any]:
    return {
        "alpha": window.alpha,
        "p99": None if window.p99 is None else format_duration(window.p99),
        "samples": canary_window.usable(window),
        "failedReads": window.failed,
    }


def _canary_summary(canary: CanaryStatus, spec: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    analysis = canary.last_analysis
    return {
        "phase": canary.phase,
        "draft": canary.draft.version,
        "step": canary.step,
        "steps": [s.get("weight") for s in (spec.get("canary") or {}).get("steps") or []],
        "weight": canary.weight,
        "requestedWeight": canary.requested_weight,
        "paused": canary.paused,
        "verdict": analysis.verdict if analysis else None,
        "lastAnalysis": analysis.summary if analysis else None,
        "trafficRouting": canary.traffic_routing,
        "stable": _variant(canary.window.stable) if canary.phase == "Progressing" else None,
        "canary": _variant(canary.window.canary) if canary.phase == "Progressing" else None,
        "judgedInSeconds": None
        if canary.judge_at is None or canary.phase != "Progressing"
        else max(0, round((canary.judge_at - now).total_seconds())),
        "nextWeight": canary.next_weight if canary.phase == "Progressing" else None,
    }


def summary(body: Mapping[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """The numbers the view shows, as JSON (`--json`): one flat record per resource."""
    now = now or datetime.now(UTC)
    status = _status(body)
    spec = body.get("spec") or {}
    speculation, observed, canary, retraining = (
        status.speculation,
        status.observed,
        status.canary,
        status.retraining,
    )
    alpha = observed.alpha if observed.alpha is not None else speculation.smoothed_alpha
    slo = (spec.get("slo") or {}).get("perTokenLatencyP99")
    p99_s, slo_s = observed.per_token_latency_p99, _seconds(slo)
    p99 = None if p99_s is None else format_duration(p99_s)
    ready = find_condition(status.conditions, "Ready")
    break_even, break_even_source = shown_break_even(body, status)
    return {
        "name": body["metadata"]["name"],
        "namespace": body["metadata"].get("namespace"),
        "phase": status.phase,
        "ready": ready.status if ready else None,
        "speculation": speculation.state if body.get("status") else None,
        "controlPhase": speculation.control_phase,
        "draftLength": speculation.draft_length if body.get("status") else None,
        "schedule": speculation.schedule,
        "revision": speculation.revision.digest if speculation.revision else None,
        "proposed": speculation.proposed.description if speculation.proposed else None,
        "rollout": None
        if speculation.rollout is None
        else {
            "target": speculation.rollout.target,
            "updated": speculation.rollout.updated,
            "replicas": speculation.rollout.replicas,
        },
        "endpoint": status.endpoint,
        "draft": status.draft.version,
        "specDraft": ((spec.get("draft") or {}).get("version")),
        "alpha": alpha,
        "batch": observed.batch,
        "breakEvenBatch": break_even,
        "breakEvenSource": break_even_source,
        "perTokenLatencyP99": p99,
        "sloPerTokenLatencyP99": slo,
        "withinSlo": None if p99_s is None or slo_s is None else p99_s <= slo_s,
        "measuredSpeedup": speculation.measured_speedup,
        "reason": speculation.reason,
        "message": speculation.message,
        "canary": None if canary is None else _canary_summary(canary, spec, now),
        "retraining": {
            "rounds": retraining.rounds,
            "active": retraining.active.job_name if retraining.active else None,
            "lastResult": retraining.last_result,
            "lastMessage": retraining.last_message or None,
        }
        if retraining is not None
        else None,
        "conditions": [
            {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
            for c in status.conditions
        ],
    }


# ---------------------------------------------------------------- health

OK, IN_PROGRESS, ADVICE, BAD, NEUTRAL = "ok", "progress", "advice", "bad", "neutral"
"""How a condition reads: healthy, something rolling out, advice worth a look, wrong, or nothing known."""

LEVEL_STYLE = {OK: "green", IN_PROGRESS: "cyan", ADVICE: "yellow", BAD: "red", NEUTRAL: ""}

_POLARITY: dict[str, dict[str, str]] = {
    # condition type -> status -> level (a reason below can override it)
    "Ready": {"True": OK, "False": BAD},
    "Progressing": {"True": IN_PROGRESS, "False": OK},
    "Degraded": {"True": BAD, "False": OK},
    "AcceptanceBelowSLO": {"True": BAD, "False": OK},
    "DraftMismatch": {"True": ADVICE, "False": OK},
    "DraftSizeAdvisory": {"True": ADVICE, "False": OK},
    "MetricsUnavailable": {"True": BAD, "False": OK},
    "SpeculationApplied": {"True": OK, "False": BAD},
    "CanaryRollout": {"True": IN_PROGRESS, "False": OK},
    "DraftStale": {"True": ADVICE, "False": OK},
    "DraftRejected": {"True": BAD, "False": OK},
    "CalibrationProfile": {"True": OK, "False": ADVICE},
    "Retraining": {"True": IN_PROGRESS, "False": OK},
}
_BY_REASON: dict[tuple[str, str], str] = {
    ("CanaryRollout", "TrafficSplitFailed"): BAD,
    ("CanaryRollout", "CanaryAnalysisFailed"): BAD,
    ("CanaryRollout", "CanaryMetricsUnavailable"): ADVICE,
    ("CanaryRollout", "CanaryJudgementSuspended"): ADVICE,
    ("CanaryRollout", "CanaryInconclusive"): ADVICE,
    ("CanaryRollout", "CanaryRolledBack"): BAD,
    ("CanaryRollout", "CanaryAborted"): BAD,
    ("CanaryRollout", "NotLossless"): BAD,
    ("CanaryRollout", "LosslessCheckUnrunnable"): BAD,
    ("Retraining", "RetrainingFailed"): BAD,
    ("Retraining", "RetrainingGaveUp"): BAD,
    ("Retraining", "InvalidTemplate"): BAD,
    ("Retraining", "RetrainingBackoff"): ADVICE,
}
ROLLED_BACK = frozenset({"CanaryRolledBack", "CanaryAborted", "NotLossless", "SpecDraftRejected"})


def condition_level(kind: str, status: str | None, reason: str | None) -> str:
    """The condition's health by its own polarity: Progressing=False is done, Degraded=False is fine,
    CanaryRollout=True is a canary running unless its reason says the split failed."""
    if status not in ("True", "False"):
        return NEUTRAL
    by_reason = _BY_REASON.get((kind, reason or ""))
    if by_reason is not None:
        return by_reason
    return _POLARITY.get(kind, {}).get(status, NEUTRAL)


def health(info: Mapping[str, Any]) -> tuple[str, str]:
    """One word for the resource (Healthy, Progressing, Warning, Degraded, RolledBack, Pending) and
    one line saying why, from a summary()."""
    conditions = info["conditions"]
    if not conditions:
        return "Pending", "no status yet: the operator has not reconciled it"
    leveled = [(condition_level(c["type"], c["status"], c["reason"]), c) for c in conditions]

    def said(condition: Mapping[str, Any]) -> str:
        message = f": {condition['message']}" if condition["message"] else ""
        return f"{condition['type']}={condition['status']} {condition['reason'] or ''}{message}"

    for condition in conditions:
        rolled_back = (
            condition["type"] in ("CanaryRollout", "DraftRejected") and condition["reason"] in ROLLED_BACK
        )
        if rolled_back and info["canary"] is None:
            return "RolledBack", said(condition)
    bad = [c for level, c in leveled if level == BAD]
    moving = [c for level, c in leveled if level == IN_PROGRESS]
    if bad:
        return "Degraded", said(bad[0])
    canary, retraining = info["canary"], info["retraining"] or {}
    if canary is not None:
        return "Progressing", f"canary {canary['draft']} {canary['phase']} at {canary['weight'] or 0}%"
    if retraining.get("active"):
        return "Progressing", f"retraining job {retraining['active']} running"
    if moving:
        return "Progressing", said(moving[0])
    advice = [c for level, c in leveled if level == ADVICE]
    if advice:
        return "Warning", said(advice[0])
    ready = next((c for c in conditions if c["type"] == "Ready"), None)
    if ready is None or ready["status"] != "True":
        return "Pending", said(ready) if ready else "no Ready condition yet"
    return "Healthy", f"ready, speculation {info['speculation'] or 'off'}"


HEALTH_STYLE = {
    "Healthy": "bold green",
    "Progressing": "bold cyan",
    "Warning": "bold yellow",
    "Degraded": "bold red",
    "RolledBack": "bold red",
    "Pending": "bold",
}


def _number(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _styled(ok: bool | None, text: str) -> Text:
    style = {True: "green", False: "red", None: ""}[ok]
    return Text(text, style=style)


def resource_view(
    body: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]] = (),
    now: datetime | None = None,
    *,
    all_conditions: bool = False,
    children: Sequence[Mapping[str, Any]] = (),
) -> RenderableType:
    """One SpeculativeDeployment: a health headline, a tree, its recent Events below. The tree lists
    only abnormal conditions unless `all_conditions`, and the serving objects in `children`
    (Deployments and pods) with their state."""
    now = now or datetime.now(UTC)
    info = summary(body, now)
    word, why = health(info)
    headline = Text.assemble((word, HEALTH_STYLE[word]), f"  {why}")
    tree = Tree(
        Text.assemble(
            (f"{info['namespace']}/{info['name']}", "bold"),
            f"  phase {info['phase'] or 'Pending'}",
            "  ready ",
            _styled({"True": True, "False": False}.get(info["ready"] or ""), info["ready"] or "-"),
            f"  endpoint {info['endpoint'] or '-'}",
        )
    )
    on = info["speculation"] == "on"
    speculation = tree.add(
        Text.assemble(
            "speculation ",
            _styled(on, info["speculation"] or "off"),
            f"  draft {info['draft'] or '-'}  revision {info['revision'] or '-'}",
            f"  control {info['controlPhase'] or '-'}",
            f"  measured speedup {_number(info['measuredSpeedup'], '{:.2f}x')}",
        )
    )
    speculation.add(f"schedule {info['schedule'] or '-'}")
    rollout = info["rollout"]
    if rollout is not None:
        speculation.add(f"rolling out {rollout['target']}: {rollout['updated']}/{rollout['replicas']} pods")
    if info["proposed"] and info["proposed"] != info["schedule"]:
        speculation.add(f"proposed {info['proposed']}")
    alpha = info["alpha"]
    speculation.add(f"alpha {_number(alpha)}")
    batch, break_even = info["batch"], info["breakEvenBatch"]
    below = None if batch is None or break_even is None else batch < break_even
    learned = info["breakEvenSource"] != "roofline"
    unbounded = (">1024" if learned else ">4096") if learned or alpha else "-"
    speculation.add(
        Text.assemble(
            f"batch {_number(batch, '{:.0f}')} vs break-even ",
            _styled(below, str(break_even) if break_even is not None else unbounded),
            f" ({info['breakEvenSource']})",
        )
    )
    speculation.add(
        Text.assemble(
            "p99 ",
            _styled(info["withinSlo"], info["perTokenLatencyP99"] or "-"),
            f" vs SLO {info['sloPerTokenLatencyP99'] or '-'}",
        )
    )
    if info["reason"]:
        speculation.add(
            Text.assemble("last decision ", (info["reason"], "bold"), f": {info['message'] or ''}")
        )
    canary = info["canary"]
    if canary is not None:
        step = canary["step"] if isinstance(canary["step"], int) else -1
        steps = " -> ".join(f"[{w}%]" if i == step else f"{w}%" for i, w in enumerate(canary["steps"] or []))
        node = tree.add(
            f"canary {canary['draft']} {canary['phase']}{' (paused)' if canary['paused'] else ''}"
            f"  weight {canary['weight']}%  requested steps {steps or '-'}"
        )
        requested = canary["requestedWeight"]
        asked = (
            f" ({requested}% requested)" if requested is not None and requested != canary["weight"] else ""
        )
        node.add(
            f"stable {100 - int(canary['weight'] or 0)}%  canary {int(canary['weight'] or 0)}%{asked}"
            f"  routing {canary['trafficRouting'] or '-'}  last analysis {canary['verdict'] or '-'}"
        )
        for line in canary_lines(canary):
            node.add(line)
    retraining = info["retraining"]
    if retraining is not None and (retraining["rounds"] or retraining["active"]):
        node = tree.add(
            f"retraining round {retraining['rounds']}"
            + (f"  job {retraining['active']} running" if retraining["active"] else "")
            + (f"  last {retraining['lastResult']}" if retraining["lastResult"] else "")
        )
        if retraining["lastMessage"]:
            node.add(str(retraining["lastMessage"]))
    if info["specDraft"] and info["draft"] and info["specDraft"] != info["draft"] and canary is None:
        tree.add(Text(f"spec.draft names {info['specDraft']}; draft {info['draft']} serves", style="yellow"))
    if children:
        add_children(tree, children)
    shown = [
        (level, c)
        for c in info["conditions"]
        if (level := condition_level(c["type"], c["status"], c["reason"])) in (BAD, ADVICE) or all_conditions
    ]
    hidden = len(info["conditions"]) - len(shown)
    label = "conditions" if all_conditions else "abnormal conditions"
    if hidden:
        label += f" ({hidden} more; --all shows them)"
    conditions = tree.add(label if shown or hidden else "conditions: none yet")
    if not shown and hidden:
        conditions.add(Text("none", style="green"))
    for level, condition in shown:
        conditions.add(
            Text.assemble(
                f"{condition['type']}=",
                (condition["status"] or "?", LEVEL_STYLE[level]),
                f" {condition['reason'] or ''}"
                + (f": {condition['message']}" if condition["message"] else ""),
            )
        )
    if not events:
        return Group(headline, tree)
    table = Table("AGE", "TYPE", "REASON", "MESSAGE", title="recent events", title_justify="left", box=None)
    for event in list(events)[-RECENT_EVENTS:]:
        stamp = (
            event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
        )
        table.add_row(
            columns.age(stamp, now),
            str(event.get("type", "")),
            str(event.get("reason", "")),
            str(event.get("message", "")),
        )
    return Group(headline, tree, Text(), table)


def canary_lines(canary: Mapping[str, Any]) -> list[str]:
    """The step under way: both variants' acceptance and p99 with their sample counts, the time left,
    what comes next; then the last analysis in words."""
    lines = []
    stable, tested = canary["stable"], canary["canary"]
    if stable is not None and tested is not None:

        def said(variant: Mapping[str, Any]) -> str:
            failed = f", {variant['failedReads']} failed reads" if variant["failedReads"] else ""
            return f"{_number(variant['alpha'], '{:.3f}')} (n={variant['samples']}{failed})"

        lines.append(f"acceptance canary {said(tested)} vs stable {said(stable)}")
        lines.append(f"p99 canary {tested['p99'] or '-'} vs stable {stable['p99'] or '-'}")
    left, following = canary["judgedInSeconds"], canary["nextWeight"]
    if left is not None:
        then = "promotion" if following is None or following >= 100 else f"step to {following}%"
        when = f"in {_span(left)}" if left > 0 else "at the next tick with enough samples"
        lines.append(
            f"step {int(canary['step']) + 1}/{len(canary['steps'] or [])} judged {when}; on a pass: {then}"
        )
    if canary["lastAnalysis"]:
        lines.append(f"last analysis: {canary['lastAnalysis']}")
    return lines


def _span(seconds: float) -> str:
    """A time left as kubectl writes ages: 42s, 3m12s, 2h5m."""
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60}s"
    return f"{whole // 3600}h{whole % 3600 // 60}m"


def _pod_state(pod: Mapping[str, Any]) -> tuple[str, bool | None]:
    """A pod's state as kubectl's STATUS column says it (a waiting reason wins), and whether it is ready."""
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return str(waiting["reason"]), False
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating", None
    ready = bool(statuses) and all(c.get("ready") for c in statuses)
    return str(status.get("phase") or "Pending"), ready


def add_children(tree: Tree, children: Sequence[Mapping[str, Any]]) -> None:
    """Deployments, each with its pods (matched by the variant label): ready counts, state, restarts."""
    node = tree.add("serving objects")
    deployments = [c for c in children if c.get("kind") == "Deployment"]
    pods = [c for c in children if c.get("kind") == "Pod"]
    for deployment in deployments:
        labels = deployment["metadata"].get("labels") or {}
        variant = labels.get(LABEL_VARIANT)
        status = deployment.get("status") or {}
        wanted = (deployment.get("spec") or {}).get("replicas")
        ready = int(status.get("readyReplicas") or 0)
        full = wanted is not None and ready >= int(wanted)
        branch = node.add(
            Text.assemble(
                f"Deployment {deployment['metadata']['name']} ({variant or '-'})  ready ",
                _styled(full, f"{ready}/{wanted if wanted is not None else '-'}"),
                f"  updated {int(status.get('updatedReplicas') or 0)}",
            )
        )
        for pod in pods:
            if (pod["metadata"].get("labels") or {}).get(LABEL_VARIANT) != variant:
                continue
            state, pod_ready = _pod_state(pod)
            restarts = sum(
                int(c.get("restartCount") or 0)
                for c in (pod.get("status") or {}).get("containerStatuses") or []
            )
            revision = (pod["metadata"].get("labels") or {}).get(LABEL_REVISION)
            branch.add(
                Text.assemble(
                    f"pod {pod['metadata']['name']}  ",
                    _styled(pod_ready, state),
                    f"  ready {'yes' if pod_ready else 'no'}  restarts {restarts}",
                    f"  revision {revision}" if revision else "",
                )
            )


def list_table(
    bodies: Sequence[Mapping[str, Any]],
    now: datetime | None = None,
    *,
    wide: bool = False,
    namespaces: bool = False,
) -> Table:
    """Many resources as `kubectl get sdep` prints them (the CRD's printer columns; with
    `namespaces`, a NAMESPACE column first, as `-A` does)."""
    rows = columns.table_rows(PRINTER_COLUMNS, bodies, now or datetime.now(UTC), wide=wide)
    if namespaces:
        rows = [["NAMESPACE", *rows[0]]] + [
            [str(body["metadata"].get("namespace", "")), *row]
            for body, row in zip(bodies, rows[1:], strict=True)
        ]
    table = Table(*rows[0], box=None, pad_edge=False, header_style="bold")
    for row in rows[1:]:
        table.add_row(*row)
    return table
