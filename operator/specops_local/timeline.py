"""The demo's timeline: what was measured and decided, second by second, as a picture and a web page.

`specops_local.recorder` samples a resource while the demo or ``local up`` runs (offered and
observed batch, the model's break-even batch at the current acceptance, alpha, the K the engines
drafted and the schedule's largest K, TPOT p50/p99 from Prometheus and what plain decoding would
have given, canary weight) and records the decisions (status reasons and Events). ``render_png``
draws six panels sharing the time axis (a band for whether the engines speculate on top) with the
scenes shaded and each decision as one line through all of them; ``render_html`` wraps the
picture (embedded, so the page is self-contained), the per-scene summary and the decisions.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Sample:
    t: float
    offered_batch: float | None = None
    observed_batch: float | None = None
    break_even_batch: float | None = None
    alpha: float | None = None
    k: float | None = None
    """The K the stable engines drafted at their last iteration (their schedule at their batch), averaged."""
    schedule_k: float | None = None
    """The largest K of the schedule in force (0: plain pods)."""
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    plain_tpot_ms: float | None = None
    """The TPOT plain decoding would have given the same engines at the same batch."""
    canary_weight: float | None = None


@dataclass
class Marker:
    t: float
    reason: str
    message: str = ""


@dataclass
class SceneSpan:
    number: int
    title: str
    start: float
    end: float | None = None
    summary: list[str] = field(default_factory=list)


@dataclass
class Timeline:
    resource: str
    slo_p99_ms: float | None = None
    samples: list[Sample] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    scenes: list[SceneSpan] = field(default_factory=list)

    def start_scene(self, number: int, title: str, t: float) -> SceneSpan:
        if self.scenes and self.scenes[-1].end is None:
            self.scenes[-1].end = t
        scene = SceneSpan(number, title, t)
        self.scenes.append(scene)
        return scene

    def finish(self, t: float) -> None:
        if self.scenes and self.scenes[-1].end is None:
            self.scenes[-1].end = t

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timeline:
        """A timeline saved by the demo (NAME.json beside the picture), to draw it again."""
        return cls(
            resource=data["resource"],
            slo_p99_ms=data.get("slo_p99_ms"),
            samples=[
                Sample(**{k: v for k, v in s.items() if k in Sample.__dataclass_fields__})
                for s in data.get("samples", [])
            ],
            markers=[Marker(**m) for m in data.get("markers", [])],
            scenes=[SceneSpan(**s) for s in data.get("scenes", [])],
        )


# Decisions worth a marker, each its own colour: revision rollouts, canary, retraining.
MARKER_COLOURS = {
    "BaselineRecorded": "#2ca02c",
    "RevisionProposed": "#1f77b4",
    "MeasuredSlowdown": "#d62728",
    "SpeculationOff": "#7f7f7f",
    "SpeculationHeld": "#bcbd22",
    "CanaryStarted": "#9467bd",
    "LosslessCheckPassed": "#17becf",
    "CanaryStepAdvanced": "#c5b0d5",
    "CanaryPromoted": "#8c564b",
    "CanaryRolledBack": "#e377c2",
    "RetrainingStarted": "#ff7f0e",
    "RetrainingSucceeded": "#ffbb78",
    "DraftStale": "#393b79",
}
SAME_DECISION_S = 3.0
"""A marker with the reason of one drawn less than this earlier is the same decision seen twice
(the status reason and its Event): it is drawn once."""
SPECULATING = "#98df8a"
PLAIN = "#d9d9d9"


def _series(samples: list[Sample], name: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for sample in samples:
        value = getattr(sample, name)
        if value is not None:
            xs.append(sample.t)
            ys.append(value)
    return xs, ys


def decisions(markers: list[Marker]) -> list[Marker]:
    """The markers worth drawing: known reasons, each decision once (see SAME_DECISION_S)."""
    drawn: list[Marker] = []
    last: dict[str, float] = {}
    for marker in sorted(markers, key=lambda m: m.t):
        if marker.reason not in MARKER_COLOURS:
            continue
        if marker.t - last.get(marker.reason, -SAME_DECISION_S) >= SAME_DECISION_S:
            drawn.append(marker)
        last[marker.reason] = marker.t
    return drawn


def speculation_spans(samples: list[Sample]) -> list[tuple[float, float, bool]]:
    """(start, end, speculating) spans: whether the engines drafted (K > 0) from one sample to the next."""
    spans: list[tuple[float, float, bool]] = []
    known = [s for s in samples if s.k is not None]
    for sample, following in zip(known, [*known[1:], None], strict=True):
        end = following.t if following is not None else sample.t
        on = (sample.k or 0) > 0
        if spans and spans[-1][2] == on and spans[-1][1] == sample.t:
            spans[-1] = (spans[-1][0], end, on)
        else:
            spans.append((sample.t, end, on))
    return spans


def render_png(timeline: Timeline, path: Path, *, title: str = "specops local demo") -> Path:
    """Six panels over time: whether the engines speculate (a band), batch vs break-even, alpha, the
    K the engines drafted (and the schedule's largest), TPOT vs plain decoding and the SLO, canary
    weight. Decisions are lines through every panel, each once; legends sit beside the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    figure, axes = plt.subplots(
        6, 1, figsize=(15, 12.5), sharex=True, height_ratios=[0.45, 3, 2, 2, 3, 2], layout="constrained"
    )
    band_ax, batch_ax, alpha_ax, length_ax, tpot_ax, weight_ax = axes
    samples = timeline.samples

    for start, end, on in speculation_spans(samples):
        band_ax.axvspan(start, end, color=SPECULATING if on else PLAIN, lw=0)
    band_ax.set_yticks([])
    band_ax.set_ylabel("speculation", rotation=0, ha="right", va="center")
    band_ax.legend(
        handles=[
            Patch(color=SPECULATING, label="on (engines draft K>0)"),
            Patch(color=PLAIN, label="off (K=0)"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize=8,
        frameon=False,
    )

    batch_ax.plot(
        *_series(samples, "offered_batch"), label="offered requests per pod", color="#7f7f7f", ls="--"
    )
    batch_ax.plot(*_series(samples, "observed_batch"), label="batch (Prometheus)", color="#1f77b4")
    batch_ax.plot(
        *_series(samples, "break_even_batch"),
        label="break-even batch (model, current alpha)",
        color="#d62728",
    )
    batch_ax.set_ylabel("batch")
    alpha_ax.plot(*_series(samples, "alpha"), color="#2ca02c", label="alpha (acceptance)")
    alpha_ax.set_ylabel("alpha")
    alpha_ax.set_ylim(0, 1)
    length_ax.step(
        *_series(samples, "schedule_k"), where="post", color="#c5b0d5", ls="--", label="schedule's largest K"
    )
    length_ax.step(*_series(samples, "k"), where="post", color="#9467bd", label="K the engines drafted")
    length_ax.set_ylabel("draft length K\n(0 = not drafting)")
    tpot_ax.plot(*_series(samples, "tpot_p50_ms"), label="TPOT p50", color="#1f77b4")
    tpot_ax.plot(*_series(samples, "tpot_p99_ms"), label="TPOT p99", color="#ff7f0e")
    tpot_ax.plot(
        *_series(samples, "plain_tpot_ms"),
        label="plain decoding at the same batch",
        color="#7f7f7f",
        ls="--",
    )
    if timeline.slo_p99_ms is not None:
        tpot_ax.axhline(
            timeline.slo_p99_ms, color="#d62728", ls=":", label=f"p99 SLO {timeline.slo_p99_ms:g} ms"
        )
    tpot_ax.set_ylabel("ms per token")
    tpot_ax.set_ylim(bottom=0)
    weight_ax.step(*_series(samples, "canary_weight"), where="post", color="#8c564b", label="canary weight")
    weight_ax.set_ylabel("canary\nweight %")
    weight_ax.set_ylim(-5, 105)
    weight_ax.set_xlabel("seconds since the start")

    shades = ("#f2f2f2", "#ffffff")
    for index, scene in enumerate(timeline.scenes):
        end = scene.end if scene.end is not None else (samples[-1].t if samples else scene.start)
        for ax in axes[1:]:
            ax.axvspan(scene.start, end, color=shades[index % 2], zorder=0)
        band_ax.text(
            (scene.start + end) / 2,
            1.15,
            f"{scene.number}. {scene.title}",
            transform=band_ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=8,
            wrap=True,
        )
    drawn = decisions(timeline.markers)
    for marker in drawn:
        for ax in axes:  # one line through every panel, the same line in each
            ax.axvline(marker.t, color=MARKER_COLOURS[marker.reason], lw=1.1, alpha=0.85)
    reasons = list(dict.fromkeys(marker.reason for marker in drawn))
    for ax in (batch_ax, alpha_ax, length_ax, tpot_ax, weight_ax):
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    if reasons:
        figure.legend(
            handles=[Line2D([], [], color=MARKER_COLOURS[r], lw=2, label=r) for r in reasons],
            title="decisions",
            loc="outside lower center",
            ncol=min(len(reasons), 7),
            fontsize=8,
            title_fontsize=8,
            frameon=False,
        )
    figure.suptitle(f"{title}: {timeline.resource}")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def render_html(timeline: Timeline, png: Path, path: Path) -> Path:
    """A self-contained page: the picture (embedded), each scene's summary, every decision."""
    image = base64.b64encode(png.read_bytes()).decode()
    scenes = "".join(
        f"<h3>{scene.number}. {html.escape(scene.title)}</h3><ul>"
        + "".join(f"<li>{html.escape(line)}</li>" for line in scene.summary)
        + f"</ul><p class=t>{scene.start:.0f} s - {(scene.end or scene.start):.0f} s</p>"
        for scene in timeline.scenes
    )
    decisions = "".join(
        f"<tr><td>{m.t:.1f} s</td><td>{html.escape(m.reason)}</td><td>{html.escape(m.message)}</td></tr>"
        for m in timeline.markers
    )
    data = html.escape(json.dumps(timeline.as_json()))
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specops demo: {html.escape(timeline.resource)}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}}img{{width:100%}}
td{{padding:2px 8px;vertical-align:top;font-size:90%}}.t{{color:#777;font-size:80%}}</style></head>
<body><h1>specops local demo: {html.escape(timeline.resource)}</h1>
<img alt="timeline of batch, break-even, alpha, the engines' draft length, TPOT and canary weight" src="data:image/png;base64,{image}">
<h2>Scenes</h2>{scenes}
<h2>Decisions</h2><table><tr><th>time</th><th>reason</th><th>message</th></tr>{decisions}</table>
<script type="application/json" id="timeline">{data}</script>
</body></html>
"""
    path.write_text(page)
    return path
