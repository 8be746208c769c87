"""The local demo: apply the two examples, watch their revisions roll out, push one past break-even and back.

Everything runs on this machine: the emulated Kubernetes API, Debian's Prometheus scraping
simulated serving engines every second (``--backend``: Triton's LLM API model by default,
trtllm-serve, vLLM or SGLang; each started from the very args and config files specops renders,
ready a couple of seconds after it starts), and the real operator (production handlers).
The demo is a list of scenes; each is ``async def scene_xxx(demo: Demo) -> None`` that prints a
heading and adds lines to its summary. Append a function to ``SCENES`` to add one.

While it runs, a live view (rich) shows the scene, the resources' table and the last lines; a
recorder samples the dense resource every half second. At the end it draws the timeline
(``specops_local.timeline``: PNG and a self-contained HTML page), prints where, and prints a
summary per scene.

Exit status: 0 when the configuration revisions rolled out pod by pod (plain for the baseline,
then a speculating schedule) and the engines' schedule gave K=0 past break-even and K>0 again
below it, 1 when something did not happen in time (the message says what), 2 when Prometheus is
not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, cast

import kmock
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from specops.adapters.routing import achieved_weight, canary_replicas_for
from specops.api import columns
from specops.api.crd import build_crd
from specops.api.models import API_VERSION, BACKENDS, KIND
from specops.domain import perf
from specops.domain.learning import settle_seconds
from specops.domain.metrics import rate_window_s
from specops.views import list_table
from specops_local.recorder import TimelineRecorder, model_setup, serving_engines
from specops_local.serving import DraftBehaviour
from specops_local.sim import LoadPoint, SimEngine
from specops_local.stack import (
    RESTART_S,
    LocalStack,
    fast_resource,
    interrupt_cancels,
    local_stack,
    log_to_file,
)
from specops_local.timeline import SceneSpan, Timeline, render_html, render_png

DENSE = "llama-70b-chat"
EXAMPLES = (("dense-70b-7b.yaml", DENSE), ("moe-expert-distilled.yaml", "qwen3-moe"))
ALPHA = 0.8
LOW = LoadPoint(batch=16, alpha=ALPHA)
# Offered requests per pod past break-even (~251 for 70B/7B at alpha 0.8); the engine runs at most
# 256 at once and queues the rest.
HIGH = LoadPoint(batch=300, alpha=ALPHA)
# Draft versions the simulated pods know: v3 is in service, v4 is better (the canary scene), and the
# draft retrained for target 2026-11-15 (its version is derived by the operator) is better still.
RETRAINED = "v4-rt1-2026-11-15"
DRAFTS = {
    "v3": DraftBehaviour(alpha=ALPHA),
    "v4": DraftBehaviour(alpha=0.88),
    RETRAINED: DraftBehaviour(alpha=0.92),
}
TRAIN_S = 2.0
"""How long the simulated training Job of the retraining scene runs."""
CANARY_WEIGHTS = (25, 50)
FAST_CANARY = {
    "steps": [*({"weight": w, "pause": "6s"} for w in CANARY_WEIGHTS), {"weight": 100, "pause": "1s"}],
    "goldenPrompts": {
        "prompts": ["What is the capital of France?", "Write a haiku about GPUs."],
        "maxTokens": 32,
    },
}
REVISION_REASONS = ("BaselineRecorded", "RevisionProposed", "MeasuredSlowdown")
"""Events of a revision change (each one a rollout of the stable pods)."""


class DemoFailed(Exception):
    """Something the demo shows did not happen in time; the message says what and what was seen."""


@dataclass(frozen=True)
class Pace:
    """How long the demo lets each phase run; --fast shortens what only serves the eye."""

    baseline: str = "5s"
    soak: str = "5s"
    min_interval: str = "10s"
    """speculation.reconfigure.minInterval: revision changes this often at most (each restarts the pods)."""
    restart_s: float = RESTART_S
    """Start-to-ready seconds of every simulated engine."""
    low_hold_s: float = 6.0
    high_hold_s: float = 6.0
    settle_hold_s: float = 6.0
    rollout_timeout_s: float = 60.0
    off_timeout_s: float = 20.0
    on_timeout_s: float = 30.0
    measure_timeout_s: float = 20.0
    """Beyond the settle time (`learning.settle_seconds`): a speedup is measured only once the
    setting held a rate window and two decisions, and status shows it at the first look after."""


FAST = Pace(
    baseline="2s",
    soak="2s",
    min_interval="5s",
    restart_s=1.0,
    low_hold_s=1.0,
    high_hold_s=1.0,
    settle_hold_s=2.0,
    measure_timeout_s=10.0,
)
LOG_LINES_SHOWN = 14


class Display:
    """Where the demo's output goes: plain lines, or a rich live view (scene, table, last lines)."""

    def __init__(self, out: TextIO, live: bool) -> None:
        self.out = out
        self.live: Live | None = None
        self.lines: list[str] = []
        self.scene = "Starting"
        self.current = ""
        self.bodies: list[dict[str, Any]] = []
        if live:
            self.live = Live(
                console=Console(file=out), get_renderable=self.render, refresh_per_second=4, transient=False
            )

    def __enter__(self) -> Display:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()

    def line(self, text: str) -> None:
        self.lines.append(text)
        if self.live is None:
            print(text, file=self.out, flush=True)

    def show(self, text: str) -> None:
        """A status line: printed as it comes in plain mode, the live view's current line otherwise."""
        self.current = text
        if self.live is None:
            print(text, file=self.out, flush=True)

    def render(self) -> Group:
        table = list_table(self.bodies, wide=True) if self.bodies else Text("(no resources yet)")
        return Group(
            Panel(Text(self.current or "...", overflow="fold"), title=self.scene, title_align="left"),
            table,
            Text("\n".join(self.lines[-LOG_LINES_SHOWN:]), style="dim"),
        )


