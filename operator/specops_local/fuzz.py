"""Specs the CRD admits never crash the operator's pure code: a hypothesis property and its bench.

``bodies()`` draws SpeculativeDeployments over the whole spec (names like model names, edge
durations and parameter counts, checkpoint URIs of every scheme (hf://ORG/NAME@REVISION
included, and some without their revision), every backend and draft method (with and without a
draft checkpoint), rollout bounds, every draft-length and reconfigure bound, canary steps,
retraining templates of every supported kind). Each body goes through ``CrdAdmission`` built
from the generated CRD (defaulting, schema, CEL) first, as the API server would; only what it
admits is checked. ``check_admitted`` then runs what the reconciler and the tick run without I/O
(model validation, the revision step's config, the tick interval, the revision step's decisions
from Baseline through Dynamic with status written and read back between them
(control_status.state_from_status), rendering of the stable and canary children for the
revisions decided, advisories, readiness, the training Job) and asserts that nothing raises
except the deliberate refusals (RenderError, TemplateError), and that every rendered name and
label is one the API server accepts (``object_names``).

``specops bench fuzz [--examples N] [--json OUT]`` runs thousands of examples and reports
how many were admitted and every crash class found (exception type and where it was raised).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specops.api.models import BACKENDS, TEMPLATE_KINDS, SpeculativeDeployment
from specops.api.status import PodsApplied, SpeculativeDeploymentStatus
from specops.api.units import PARAMETERS_PATTERN
from specops.domain import control_status, drafts, lifecycle, profile_prior, revision_step
from specops.domain.calibration import CalibrationConfig
from specops.domain.engines.schedule import Revision
from specops.domain.metrics import Measurement
from specops.domain.names import CANARY, STABLE
from specops.domain.render import RenderError, RenderOptions, render_children
from specops.domain.retraining import TemplateError, Trigger, render_training_job
from specops.domain.retraining.naming import output_version
from specops.services.canary import canary_revision
from specops.services.tick import interval_of
from specops_local.admission import AdmissionError, CrdAdmission
from specops_local.object_names import metadata_causes

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "specops.dev_speculativedeployments.yaml"
OPTIONS = RenderOptions(triton_model_source="# the LLM API model\n", pod_monitor=True)

_UNITS = st.sampled_from(["ms", "s", "m", "h"])
_NUMBER = st.one_of(
    st.integers(0, 3).map(str), st.integers(0, 100_000).map(str), st.from_regex(r"\A[0-9]{1,4}\.[0-9]{1,3}\Z")
)


@st.composite
def any_durations(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.tuples(_NUMBER, _UNITS), min_size=1, max_size=3))
    return "".join(number + unit for number, unit in parts)


_FACTORS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@st.composite
def durations(draw: st.DrawFn, low: float, high: float) -> str:
    """Mostly within [low, high] seconds (its ends included) in any unit or compound form; sometimes anything."""
    if draw(st.integers(0, 19)) == 19:  # (hypothesis leans to small draws: the rare branch is the high one)
        return draw(any_durations())
    seconds = draw(st.one_of(st.sampled_from([low, high]), st.floats(low, high)))
    if draw(st.booleans()) and seconds >= 1:
        whole = int(seconds)
        hours, rest = divmod(whole, 3600)
        minutes, secs = divmod(rest, 60)
        text = "".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)
        return text or "0s"
    unit = draw(st.sampled_from([u for u, f in _FACTORS.items() if seconds / f < 1e6]))
    value = seconds / _FACTORS[unit]
    return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3f}{unit}"


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-."
resource_names = st.one_of(
    st.sampled_from(["llama-3.1-70b", "70b-chat", "qwen3-30b-a3b", "a", "0", "m.v2"]),
    st.text(_NAME_CHARS, min_size=1, max_size=253),
    st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,80}[a-z0-9])?(\.[a-z0-9]{1,20}){0,3}\Z"),
)
parameters = st.one_of(
    st.sampled_from(["70B", "7B", "1B", "0.5B", "70e9", "1e15", "0.000001", "9999999999999999.999999e15"]),
    st.from_regex(PARAMETERS_PATTERN.replace("^", r"\A").replace("$", r"\Z")),
)
model_names = st.one_of(
    st.sampled_from(["llama-3.1-70b", "llama-3.1-8b", "org/model:tag", "Qwen/Qwen3-32B"]),
    st.text(min_size=1, max_size=253),
)
checkpoint_uris = st.one_of(
    st.from_regex(r"\Apvc://[a-z0-9-]{1,20}/[a-zA-Z0-9._/-]{0,40}\Z"),
    st.from_regex(r"\A(s3|gs)://[a-zA-Z0-9._/-]{1,40}\Z"),
    st.from_regex(r"\Ahf://[A-Za-z0-9._-]{1,20}/[A-Za-z0-9._-]{1,30}@[A-Za-z0-9._-]{1,40}\Z"),
)
refused_uris = st.one_of(  # past the rules: a hub checkpoint without its revision, a scheme not served
    st.from_regex(r"\Ahf://[A-Za-z0-9._-]{1,20}/[A-Za-z0-9._-]{1,30}\Z"),
    st.from_regex(r"\A(file|https)://[a-zA-Z0-9._/-]{1,40}\Z"),
)
target_parameters = st.sampled_from(["70B", "8B", "235B", "405B", "32B", "70e9"])
draft_parameters = st.sampled_from(["1B", "0.5B", "7B", "500M", "1.5e9", "250M"])


@st.composite
def uris(draw: st.DrawFn) -> str:
    """A checkpoint URI of any scheme, now and then one the CRD refuses."""
    return draw(refused_uris) if draw(st.integers(0, 19)) == 19 else draw(checkpoint_uris)


methods = st.sampled_from(["draftModel", "eagle3", "mtp", "ngram"])
versions = st.from_regex(r"\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?\Z")
optional = st.booleans()


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A SpeculativeDeployment over the whole spec, mostly inside the CRD's rules, sometimes at or past them."""
    max_draft_len = draw(st.integers(1, 16)) if draw(st.integers(0, 9)) else draw(st.integers(1, 32))
    low = draw(st.integers(1, max_draft_len))
    high = draw(st.integers(low, max_draft_len))
    gpus = draw(st.sampled_from([1, 2, 4, 8, 16]))
    tensor_parallel = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if gpus % d == 0]))
    method = draw(methods)
    # a checkpoint where the method loads one, mostly; now and then the other way round
    with_checkpoint = (method in ("draftModel", "eagle3")) != (draw(st.integers(0, 9)) == 9)
    draft: dict[str, Any] = {
        "model": draw(model_names),
        "version": draw(versions),
        "method": method,
        "kind": draw(st.sampled_from(["standalone", "expertDistilled"])),
    }
    if with_checkpoint:
        draft["uri"] = draw(uris())
    if method == "draftModel" or draw(optional):
        draft["parameters"] = draw(draft_parameters) if draw(st.integers(0, 4)) else draw(parameters)
    surge = draw(st.integers(0, 3))
    spec: dict[str, Any] = {
        "target": {
            "model": draw(model_names),
            "version": draw(versions),
            "architecture": draw(st.sampled_from(["dense", "moe"])),
            "parameters": draw(target_parameters) if draw(st.integers(0, 4)) else draw(parameters),
            "precision": draw(st.sampled_from(["bf16", "fp16", "fp8", "int8", "int4"])),
            "uri": draw(uris()),
        },
        "draft": draft,
        "serving": {
            "backend": draw(st.sampled_from(BACKENDS)),
            "replicas": draw(st.integers(0, 1000)),
            "gpu": {"type": draw(st.sampled_from(["H100", "H200", "A100", "L40S", "B200"])), "count": gpus},
            "tensorParallel": tensor_parallel,
            "maxSurge": surge,
            "maxUnavailable": draw(st.integers(0 if surge else 1, 3)),
        },
        "speculation": {
            "mode": draw(st.sampled_from(["auto", "on", "off"])),
            "draftLength": {"min": low, "initial": draw(st.integers(low, high)), "max": high},
            "rollout": {"baseline": draw(durations(0, 86400)), "soak": draw(durations(0, 86400))},
            "reconfigure": {
                "minGain": draw(st.floats(0.0, 1.0)),
                "minInterval": draw(durations(0, 2592000)),
                "margin": draw(st.floats(0.0, 1.0)),
            },
        },
        "slo": {"minAcceptance": draw(st.floats(0.0, 1.0))},
        "metrics": {"interval": draw(durations(1, 3600))},
        "canary": {
            "steps": [
                {"weight": weight, "pause": draw(durations(0, 86400))}
                for weight in sorted(draw(st.sets(st.integers(1, 100), min_size=1, max_size=20)))
            ],
        },
    }
    if draw(optional):
        label_keys = st.one_of(
            st.from_regex(r"\A([a-z0-9.-]{1,20}/)?[A-Za-z0-9._-]{1,70}\Z"), st.text(min_size=1, max_size=20)
        )
        label_values = st.one_of(st.from_regex(r"\A[A-Za-z0-9._-]{0,64}\Z"), st.text(max_size=10))
        spec["serving"]["podLabels"] = draw(st.dictionaries(label_keys, label_values, max_size=3))
        spec["serving"]["nodeSelector"] = draw(st.dictionaries(label_keys, label_values, max_size=2))
    if draw(st.integers(0, 9)):  # mostly: every uri but pvc:// needs it
        spec["serving"]["checkpointFetcherImage"] = "registry.example.com/fetch-checkpoint:1"
    if draw(optional):
        spec["serving"]["image"] = draw(
            st.sampled_from(
                ["registry.example.com/engine:1", "vllm/vllm-openai:v0.11.0", "engine@sha256:" + "a" * 64]
            )
        )
    if draw(optional):
        spec["target"]["activeParameters"] = draw(parameters)
    if draw(optional):
        spec["slo"]["perTokenLatencyP99"] = draw(durations(0.001, 60))
    if draw(optional):
        spec["speculation"]["calibration"] = {
            "enabled": draw(st.booleans()),
            "halfLife": draw(durations(60, 604800)),
        }
    if draw(optional):
        api_version, kind = draw(st.sampled_from(TEMPLATE_KINDS))
        spec["retraining"] = {
            "enabled": True,
            "image": "registry.example.com/trainer:1",
            "data": {"uri": draw(st.from_regex(r"\A(s3|gs|pvc|file|https|hf)://[a-z0-9._/-]{1,30}\Z"))},
            "triggers": {
                "acceptanceBelowSLO": {
                    "for": draw(durations(60, 604800)),
                    "cooldown": draw(durations(0, 2592000)),
                }
            },
        }
        if draw(optional):
            spec["retraining"]["template"] = {"apiVersion": api_version, "kind": kind, "spec": {}}
    return {
        "apiVersion": "specops.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": draw(resource_names), "namespace": "default", "uid": "uid-1", "generation": 1},
        "spec": spec,
    }


