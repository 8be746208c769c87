"""The timeline picture: a speculation band, a plain-decoding line, one line per decision, legends beside the data."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from specops_local.timeline import (
    MARKER_COLOURS,
    Marker,
    Sample,
    Timeline,
    decisions,
    render_png,
    speculation_spans,
)


def test_a_decision_seen_as_status_reason_and_as_event_is_drawn_once() -> None:
    markers = [
        Marker(10.0, "RevisionProposed"),
        Marker(10.5, "RevisionProposed"),  # the same decision's Event, half a second later
        Marker(11.0, "SomethingUnlisted"),
        Marker(30.0, "RevisionProposed"),  # a later decision of the same kind
    ]
    assert [(m.t, m.reason) for m in decisions(markers)] == [
        (10.0, "RevisionProposed"),
        (30.0, "RevisionProposed"),
    ]


def test_every_decision_kind_has_its_own_colour() -> None:
    assert len(set(MARKER_COLOURS.values())) == len(MARKER_COLOURS)


def test_the_band_says_when_the_engines_speculate() -> None:
    ks = [0, 0, 4, 4, 0, 2]
    samples = [Sample(t=float(t), k=k) for t, k in enumerate(ks)]
    assert speculation_spans(samples) == [
        (0.0, 2.0, False),
        (2.0, 4.0, True),
        (4.0, 5.0, False),
        (5.0, 5.0, True),
    ]


def test_the_picture_is_drawn_from_samples_with_plain_decoding(tmp_path: Path) -> None:
    timeline = Timeline("chat", slo_p99_ms=50.0)
    for t in range(40):
        k = 4 if 10 <= t < 30 else 0
        timeline.samples.append(
            Sample(t=float(t), offered_batch=16, k=k, schedule_k=4, tpot_p50_ms=20.0, plain_tpot_ms=30.0)
        )
    timeline.markers.append(Marker(10.0, "RevisionProposed"))
    png = render_png(timeline, tmp_path / "t.png")
    with Image.open(png) as image:
        assert image.size[0] > 1000 and image.size[1] > 1000