@dataclass
class Demo:
    """What every scene gets: the running stack, the pace, an output stream and what was seen."""

    stack: LocalStack
    pace: Pace
    out: TextIO
    backend: str = "triton"
    started: float = field(default_factory=time.monotonic)
    display: Display | None = None
    timeline: Timeline = field(default_factory=lambda: Timeline(DENSE))
    low_load: LoadPoint = LOW
    high_load: LoadPoint = HIGH
    scene_number: int = 0
    off_after_s: float | None = None
    """Seconds from the load passing break-even to K=0 on every engine (its schedule, no restart)."""
    on_after_s: float | None = None
    """Seconds from the load falling to K>0 on every engine again."""
    retrained: str | None = None
    revisions: list[str] = field(default_factory=list)
    """The revisions the dense resource's stable pods were told to run, in order (digest: schedule)."""

    def __post_init__(self) -> None:
        if self.display is None:
            self.display = Display(self.out, live=False)

    @property
    def shown(self) -> Display:
        assert self.display is not None
        return self.display

    def say(self, text: str = "") -> None:
        self.shown.line(text)

    def show(self, text: str) -> None:
        self.shown.show(f"{self.stamp()} {text}")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def heading(self, title: str, short: str | None = None) -> None:
        self.scene_number += 1
        self.say()
        self.say(f"== {self.scene_number}. {title}")
        self.shown.scene = f"{self.scene_number}. {title}"
        self.timeline.start_scene(self.scene_number, short or title, self.elapsed())

    @property
    def scene(self) -> SceneSpan:
        return self.timeline.scenes[-1]

    def summarize(self, text: str) -> None:
        """One line of this scene's summary (printed at the end and on the HTML page)."""
        self.scene.summary.append(text)

    def stamp(self) -> str:
        return f"[{self.elapsed():5.1f}s]"

    async def resource(self, name: str) -> dict[str, Any]:
        body = await self.stack.kube.get(API_VERSION, KIND, self.stack.namespace, name)
        return body or {}

    async def watch(
        self,
        what: str,
        done: Callable[[], Awaitable[bool]],
        line: Callable[[], Awaitable[str]],
        timeout_s: float,
    ) -> float:
        """Print a status line every second until ``done()``; DemoFailed after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        next_line = start
        while True:
            finished = await done()
            now = loop.time()
            if finished or now >= next_line:
                self.show(await line())
                next_line += 1.0
            if finished:
                return now - start
            if now - start > timeout_s:
                raise DemoFailed(f"{what}: not within {timeout_s:.0f} s; last seen: {await line()}")
            await asyncio.sleep(0.1)

    async def hold(self, seconds: float, line: Callable[[], Awaitable[str]]) -> None:
        """Let the stack run for a while (nothing to wait for: this is what the viewer watches)."""
        deadline = asyncio.get_running_loop().time() + seconds
        while (remaining := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.sleep(min(1.0, remaining))
            self.show(await line())


# ---------------------------------------------------------------- kubectl-like rendering


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def printer_columns() -> list[dict[str, Any]]:
    """The storage version's additionalPrinterColumns, so the table matches `kubectl get sdep -o wide`."""
    return columns.storage_columns(build_crd())


def sdep_table(bodies: Sequence[dict[str, Any]], now: datetime) -> str:
    return table(columns.table_rows(printer_columns(), bodies, now, wide=True))