def load_admission(path: Path = CRD_PATH) -> CrdAdmission:
    return CrdAdmission(yaml.safe_load(path.read_text()))


def admit(admission: CrdAdmission, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The body as the API server stores it, or None when it refuses it."""
    try:
        return admission("CREATE", copy.deepcopy(dict(body)), None)
    except AdmissionError:
        return None


def _names_refused(children: list[dict[str, Any]]) -> list[str]:
    return [
        f"{child['kind']}/{child['metadata']['name']}: {field_name}: {message}"
        for child in children
        for field_name, message in metadata_causes(child["kind"], child)
    ]


def _decide_through_every_phase(resource: SpeculativeDeployment, *, off_reason: str | None) -> list[Revision]:
    """The revision step's pure decisions from a fresh start through baseline, soak and tuning, its
    state written to status and read back between steps as a restart would; the revisions decided."""
    spec = resource.spec
    config = revision_step.config_from_spec(
        spec, drafts.stable_draft(spec.draft, resource.status), off_reason=off_reason
    )
    model = profile_prior.prior_model(config.setup, CalibrationConfig(), None)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    status = resource.status
    step = max(spec.seconds(spec.metrics.interval), 1.0)
    horizon = spec.seconds(spec.speculation.rollout.baseline) + spec.seconds(spec.speculation.rollout.soak)
    moments = [start + timedelta(seconds=t) for t in (0.0, step, horizon + step, horizon + 10 * step)]
    revisions = []
    for index, moment in enumerate(moments):
        state = control_status.state_from_status(status.speculation, status.baseline, config, model, moment)
        measurement = Measurement(
            phase="Ok",
            at=moment,
            alpha=(0.05, 0.6, 0.95, 0.8)[index],
            acceptance_rate=0.5,
            mean_draft_length=4.0,
            batch=(1.0, 64.0, 4096.0, 8.0)[index],
            request_rate=5.0,
            tokens_per_s=500.0,
            tpot_p50_s=0.01,
            tpot_p95_s=0.02,
            tpot_p99_s=0.03,
            pods_reporting=1,
        )
        inputs = control_status.inputs_from(measurement, rollout_running=index == 1, canary_running=False)
        decision = revision_step.step(config, state, inputs, model, moment)
        revision = decision.state.revision
        assert revision.mode == "plain" or revision.schedule is not None, revision
        if revision.schedule is not None:
            assert revision.schedule.max_k <= max(1, config.max_k), (revision.describe(), config.max_k)
        pods = PodsApplied(desired=spec.serving.replicas, applied=0)
        speculation = control_status.speculation_status(decision, inputs, moment, pods, None)
        written = status.model_copy(
            update={
                "speculation": speculation,
                "baseline": control_status.baseline_status(decision.state, status.baseline),
            }
        )
        # what status holds is what the next tick reads: the wire form and back
        status = SpeculativeDeploymentStatus.from_wire(written.to_wire())
        assert control_status.revision_from_status(status.speculation.revision) == revision, (
            revision.describe()
        )
        revisions.append(revision)
    return revisions


def check_admitted(body: Mapping[str, Any]) -> None:
    """What reconcile and tick compute without I/O, on an admitted body: raises on any crash.

    RenderError and TemplateError are deliberate refusals (they become conditions) and pass.
    An AssertionError means the models refused what the CRD admitted, or a rendered name or
    label is one the API server would refuse.
    """
    resource = SpeculativeDeployment.model_validate(dict(body))  # the CRD and the models must agree
    spec = resource.spec
    for duration in (spec.metrics.interval, spec.speculation.rollout.baseline, spec.speculation.rollout.soak):
        seconds = spec.seconds(duration)
        assert 0 <= seconds <= 30 * 86400, f"{duration} -> {seconds}"
    lifecycle.advisories(spec)
    drafts.draft_to_status(spec.draft, "Spec")
    assert 1.0 <= interval_of(dict(body), 15.0) <= 3600.0
    _decide_through_every_phase(resource, off_reason="the draft is stale")
    revisions = _decide_through_every_phase(resource, off_reason=None)
    draft = drafts.stable_draft(spec.draft, resource.status)
    renders = [(STABLE, revision) for revision in {r.digest: r for r in revisions}.values()]
    renders.append((CANARY, canary_revision(resource, draft)))
    for variant, revision in renders:
        try:
            children = render_children(resource, OPTIONS, revision, variant=variant, draft=draft)
        except RenderError:
            continue
        refused = _names_refused(children)
        assert not refused, refused
        deployments = [child for child in children if child["kind"] == "Deployment"]
        lifecycle.readiness(spec.serving.replicas, deployments)
    if spec.retraining.enabled:
        output = output_version(spec.draft.version, spec.target.version, 1)
        trigger = Trigger("TargetVersionChanged", spec.target.version, 1, output, "fuzz")
        try:
            job = render_training_job(resource, trigger)
        except (TemplateError, RenderError):
            return
        refused = _names_refused([job])
        assert not refused, refused


# ---------------------------------------------------------------- the bench


@dataclass
class FuzzReport:
    examples: int = 0
    admitted: int = 0
    refused: int = 0
    seconds: float = 0.0
    crash_classes: Counter[str] = field(default_factory=Counter)
    first_bodies: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "admitted": self.admitted,
            "refused_by_admission": self.refused,
            "seconds": round(self.seconds, 1),
            "crash_classes": dict(self.crash_classes),
            "crash_examples": self.first_bodies,
        }


def crash_class(error: BaseException) -> str:
    """``ZeroDivisionError at specops/domain/perf.py:95``: the exception type and the frame that raised it."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if "/specops/" in frame.filename] or frames
    where = own[-1] if own else None
    location = f"{where.filename.split('/operator/')[-1]}:{where.lineno}" if where else "?"
    return f"{type(error).__name__} at {location}"


def run_fuzz(examples: int, seed: int | None = None) -> FuzzReport:
    """Run ``examples`` drawn bodies through admission and ``check_admitted``, recording every crash class."""
    admission = load_admission()
    report = FuzzReport()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=seed is None,
        suppress_health_check=list(HealthCheck),
    )
    @given(bodies())
    def one(body: dict[str, Any]) -> None:
        report.examples += 1
        admitted = admit(admission, body)
        if admitted is None:
            report.refused += 1
            return
        report.admitted += 1
        try:
            check_admitted(admitted)
        except Exception as error:  # a crash class: recorded, the run goes on
            name = crash_class(error)
            report.crash_classes[name] += 1
            report.first_bodies.setdefault(name, {"error": str(error)[:300], "body": admitted})

    started = time.monotonic()
    if seed is not None:
        one = settings(derandomize=False)(one)
        from hypothesis import seed as hypothesis_seed

        one = hypothesis_seed(seed)(one)
    one()
    report.seconds = time.monotonic() - started
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="specops bench fuzz", description="Admitted specs never crash the operator's pure code."
    )
    default = int(os.environ.get("SPECOPS_FUZZ_EXAMPLES", "3000"))
    parser.add_argument(
        "--examples",
        type=int,
        default=default,
        help="bodies to draw (default $SPECOPS_FUZZ_EXAMPLES or 3000)",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    report = run_fuzz(args.examples, args.seed)
    print(
        f"fuzz: {report.examples} examples, {report.admitted} admitted, {report.refused} refused by admission, "
        f"{len(report.crash_classes)} crash classes in {report.seconds:.1f}s"
    )
    for name, count in report.crash_classes.most_common():
        print(f"  {count:5d}  {name}")
    if args.json:
        args.json.write_text(json.dumps(report.as_json(), indent=2, default=str) + "\n")
    return 1 if report.crash_classes else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
