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
from specops.api.status import SpeculativeDeploymentStatus
from specops.api.units import format_duration, parse_duration
from specops.domain import perf
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


def summary(body: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers the view shows, as JSON (`--json`): one flat record per resource."""
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
        "canary": None
        if canary is None
        else {
            "phase": canary.phase,
            "draft": canary.draft.version,
            "step": canary.step,
            "steps": [s.get("weight") for s in (spec.get("canary") or {}).get("steps") or []],
            "weight": canary.weight,
            "paused": canary.paused,
            "verdict": canary.last_analysis.verdict if canary.last_analysis else None,
            "trafficRouting": canary.traffic_routing,
        },
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
ROLLED_BACK = frozenset({"CanaryRolledBack", "CanaryAborted", "NotLossless"})


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
        rolled_back = condition["type"] == "CanaryRollout" and condition["reason"] in ROLLED_BACK
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
) -> RenderableType:
    """One SpeculativeDeployment: a health headline, a tree, its recent Events below. The tree lists
    only abnormal conditions unless `all_conditions`."""
    now = now or datetime.now(UTC)
    info = summary(body)
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
        node.add(
            f"stable {100 - int(canary['weight'] or 0)}%  canary {int(canary['weight'] or 0)}%"
            f"  routing {canary['trafficRouting'] or '-'}  last analysis {canary['verdict'] or '-'}"
        )
    retraining = info["retraining"]
    if retraining is not None and (retraining["rounds"] or retraining["active"]):
        node = tree.add(
            f"retraining round {retraining['rounds']}"
            + (f"  job {retraining['active']} running" if retraining["active"] else "")
            + (f"  last {retraining['lastResult']}" if retraining["lastResult"] else "")
        )
        if retraining["lastMessage"]:
            node.add(str(retraining["lastMessage"]))
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