def owned_children(stack: LocalStack) -> list[list[str]]:
    """Every stored object owned by a SpeculativeDeployment: kind, name, owner."""
    emulator = stack.cluster.emulator
    rows: list[list[str]] = []
    for resource in cast(list[kmock.resource], list(emulator.resources)):
        info = cast(kmock.ResourceInfo, emulator.resources[resource])
        if info.namespaced is False:
            continue
        for obj in emulator.list_objects(resource, stack.namespace):
            for ref in obj["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == KIND:
                    rows.append([obj.get("kind") or info.kind or "", obj["metadata"]["name"], ref["name"]])
    return sorted(rows, key=lambda row: (row[2], row[0], row[1]))


# ---------------------------------------------------------------- status lines


def engine_k(demo: Demo, name: str) -> list[int]:
    """The K each stable engine drafted at its last iteration (its schedule at its batch)."""
    return [pod.k for pod in serving_engines(demo.stack, name)]


def pod_revisions(demo: Demo, name: str) -> list[str]:
    """The configuration revision label of each stable pod (ready or not)."""
    return [
        slot.revision
        for serving in demo.stack.serving.sets.values()
        if serving.owner == name and serving.variant == "stable"
        for slot in serving.slots
    ]


def revision_text(speculation: dict[str, Any]) -> str:
    revision = speculation.get("revision") or {}
    return f"{revision.get('digest', '-')} ({speculation.get('schedule') or 'none yet'})"


def rollout_text(speculation: dict[str, Any]) -> str:
    rollout = speculation.get("rollout")
    if not rollout:
        return "settled"
    return f"rolling {rollout.get('updated', 0)}/{rollout.get('replicas', 0)}"


async def rollout_line(demo: Demo) -> str:
    parts = []
    for _, name in EXAMPLES:
        speculation = (await demo.resource(name)).get("status", {}).get("speculation", {})
        parts.append(
            f"{name}: {speculation.get('controlPhase', 'Pending'):<8} revision {revision_text(speculation)}, "
            f"{rollout_text(speculation)}; engines K {engine_k(demo, name)}"
        )
    return " | ".join(parts)


async def load_line(demo: Demo) -> str:
    status = (await demo.resource(DENSE)).get("status", {})
    speculation, observed = status.get("speculation", {}), status.get("observed", {})
    pods = demo.stack.pods(DENSE, "stable")
    offered = pods[0].load_point.batch if pods else 0.0
    return (
        f"offered batch {offered:>4.0f}/pod | engines batch {[p.batch for p in serving_engines(demo.stack, DENSE)]} "
        f"K {engine_k(demo, DENSE)} | schedule {speculation.get('schedule', '?')} "
        f"(seen batch {observed.get('batch', '?')}): {speculation.get('reason', '')}"
    )


async def all_pods(demo: Demo, name: str, speculating: bool) -> bool:
    """Every ready stable engine drafts (K>0) or not (K=0) at the batch it carries."""
    ks = engine_k(demo, name)
    return bool(ks) and all((k > 0) == speculating for k in ks)


async def on_revision(demo: Demo, name: str) -> bool:
    """Every stable pod runs the revision status names, is ready, and no rollout is under way."""
    speculation = (await demo.resource(name)).get("status", {}).get("speculation", {})
    digest = (speculation.get("revision") or {}).get("digest")
    revisions = pod_revisions(demo, name)
    return (
        digest is not None
        and not speculation.get("rollout")
        and bool(revisions)
        and all(r == digest for r in revisions)
        and len(serving_engines(demo.stack, name)) == len(revisions)
    )


# ---------------------------------------------------------------- scenes


async def scene_apply(demo: Demo) -> None:
    stack, pace = demo.stack, demo.pace
    demo.heading(
        f"Apply the two examples on {demo.backend} (decisions every 1 s, baseline {pace.baseline}, soak "
        f"{pace.soak}, revisions at most every {pace.min_interval}, engines ready {pace.restart_s:g} s after "
        "they start, the local Prometheus)",
        short="apply",
    )
    for example, name in EXAMPLES:
        body = fast_resource(
            example,
            prometheus_url=stack.prometheus.url,
            namespace=stack.namespace,
            baseline=pace.baseline,
            soak=pace.soak,
            min_interval=pace.min_interval,
            backend=demo.backend,
        )
        await stack.kube.create(body)
        demo.say(f"speculativedeployment.specops.dev/{name} created")

    async def serving() -> bool:
        return all(len(serving_engines(demo.stack, name)) == 2 for _, name in EXAMPLES)

    await demo.watch("serving pods ready", serving, lambda: rollout_line(demo), timeout_s=30)
    demo.say()
    children = owned_children(stack)
    kinds = ",".join(sorted({row[0].lower() for row in children}))
    demo.say(
        f"$ kubectl get {kinds} -o custom-columns="
        "KIND:.kind,NAME:.metadata.name,OWNER:.metadata.ownerReferences[0].name"
    )
    demo.say(table([["KIND", "NAME", "OWNER"], *children]))
    demo.say()
    demo.say(
        f"serving pods (simulated {demo.backend} engines started from the rendered command, args and config "
        "files; API and metrics ports scraped by Prometheus):"
    )
    rows = [["POD", "OWNER", "REVISION", "ENGINE", "API", "METRICS"]]
    for _, name in EXAMPLES:
        rows += [
            [
                pod.name,
                name,
                pod_revision(demo, pod),
                pod.backend,
                pod.url,
                pod.metrics_url.removeprefix("http://"),
            ]
            for pod in stack.pods(name)
        ]
    demo.say(table(rows))
    pod = next(iter(stack.pods(DENSE, "stable")), None)
    if pod is not None:
        stored = stack.cluster.get("pods", pod.name, namespace=stack.namespace) or {}
        container = ((stored.get("spec") or {}).get("containers") or [{}])[0]
        demo.say()
        demo.say(f"$ kubectl get pod {pod.name} -o jsonpath='{{.spec.containers[0].command}} {{...args}}'")
        demo.say(" ".join([*container.get("command", []), *container.get("args", [])]))
    demo.summarize(
        f"{len(EXAMPLES)} resources applied on {demo.backend}; {len(children)} owned children; "
        f"{sum(len(stack.pods(name)) for _, name in EXAMPLES)} simulated engines serving"
    )


def pod_revision(demo: Demo, pod: SimEngine) -> str:
    for serving in demo.stack.serving.sets.values():
        for slot in serving.slots:
            if slot.engine is pod:
                return slot.revision
    return ""


async def scene_rollout(demo: Demo) -> None:
    demo.heading(
        "Revisions roll out pod by pod: plain for the baseline, then a speculating schedule that soaks, "
        "then tuning (Dynamic)",
        short="rollout",
    )
    started = demo.elapsed()

    async def dynamic_and_speculating() -> bool:
        for _, name in EXAMPLES:
            speculation = (await demo.resource(name)).get("status", {}).get("speculation", {})
            if (
                speculation.get("controlPhase") != "Dynamic"
                or (speculation.get("revision") or {}).get("mode") != "spec"
            ):
                return False
            if not await on_revision(demo, name) or not await all_pods(demo, name, True):
                return False
        return True

    await demo.watch(
        "both resources in the Dynamic phase, every pod on the speculating revision in status",
        dynamic_and_speculating,
        lambda: rollout_line(demo),
        demo.pace.rollout_timeout_s,
    )
    demo.summarize(
        f"both resources tuning (Dynamic), every pod on its speculating revision "
        f"{demo.elapsed() - started:.1f} s after apply"
    )
    # The speedup is measured once the revision held a rate window and two decisions (the operator's
    # settle time): the window entering Dynamic still holds the baseline's samples. The MoE's
    # sub-millisecond TPOT shows whether the latency histogram resolves it.
    with contextlib.suppress(DemoFailed):  # the summary then shows what was measured so far
        await demo.watch(
            "measured speedups settled",
            lambda: all_measured(demo),
            lambda: rollout_line(demo),
            settle_seconds(rate_window_s(demo.stack.scrape_interval_s), demo.stack.decision_interval_s)
            + demo.pace.measure_timeout_s,
        )
    with contextlib.suppress(DemoFailed):  # a settled rollout, for the table below
        await demo.watch(
            "every pod on the revision in status",
            lambda: on_revision(demo, DENSE),
            lambda: rollout_line(demo),
            demo.pace.rollout_timeout_s,
        )
    for _, name in EXAMPLES:
        status = (await demo.resource(name)).get("status", {})
        speculation, baseline = status.get("speculation", {}), status.get("baseline", {})
        demo.summarize(
            f"{name}: measured speedup {speculation.get('measuredSpeedup')}x over the baseline (modelled "
            f"{speculation.get('predictedSpeedup')}x; TPOT p50 {baseline.get('perTokenLatencyP50')} plain), "
            f"schedule {speculation.get('schedule')}"
        )
    demo.summarize(f"{DENSE} revisions so far: {'; '.join(demo.revisions)}")
    await print_sdeps(demo)


async def all_measured(demo: Demo) -> bool:
    """Every resource's measured speedup is within a third of the modelled one (the windows have
    moved past the baseline's samples)."""
    for _, name in EXAMPLES:
        speculation = (await demo.resource(name)).get("status", {}).get("speculation", {})
        measured, predicted = speculation.get("measuredSpeedup"), speculation.get("predictedSpeedup")
        if not measured or not predicted or measured < 1.0 + (predicted - 1.0) * 2 / 3:
            return False
    return True


async def scene_load_cycle(demo: Demo) -> None:
    stack, pace, low, high = demo.stack, demo.pace, demo.low_load, demo.high_load
    body = await demo.resource(DENSE)
    setup = model_setup(body)
    break_even = perf.best_length_break_even_batch(setup, ALPHA, 8)
    schedule = (body.get("status") or {}).get("speculation", {}).get("schedule")
    demo.heading(f"Load on {DENSE} rises past break-even and falls again", short="load past break-even")
    demo.say(
        f"modelled at alpha {ALPHA}: best speedup {perf.best_draft_length(setup, ALPHA, low.batch, 8)[1]:.2f}x "
        f"at batch {low.batch:.0f}, none at or above batch {break_even} (the engine runs at most 256)"
    )
    demo.say(
        f"the engines were started with the schedule {schedule}: each applies it at every iteration, at "
        "the batch it carries, so no restart is needed to stop or resume drafting"
    )
    line = lambda: load_line(demo)  # noqa: E731
    await demo.hold(pace.low_hold_s, line)
    pods_before = sorted(pod.name for pod in serving_engines(demo.stack, DENSE))

    demo.say(f"--- offered load rises to {high.batch:.0f} requests per pod")
    stack.set_load(DENSE, high)
    demo.off_after_s = await demo.watch(
        "the engines' schedule at K=0 on every pod past break-even",
        lambda: all_pods(demo, DENSE, False),
        line,
        pace.off_timeout_s,
    )
    demo.say(f"--- every engine drafts K=0 {demo.off_after_s:.1f} s after the load passed break-even")
    await demo.hold(pace.high_hold_s, line)

    demo.say(f"--- offered load falls to {low.batch:.0f} requests per pod")
    stack.set_load(DENSE, low)
    demo.on_after_s = await demo.watch(
        "the engines' schedule back at K>0 on every pod below break-even",
        lambda: all_pods(demo, DENSE, True),
        line,
        pace.on_timeout_s,
    )
    demo.say(
        f"--- every engine drafts again (K {engine_k(demo, DENSE)}) {demo.on_after_s:.1f} s after the load fell"
    )
    await demo.hold(pace.settle_hold_s, line)
    restarted = sorted(pod.name for pod in serving_engines(demo.stack, DENSE)) != pods_before
    demo.summarize(
        f"offered batch {low.batch:.0f} -> {high.batch:.0f} -> {low.batch:.0f} per pod (break-even {break_even})"
    )
    demo.summarize(
        f"K=0 on every engine {demo.off_after_s:.1f} s after the load passed break-even, K>0 again "
        f"{demo.on_after_s:.1f} s after it fell: the schedule the engines were started with "
        + ("(a revision rolled out meanwhile)" if restarted else "(same pods, no restart)")
    )
    await print_sdeps(demo)


async def scene_events(demo: Demo) -> None:
    demo.heading("Events", short="events")
    events = await demo.stack.kube.list("v1", "Event", demo.stack.namespace)
    events = [e for e in events if (e.get("involvedObject") or {}).get("kind") == KIND]
    events.sort(key=lambda e: int(e["metadata"].get("resourceVersion") or 0))
    demo.say("$ kubectl get events --field-selector involvedObject.kind=SpeculativeDeployment")
    rows = [["OBJECT", "TYPE", "REASON", "MESSAGE"]]
    rows += [
        [
            f"sdep/{e['involvedObject'].get('name', '')}",
            e.get("type", ""),
            e.get("reason", ""),
            e.get("message", ""),
        ]
        for e in events
    ]
    demo.say(table(rows))
    reasons = sorted({e.get("reason", "") for e in events})
    demo.summarize(f"{len(events)} Events about SpeculativeDeployments: {', '.join(reasons)}")


async def print_sdeps(demo: Demo) -> None:
    bodies = [await demo.resource(name) for _, name in EXAMPLES]
    demo.say()
    demo.say("$ kubectl get sdep -o wide")
    demo.say(sdep_table([b for b in bodies if b], datetime.now(UTC)))


async def canary_line(demo: Demo) -> str:
    status = (await demo.resource(DENSE)).get("status", {})
    canary = status.get("canary") or {}
    rollout: dict[str, Any] = next(
        (c for c in status.get("conditions", []) if c["type"] == "CanaryRollout"), {}
    )
    verdict = (canary.get("lastAnalysis") or {}).get("verdict", "-")
    if not canary:
        return (
            f"{DENSE}: stable draft {status.get('draft', {}).get('version')} ({rollout.get('reason', '-')})"
        )
    return (
        f"{DENSE}: canary {canary.get('draft', {}).get('version')} {canary.get('phase')} "
        f"step {int(canary.get('step', -1)) + 1} weight {canary.get('weight', 0)}% "
        f"({canary.get('trafficRouting')}), last analysis {verdict}"
    )


async def promoted(demo: Demo, version: str) -> bool:
    status = (await demo.resource(DENSE)).get("status", {})
    rollout: dict[str, Any] = next(
        (c for c in status.get("conditions", []) if c["type"] == "CanaryRollout"), {}
    )
    if rollout.get("reason") == "CanaryRolledBack":
        raise DemoFailed(f"canary rolled back: {rollout.get('message')}")
    return rollout.get("reason") == "CanaryPromoted" and status.get("draft", {}).get("version") == version


async def scene_canary(demo: Demo) -> None:
    stack = demo.stack
    demo.heading(f"A better draft (v4) for {DENSE} goes out behind a canary", short="canary v4")
    stable = 2
    shares = [achieved_weight(canary_replicas_for(w, stable), stable) for w in CANARY_WEIGHTS]
    demo.say(
        f"steps {' -> '.join(f'{w}%' for w in CANARY_WEIGHTS)} -> promote, 6 s bake each; without an HTTPRoute "
        f"the split is by replicas: beside {stable} stable pods that is "
        f"{' -> '.join(f'{s}%' for s in shares)} of the traffic; first the golden prompts must "
        "come out of a canary engine (speculating with v4) token for token as a stable one gives them"
    )
    await stack.kube.patch(API_VERSION, KIND, stack.namespace, DENSE, {"spec": {"canary": FAST_CANARY}})
    draft = {"version": "v4", "uri": "pvc://models/llama-70b-draft/v4"}
    await stack.kube.patch(API_VERSION, KIND, stack.namespace, DENSE, {"spec": {"draft": draft}})
    demo.say(
        f'$ kubectl patch sdep {DENSE} --type merge -p \'{{"spec": {{"draft": {{"version": "v4", ...}}}}}}\''
    )
    await demo.watch("canary of v4 promoted", lambda: promoted(demo, "v4"), lambda: canary_line(demo), 90)
    status = (await demo.resource(DENSE)).get("status", {})
    rollout: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == "CanaryRollout")
    demo.say(f"--- {rollout['reason']}: {rollout['message']}")
    demo.summarize(f"{rollout['reason']}: {rollout['message']}")
    await accept_refreshed(demo, "v4")
    await print_sdeps(demo)


