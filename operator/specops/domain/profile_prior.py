"""A serving profile measured offline as the calibration's prior, instead of the bare roofline.

`spec.speculation.calibration.profile` names a ConfigMap holding a profile (docs/profiles.md).
The calibrated model is a Bayesian linear fit kept as sufficient statistics (domain.calibration);
a profile enters it as pseudo-observations: one plain step and one round per draft length at
each of its batches, scaled so that the whole profile weighs as PROFILE_PRIOR_SAMPLES
measurements. These statistics never decay and never count as measurements (the confidence
histograms, which steer probes and the slowdown guard, hold the deployment's own samples
only), so the deployment's measurements override the profile as they accumulate, and the model
returns to the profile, not to the roofline, where they have aged away. With no measurement
the model predicts the profile (within the fit's few per cent of the shipped profiles).

Pure.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from specops.domain.calibration import (
    MAX_BATCH,
    CalibratedModel,
    CalibrationConfig,
    CalibrationState,
    Fit,
    StepSample,
    refitted,
    update,
)
from specops.domain.perf import ModelSetup, expected_tokens
from specops.domain.profile import ServingProfile

PROFILE_PRIOR_SAMPLES = 20.0  # the profile weighs as this many measurements in all
_ALPHA = 0.7  # any acceptance: a pseudo-round is recorded as its round time


def prior_statistics(
    profile: ServingProfile, setup: ModelSetup, config: CalibrationConfig, max_length: int
) -> CalibrationState:
    """The profile as undecaying statistics worth PROFILE_PRIOR_SAMPLES measurements (no counts)."""
    state = CalibrationState()
    lengths = [g for g in range(1, max(1, max_length) + 1)]
    count = 0
    for batch in profile.batches:
        if batch > MAX_BATCH:
            continue
        samples = [StepSample(batch, 0, profile.plain_ms_at(batch) / 1e3)]
        for g in lengths:
            round_s = profile.round_ms_at(g, batch) / 1e3
            samples.append(StepSample(batch, g, round_s / expected_tokens(_ALPHA, g), _ALPHA))
        for sample in samples:
            state = update(state, sample, setup, 0.0, config)
            count += 1
    factor = PROFILE_PRIOR_SAMPLES / max(1, count)
    return CalibrationState(
        xtx=tuple(v * factor for v in state.xtx),
        xty=tuple(v * factor for v in state.xty),
        yty=state.yty * factor,
        weight=state.weight * factor,
    )


def combined(data: CalibrationState, prior: CalibrationState | None) -> CalibrationState:
    """The deployment's statistics plus the profile's (the counts and sample total stay its own)."""
    if prior is None:
        return data
    return replace(
        data,
        xtx=tuple(a + b for a, b in zip(data.xtx, prior.xtx, strict=True)),
        xty=tuple(a + b for a, b in zip(data.xty, prior.xty, strict=True)),
        yty=data.yty + prior.yty,
        weight=data.weight + prior.weight,
    )


def model(
    setup: ModelSetup,
    data: CalibrationState,
    config: CalibrationConfig,
    prior: CalibrationState | None,
    previous: Fit | None = None,
) -> CalibratedModel:
    """The calibrated model from the profile prior (or the roofline's, without one) and the data.

    `previous`: the last solve of the same deployment's model with the same prior, kept while
    the data hold no news (`calibration.refitted`)."""
    return refitted(previous, setup, combined(data, prior), config)


@functools.lru_cache(maxsize=256)
def prior_model(
    setup: ModelSetup, config: CalibrationConfig, prior: CalibrationState | None
) -> CalibratedModel:
    """The model before any data: the same for every resource of one setup, so solved once (the
    posterior solve was a thirtieth of a steady tick, done for every resource every tick)."""
    return model(setup, CalibrationState(), config, prior)
