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
from specops.api.crd import PRINTER_COLUMNS
from specops.api.models import SpeculativeDeploymentSpec
from specops.api.units import parse_duration
from specops.domain import perf
from specops.plan import PlanInputs, inputs_from_spec

RECENT_EVENTS = 6


def _conditions(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in status.get("conditions") or []}


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
        spec = SpeculativeDeploymentSpec.model_validate(body.get("spec") or {})
    except ValueError:
        return None
    values = inputs_from_spec(spec)
    return _break_even(
        values["gpu"],
        values["target_params"],
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


def summary(body: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers the view shows, as JSON (`--json`): one flat record per resource."""
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    speculation = status.get("speculation") or {}
    observed = status.get("observed") or {}
    canary = status.get("canary") or None
    retraining = status.get("retraining") or {}
    alpha = observed.get("alpha") if observed.get("alpha") is not None else speculation.get("smoothedAlpha")
    slo = (spec.get("slo") or {}).get("perTokenLatencyP99")
    p99 = observed.get("perTokenLatencyP99")
    p99_s, slo_s = _seconds(p99), _seconds(slo)
    conditions = _conditions(status)
    return {
        "name": body["metadata"]["name"],
        "namespace": body["metadata"].get("namespace"),
        "phase": status.get("phase"),
        "ready": (conditions.get("Ready") or {}).get("status"),
        "speculation": speculation.get("state"),
        "controlPhase": speculation.get("controlPhase"),
        "draftLength": speculation.get("draftLength"),
        "draft": (status.get("draft") or {}).get("version"),
        "alpha": alpha,
        "batch": observed.get("batch"),
        "breakEvenBatch": break_even_batch(body, alpha),
        "perTokenLatencyP99": p99,
        "sloPerTokenLatencyP99": slo,
        "withinSlo": None if p99_s is None or slo_s is None else p99_s <= slo_s,
        "measuredSpeedup": speculation.get("measuredSpeedup"),
        "reason": speculation.get("reason"),
        "message": speculation.get("message"),
        "canary": None
        if canary is None
        else {
            "phase": canary.get("phase"),
            "draft": (canary.get("draft") or {}).get("version"),
            "step": canary.get("step"),
            "steps": [s.get("weight") for s in (spec.get("canary") or {}).get("steps") or []],
            "weight": canary.get("weight"),
            "paused": bool(canary.get("paused")),
            "verdict": (canary.get("lastAnalysis") or {}).get("verdict"),
            "trafficRouting": canary.get("trafficRouting"),
        },
        "retraining": {
            "rounds": retraining.get("rounds", 0),
            "active": (retraining.get("active") or {}).get("jobName") if retraining.get("active") else None,
            "lastResult": retraining.get("lastResult"),
            "lastMessage": retraining.get("lastMessage"),
        }
        if retraining
        else None,
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message")} for c in conditions.values()
        ],
    }


def _number(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _styled(ok: bool | None, text: str) -> Text:
    style = {True: "green", False: "red", None: ""}[ok]
    return Text(text, style=style)


def resource_view(
    body: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = (), now: datetime | None = None
) -> RenderableType:
    """One SpeculativeDeployment as a tree, with its recent Events below."""
    now = now or datetime.now(UTC)
    info = summary(body)
    tree = Tree(
        Text.assemble(
            (f"{info['namespace']}/{info['name']}", "bold"),
            f"  phase {info['phase'] or 'Pending'}",
            "  ready ",
            _styled({"True": True, "False": False}.get(info["ready"] or ""), info["ready"] or "-"),
        )
    )
    on = info["speculation"] == "on"
    speculation = tree.add(
        Text.assemble(
            "speculation ",
            _styled(on, info["speculation"] or "off"),
            f"  draft {info['draft'] or '-'}  length {info['draftLength'] if info['draftLength'] is not None else '-'}",
            f"  control {info['controlPhase'] or '-'}",
            f"  measured speedup {_number(info['measuredSpeedup'], '{:.2f}x')}",
        )
    )
    alpha = info["alpha"]
    speculation.add(f"alpha {_number(alpha)}")
    batch, break_even = info["batch"], info["breakEvenBatch"]
    below = None if batch is None or break_even is None else batch < break_even
    speculation.add(
        Text.assemble(
            f"batch {_number(batch, '{:.0f}')} vs break-even ",
            _styled(below, str(break_even) if break_even is not None else ">4096" if alpha else "-"),
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
    conditions = tree.add("conditions")
    for condition in info["conditions"]:
        ok = {"True": True, "False": False}.get(condition["status"] or "")
        if condition["type"] in ("Degraded", "MetricsUnavailable", "DraftStale", "AcceptanceBelowSLO"):
            ok = None if ok is None else not ok
        conditions.add(
            Text.assemble(
                f"{condition['type']}=",
                _styled(ok, condition["status"] or "?"),
                f" {condition['reason'] or ''}"
                + (f": {condition['message']}" if condition["message"] else ""),
            )
        )
    if not events:
        return tree
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
    return Group(tree, Text(), table)


def list_table(
    bodies: Sequence[Mapping[str, Any]], now: datetime | None = None, *, wide: bool = False
) -> Table:
    """Many resources as `kubectl get sdep` prints them (the CRD's printer columns)."""
    rows = columns.table_rows(PRINTER_COLUMNS, bodies, now or datetime.now(UTC), wide=wide)
    table = Table(*rows[0], box=None, pad_edge=False, header_style="bold")
    for row in rows[1:]:
        table.add_row(*row)
    return table