async def accept_refreshed(demo: Demo, version: str) -> None:
    """Until ACCEPT (status.observed.alpha) shows the promoted draft, not the one it replaced."""
    expected = DRAFTS[version].alpha if version in DRAFTS else None

    async def refreshed() -> bool:
        alpha = (await demo.resource(DENSE)).get("status", {}).get("observed", {}).get("alpha")
        return alpha is not None and expected is not None and abs(alpha - expected) <= 0.02

    async def accept_line() -> str:
        alpha = (await demo.resource(DENSE)).get("status", {}).get("observed", {}).get("alpha")
        return f"{DENSE}: ACCEPT {alpha} (draft {version} accepts about {expected})"

    await demo.watch(f"ACCEPT showing draft {version}", refreshed, accept_line, 30)
    alpha = (await demo.resource(DENSE)).get("status", {}).get("observed", {}).get("alpha")
    demo.summarize(f"ACCEPT now {alpha} with draft {version}")


async def scene_retraining(demo: Demo) -> None:
    stack = demo.stack
    demo.heading(
        f"The target of {DENSE} is updated: the draft goes stale and is retrained", short="retraining round"
    )
    retraining = {
        "enabled": True,
        "method": "onPolicy",
        "image": "registry.example.com/specops-trainer:1",
        "data": {"uri": "s3://prompts/llama-70b-chat/"},
    }
    await stack.kube.patch(API_VERSION, KIND, stack.namespace, DENSE, {"spec": {"retraining": retraining}})
    await stack.kube.patch(
        API_VERSION, KIND, stack.namespace, DENSE, {"spec": {"target": {"version": "2026-11-15"}}}
    )
    demo.say(
        f'$ kubectl patch sdep {DENSE} --type merge -p \'{{"spec": {{"target": {{"version": "2026-11-15"}}}}}}\''
    )

    async def job() -> dict[str, Any] | None:
        jobs = await stack.kube.list("batch/v1", "Job", stack.namespace, {"specops.dev/deployment": DENSE})
        return jobs[0] if jobs else None

    async def job_created() -> bool:
        return await job() is not None

    async def stale_line() -> str:
        status = (await demo.resource(DENSE)).get("status", {})
        stale: dict[str, Any] = next(
            (c for c in status.get("conditions", []) if c["type"] == "DraftStale"), {}
        )
        return f"{DENSE}: DraftStale={stale.get('status')} ({stale.get('message', '')})"

    await demo.watch("training Job created", job_created, stale_line, 30)
    created = await job()
    assert created is not None
    env = {e["name"]: e.get("value", "") for e in created["spec"]["template"]["spec"]["containers"][0]["env"]}
    demo.say(f"job.batch/{created['metadata']['name']} created; the trainer receives:")
    for key in (
        "SPECOPS_TARGET_VERSION",
        "SPECOPS_DRAFT_VERSION",
        "SPECOPS_METHOD",
        "SPECOPS_DATA_URI",
        "SPECOPS_REPLAY_REJECTED",
        "SPECOPS_OUTPUT_VERSION",
    ):
        demo.say(f"  {key}={env.get(key, '')}")
    version = env["SPECOPS_OUTPUT_VERSION"]
    demo.say(
        f"--- the local stack's Job controller runs it for {TRAIN_S:g} s; the trainer publishes draft "
        f"{version} in the Job's specops.dev/result annotation"
    )
    await demo.watch(
        f"retrained draft {version} promoted", lambda: promoted(demo, version), lambda: canary_line(demo), 120
    )

    async def current() -> bool:
        status = (await demo.resource(DENSE)).get("status", {})
        return any(c["type"] == "DraftStale" and c["status"] == "False" for c in status.get("conditions", []))

    await demo.watch("draft current again", current, stale_line, 20)
    demo.retrained = version
    status = (await demo.resource(DENSE)).get("status", {})
    retraining = status.get("retraining") or {}
    demo.summarize(
        f"round {retraining.get('rounds')}: Job {created['metadata']['name']} trained {version} for target "
        f"2026-11-15 ({retraining.get('lastResult')})"
    )
    rollout: dict[str, Any] = next(
        (c for c in status.get("conditions", []) if c["type"] == "CanaryRollout"), {}
    )
    demo.summarize(f"{rollout.get('reason')}: {rollout.get('message')}")
    await accept_refreshed(demo, version)
    await print_sdeps(demo)


Scene = Callable[[Demo], Awaitable[None]]
SCENES: list[Scene] = [
    scene_apply,
    scene_rollout,
    scene_load_cycle,
    scene_canary,
    scene_retraining,
    scene_events,
]


# ---------------------------------------------------------------- running it


def recorded(demo: Demo, recorder: TimelineRecorder) -> None:
    """After each sample: the live view's resources, and the dense resource's revisions in order."""
    demo.shown.bodies = [
        b for b in recorder.bodies if b["metadata"]["name"] in {name for _, name in EXAMPLES}
    ]
    body = next((b for b in recorder.bodies if b["metadata"]["name"] == DENSE), None)
    speculation = ((body or {}).get("status") or {}).get("speculation") or {}
    revision = speculation.get("revision") or {}
    seen = f"{revision.get('digest')}: {speculation.get('schedule')}"
    if revision.get("digest") and (not demo.revisions or demo.revisions[-1] != seen):
        demo.revisions.append(seen)


def picture_paths(picture: Path) -> tuple[Path, Path, Path]:
    """The PNG, the HTML page beside it, and the timeline's JSON."""
    return picture, picture.with_suffix(".html"), picture.with_suffix(".json")


def draw(demo: Demo, picture: Path) -> tuple[Path, Path]:
    png, page, data = picture_paths(picture)
    render_png(demo.timeline, png)
    render_html(demo.timeline, png, page)
    data.write_text(json.dumps(demo.timeline.as_json(), indent=1) + "\n")
    return png, page


def print_summary(demo: Demo, out: TextIO) -> None:
    print("\nSummary", file=out)
    for scene in demo.timeline.scenes:
        end = scene.end if scene.end is not None else scene.start
        print(f"  {scene.number}. {scene.title} ({end - scene.start:.0f} s)", file=out)
        for line in scene.summary:
            print(f"     - {line}", file=out)
    out.flush()


@dataclass(frozen=True)
class DemoResult:
    exit_code: int
    wall_s: float
    off_after_s: float | None = None
    on_after_s: float | None = None
    revisions: list[str] = field(default_factory=list)
    """The dense resource's revisions in order ("digest: schedule")."""
    backend: str = "triton"
    failure: str | None = None
    picture: Path | None = None
    page: Path | None = None
    timeline: Timeline | None = None

    @property
    def schedule_followed_load(self) -> bool:
        """The engines drafted K=0 past break-even and K>0 below it."""
        return self.off_after_s is not None and self.on_after_s is not None


PROMETHEUS_MISSING = """\
Debian's prometheus is not installed; the demo scrapes the simulated pods with the real one.
Install it with:  make prometheus   (or: sudo apt-get install prometheus)"""


async def run_demo(
    *,
    fast: bool = False,
    pace: Pace | None = None,
    workdir: Path | None = None,
    out: TextIO | None = None,
    scenes: Sequence[Scene] = SCENES,
    picture: Path | None = None,
    live: bool | None = None,
    backend: str = "triton",
) -> DemoResult:
    """Run the scenes on a fresh local stack and draw the timeline; never raises for a failed scene.

    ``picture``: where the PNG goes (HTML and JSON beside it); default WORKDIR/specops-demo.png.
    ``live``: the rich live view; default when ``out`` is a terminal.
    """
    out = out if out is not None else sys.stdout
    live = out.isatty() if live is None else live
    started = time.monotonic()
    if shutil.which("prometheus") is None:
        print(PROMETHEUS_MISSING, file=out, flush=True)
        return DemoResult(exit_code=2, wall_s=0.0, failure="prometheus is not installed")
    with contextlib.ExitStack() as cleanup:
        if workdir is None:
            workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="specops-demo-")))
        workdir.mkdir(parents=True, exist_ok=True)
        picture = (picture or workdir / "specops-demo.png").resolve()
        cleanup.enter_context(log_to_file(workdir / "operator.log"))
        print(
            "Starting the local stack: emulated Kubernetes API, Prometheus (1 s scrape), simulated "
            f"{backend} engines, the specops operator",
            file=out,
            flush=True,
        )
        failure: str | None = None
        pace = pace or (FAST if fast else Pace())
        async with local_stack(
            workdir, load=LOW, drafts=DRAFTS, restart_s=pace.restart_s, train_s=TRAIN_S
        ) as stack:
            display = cleanup.enter_context(Display(out, live))
            demo = Demo(
                stack=stack,
                pace=pace,
                out=out,
                backend=backend,
                started=started,
                display=display,
            )
            demo.say(f"API server {stack.cluster.url}, Prometheus {stack.prometheus.url}")
            recorder = TimelineRecorder(stack, names=[DENSE], started=started)
            recorder.timelines[DENSE] = demo.timeline
            recording = asyncio.get_running_loop().create_task(
                recorder.run(lambda sampled: recorded(demo, sampled)), name="demo recorder"
            )
            task = asyncio.current_task()
            assert task is not None
            with interrupt_cancels(task, lambda: demo.say("\nInterrupted: stopping everything...")):
                try:
                    for scene in scenes:
                        await scene(demo)
                except DemoFailed as error:
                    failure = str(error)
                    demo.say(f"\nDEMO FAILED: {failure}")
                finally:
                    recording.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await recording
                    await recorder.close()
                    demo.timeline.finish(demo.elapsed())
            display.__exit__(None, None, None)
        wall_s = time.monotonic() - started
        if live:
            print("\n".join(display.lines), file=out)
        if failure is None and not (demo.off_after_s is not None and demo.on_after_s is not None):
            failure = "the engines' schedule was not seen at K=0 past break-even and K>0 below it"
            print(f"\nDEMO FAILED: {failure}", file=out, flush=True)
        if failure is None and not any(": plain" not in seen for seen in demo.revisions):
            failure = f"no speculating revision rolled out (revisions seen: {demo.revisions})"
            print(f"\nDEMO FAILED: {failure}", file=out, flush=True)
        print_summary(demo, out)
        png, page = draw(demo, picture)
        print(f"\nTimeline picture: {png}\n          web page: {page}", file=out, flush=True)
        if failure is None:
            print(
                f"\nDone in {wall_s:.0f} s on {backend}: {len(demo.revisions)} revisions of {DENSE} rolled out "
                f"pod by pod; its engines drafted K=0 {demo.off_after_s:.1f} s after the load passed "
                f"break-even and drafted again {demo.on_after_s:.1f} s after it fell, from the schedule they "
                "were started with.",
                file=out,
                flush=True,
            )
        return DemoResult(
            exit_code=0 if failure is None else 1,
            wall_s=wall_s,
            off_after_s=demo.off_after_s,
            on_after_s=demo.on_after_s,
            revisions=list(demo.revisions),
            backend=backend,
            failure=failure,
            picture=png,
            page=page,
            timeline=demo.timeline,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specops_local.demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--fast", action="store_true", help="shorter phases and holds (about 80 s instead of 100 s)"
    )
    parser.add_argument("--workdir", type=Path, help="keep Prometheus data and operator.log here")
    parser.add_argument("--out", type=Path, help="the timeline picture (PNG; HTML beside it)")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="triton",
        help="the serving engine the examples run on (simulated): Triton's LLM API model (default), "
        "trtllm-serve, vllm or sglang",
    )
    args = parser.parse_args(argv)
    try:
        result = asyncio.run(
            run_demo(fast=args.fast, workdir=args.workdir, picture=args.out, backend=args.backend)
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("Stopped.", flush=True)
        return 130
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
