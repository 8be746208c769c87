"""Online calibration: learn a deployment's real step times from what its pods show.

The roofline (`perf.py`) is the prior. Each observation (batch per pod, draft length in
force, per-token latency, alpha while speculating) is one noisy sample of a step time:
TPOT itself when off (a plain step), TPOT x E(alpha, g) when on (a speculative round).
The model of both is linear in six parameters, with the roofline as one feature:

    plain(B)    = s R_plain(B)    + p0 + p1 B
    round(g, B) = s R_round(g, B) + p0 + p1 B + q0 + q1 g + q2 g B

- `s` scales the roofline (kernel efficiency; prior 1): it keeps the roofline's shape,
  including its compute knee, where data is thin;
- `p0` a fixed cost per step (launches, scheduling, sampling; prior 0);
- `p1` a cost per sequence per step (KV reads, attention; prior 0);
- `q0` a fixed cost per speculative round (rejection sampling, bookkeeping; prior 0, never below);
- `q1` a cost per draft token (the draft's launch floor, per-token overhead; prior 0);
- `q2` a cost per draft token per sequence (verification compute, the draft's own batch
  cost; prior 0).

Each term is one thing real engines are known to add to the ideal roofline, so a handful of
samples pins them down and the fit extrapolates sensibly between measured batches.

Fitting is Bayesian linear regression: a Gaussian prior around (1, 0, 0, 0, 0, 0) and
relative (multiplicative) noise, so each sample weighs 1 / (sigma y)^2. The data's
sufficient statistics (X'WX, X'Wy, y'Wy, weights) decay with a half-life, so recent
samples count more and the prior wins back only where data has aged away. With no data the
prediction is the roofline exactly. State is bounded: 21 + 6 + 2 floats of statistics and
two small histograms of effective samples per batch octave (on and off), never raw samples.

Exploration helpers at the end plan bounded probes: when off, brief spells on to see whether
speculation pays where the model is unsure or near break-even; when on, brief spells off to
keep plain speed at the current batch known.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import InitVar, dataclass, field

from specops.domain.perf import ModelSetup, expected_tokens, target_step_time
from specops.domain.records import replace

PARAMETERS = ("s", "p0", "p1", "q0", "q1", "q2")
N_PARAMS = len(PARAMETERS)
# p1 and q2, the per-sequence costs, set how the fit extrapolates in batch; q0, what a round adds to
# a step, is no saving: all kept >= 0 (a fit from one batch would otherwise buy cheap short rounds
# elsewhere with a negative q0, and a K=1 round would come out faster than a plain step)
NON_NEGATIVE = (2, 3, 5)
UNMEASURED_BELOW = 0.5  # effective on-samples near a batch below which its rounds count as unmeasured
TABLES_KEPT = 4
"""Speedup tables one model remembers (`CalibratedModel.speedup_table`)."""
N_BUCKETS = 11  # batch octaves 1, 2, 4, ..., 1024 (and above)
MAX_BATCH = 1024


@dataclass(frozen=True)
class CalibrationConfig:
    """How fast the model forgets, how noisy samples are, and how firm the prior is."""

    half_life_s: float = 1800.0  # a sample's weight halves every 30 minutes
    relative_noise: float = 0.05  # sigma of one TPOT sample relative to its value
    prior_scale_sigma: float = 0.5  # prior sd of s (efficiency 1 +- 0.5)
    # prior sds of the corrections, as fractions of the roofline's plain step at batch 1 (T1)
    prior_fixed_sigma: float = 1.0  # p0 and q0: up to about one T1
    prior_per_sequence_sigma: float = 1.0 / 32  # p1: doubling the step over 32 sequences
    prior_per_token_sigma: float = 0.5  # q1: half a T1 per draft token
    prior_per_token_sequence_sigma: float = 1.0 / 128  # q2
    # A gain counts as assured at its lower bound: the posterior mean less this many standard
    # deviations of the predicted speedup (`assured_speedup`). Switching on where the budget could
    # not pay the way back off asks for an assured clear gain, not a modelled one.
    assured_sigmas: float = 1.0


@dataclass(frozen=True)
class CalibrationState:
    """Decayed sufficient statistics of the observations: what status keeps between ticks.

    `xtx` is the upper triangle of X'WX (row-major), `xty` X'Wy, `yty` y'Wy, `weight` the sum
    of sample weights; `on_counts` / `off_counts` the decayed number of samples per batch
    octave with speculation on / off. Times are in seconds since an arbitrary epoch.
    """

    xtx: tuple[float, ...] = (0.0,) * (N_PARAMS * (N_PARAMS + 1) // 2)
    xty: tuple[float, ...] = (0.0,) * N_PARAMS
    yty: float = 0.0
    weight: float = 0.0
    on_counts: tuple[float, ...] = (0.0,) * N_BUCKETS
    off_counts: tuple[float, ...] = (0.0,) * N_BUCKETS
    samples: int = 0
    updated_at_s: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "xtx": list(self.xtx),
            "xty": list(self.xty),
            "yty": self.yty,
            "weight": self.weight,
            "onCounts": list(self.on_counts),
            "offCounts": list(self.off_counts),
            "samples": self.samples,
            "updatedAt": self.updated_at_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> CalibrationState:
        def floats(key: str, size: int) -> tuple[float, ...]:
            values = data.get(key)
            if not isinstance(values, list) or len(values) != size:
                raise ValueError(f"calibration state '{key}' must be a list of {size} numbers")
            return tuple(float(v) for v in values)

        updated = data.get("updatedAt")
        yty, weight, samples = data.get("yty", 0.0), data.get("weight", 0.0), data.get("samples", 0)
        assert isinstance(yty, int | float) and isinstance(weight, int | float) and isinstance(samples, int)
        return cls(
            xtx=floats("xtx", N_PARAMS * (N_PARAMS + 1) // 2),
            xty=floats("xty", N_PARAMS),
            yty=float(yty),
            weight=float(weight),
            on_counts=floats("onCounts", N_BUCKETS),
            off_counts=floats("offCounts", N_BUCKETS),
            samples=samples,
            updated_at_s=None if updated is None else float(updated),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class StepSample:
    """One observation of one pod over one interval."""

    batch: float
    draft_length: int  # in force over the interval; 0 = off
    tpot_s: float  # per-token latency (p50) over the interval
    alpha: float | None = None  # measured acceptance, needed when draft_length > 0
    context_tokens: float | None = None


@dataclass(frozen=True)
class Confidence:
    """Effective (decayed) samples near one batch: with speculation on, and off."""

    on: float
    off: float


def bucket_of(batch: float) -> int:
    """The batch octave index: 0 for batch <= 1, 1 for (1, 2], ..., capped at the last."""
    if batch <= 1.0:
        return 0
    return min(N_BUCKETS - 1, math.ceil(math.log2(batch) - 1e-9))


def _near(counts: Sequence[float], bucket: int) -> float:
    """Effective samples at an octave, its neighbours counting half (`CalibratedModel.confidence`)."""
    total = counts[bucket]
    for neighbour in (bucket - 1, bucket + 1):
        if 0 <= neighbour < N_BUCKETS:
            total += 0.5 * counts[neighbour]
    return total


def update(
    state: CalibrationState,
    sample: StepSample,
    setup: ModelSetup,
    now_s: float,
    config: CalibrationConfig | None = None,
) -> CalibrationState:
    """The state with `sample` added at time `now_s` (older statistics decayed first)."""
    config = config or CalibrationConfig()
    state = decay(state, now_s, config)
    if sample.tpot_s <= 0 or sample.batch <= 0 or not math.isfinite(sample.tpot_s):
        return state
    g = sample.draft_length
    if g > 0:
        if sample.alpha is None:
            return state
        y = sample.tpot_s * expected_tokens(sample.alpha, g)
    else:
        y = sample.tpot_s
    roof = _roofline(setup)
    x = roof.features(g, sample.batch, sample.context_tokens)
    scale = roof.scale
    y_scaled = y / scale
    w = 1.0 / (config.relative_noise * y_scaled) ** 2
    xtx = list(state.xtx)
    index = 0
    for i in range(N_PARAMS):
        for j in range(i, N_PARAMS):
            xtx[index] += w * x[i] * x[j]
            index += 1
    xty = tuple([c + w * xi * y_scaled for c, xi in zip(state.xty, x, strict=True)])
    bucket = bucket_of(sample.batch)
    on = list(state.on_counts)
    off = list(state.off_counts)
    (on if g > 0 else off)[bucket] += 1.0
    return replace(
        state,
        xtx=tuple(xtx),
        xty=xty,
        yty=state.yty + w * y_scaled * y_scaled,
        weight=state.weight + w,
        on_counts=tuple(on),
        off_counts=tuple(off),
        samples=state.samples + 1,
    )


def decay(state: CalibrationState, now_s: float, config: CalibrationConfig | None = None) -> CalibrationState:
    """Statistics aged to `now_s`: every weight multiplied by 0.5^(elapsed / half-life)."""
    config = config or CalibrationConfig()
    if state.updated_at_s is None or now_s <= state.updated_at_s:
        return replace(state, updated_at_s=now_s if state.updated_at_s is None else state.updated_at_s)
    factor = 0.5 ** ((now_s - state.updated_at_s) / config.half_life_s)
    # list comprehensions, not generators: the same products, without a generator each (every
    # sample decays the statistics first, at every rest of every resource)
    return CalibrationState(
        xtx=tuple([v * factor for v in state.xtx]),
        xty=tuple([v * factor for v in state.xty]),
        yty=state.yty * factor,
        weight=state.weight * factor,
        on_counts=tuple([v * factor for v in state.on_counts]),
        off_counts=tuple([v * factor for v in state.off_counts]),
        samples=state.samples,
        updated_at_s=now_s,
    )


THETA_KEY_DIGITS = 3
"""Significant digits of a solve's parameters that identify its model's break-even (`Fit.theta_key`)."""


@dataclass(frozen=True)
class Fit:
    """One posterior solve: its parameters, those the non-negativity left free, and what it was
    solved from (the statistics are what `refit_due` compares newer statistics with)."""

    theta: tuple[float, ...]
    free: tuple[int, ...]
    solved_from: CalibrationState
    setup: ModelSetup
    config: CalibrationConfig

    @functools.cached_property
    def theta_key(self) -> tuple[float, ...]:
        """The parameters to THETA_KEY_DIGITS significant digits, worked out once per solve: what
        identifies a model whose break-even is already known (`learning.break_even`)."""
        return tuple(float(f"{t:.{THETA_KEY_DIGITS}g}") for t in self.theta)


REFIT_AFTER_SAMPLES = 4
"""A fit is solved again at least every this many new samples."""
REFIT_GROWTH = 0.05
"""... and as soon as the evidence in any batch octave (on or off) or in all grew by more than
this share since the solve, or aged by it (the prior wins back as data decay)."""


def refit_due(solved_from: CalibrationState, state: CalibrationState, config: CalibrationConfig) -> bool:
    """Whether `state` holds enough news since `solved_from` for its fit to move.

    A deployment's statistics gain one sample an interval, against some hundred effective ones
    at a 30-minute half-life: where the load sits, a new sample moves the fit in its third or
    fourth digit, and the posterior solve (with the break-even search it invalidates) was a
    tenth of a steady fleet's CPU. So the fit is solved again after REFIT_AFTER_SAMPLES samples,
    or at once when a sample lands where evidence is thin (an octave whose decayed count grew
    by more than REFIT_GROWTH: a first sample there always does), when the whole grew by that
    much, or when decay took that much away. Everything else (the confidence counts that steer
    probes and the guard, the fit error) always reads the newest statistics."""
    if state.samples < solved_from.samples or state.samples - solved_from.samples >= REFIT_AFTER_SAMPLES:
        return True
    if (state.updated_at_s is None) != (solved_from.updated_at_s is None):
        return True
    kept = 1.0
    if state.updated_at_s is not None and solved_from.updated_at_s is not None:
        if state.updated_at_s < solved_from.updated_at_s:
            return True
        kept = 0.5 ** ((state.updated_at_s - solved_from.updated_at_s) / config.half_life_s)
        if kept < 1.0 - REFIT_GROWTH:
            return True

    def grew(now: float, then: float) -> bool:
        return now - then * kept > REFIT_GROWTH * then * kept

    if grew(state.weight, solved_from.weight):
        return True
    pairs = zip(
        (*state.on_counts, *state.off_counts), (*solved_from.on_counts, *solved_from.off_counts), strict=True
    )
    return any(grew(now, then) for now, then in pairs)


@dataclass(frozen=True)
class CalibratedModel:
    """Posterior mean step times of one deployment: the roofline prior corrected by its data.

    `keep`: a solve to keep (`refitted`) instead of solving `state` again; `fit` is the solve in use."""

    setup: ModelSetup
    state: CalibrationState = field(default_factory=CalibrationState)
    config: CalibrationConfig = field(default_factory=CalibrationConfig)
    keep: InitVar[Fit | None] = None
    fit: Fit = field(init=False, repr=False, compare=False)
    theta: tuple[float, ...] = field(init=False)
    _free: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _tables: dict[tuple[float, float, int, int, float | None], tuple[float, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self, keep: Fit | None) -> None:
        fit = keep
        if fit is None:
            theta, free = _posterior(self.state, self._prior_sds())
            fit = Fit(theta, free, self.state, self.setup, self.config)
        object.__setattr__(self, "fit", fit)
        object.__setattr__(self, "theta", fit.theta)
        object.__setattr__(self, "_free", fit.free)

    @functools.cached_property
    def _covariance(self) -> list[list[float]]:
        """Posterior covariance of the parameters (those the non-negativity kept free), scaled up by
        the fit's own residuals where they exceed the assumed noise: a shape that does not fit the
        engine shows as wider bounds, not as false confidence."""
        a = _precision(self.state, self._prior_sds())
        free = self._free
        sub = [[a[i][j] for j in free] for i in free]
        unit = [[1.0 if k == j else 0.0 for k in range(len(free))] for j in range(len(free))]
        columns = [_solve_spd(sub, column) for column in unit]
        error = self.relative_fit_error()
        inflate = max(1.0, (error / self.config.relative_noise) ** 2) if error is not None else 1.0
        cov = [[0.0] * N_PARAMS for _ in range(N_PARAMS)]
        for row, i in enumerate(free):
            for col, j in enumerate(free):
                cov[i][j] = columns[col][row] * inflate
        return cov

    def speedup_sigma(self, draft_length: int, batch: float, context_tokens: float | None = None) -> float:
        """Standard deviation of the log of the predicted speedup of `draft_length` at `batch`
        (delta method on plain(B) / round(g, B); the acceptance is taken as known)."""
        if draft_length <= 0:
            return 0.0
        x_plain = self._roof.features(0, batch, context_tokens)
        x_round = self._roof.features(draft_length, batch, context_tokens)
        plain = sum(t * x for t, x in zip(self.theta, x_plain, strict=True))
        rounds = sum(t * x for t, x in zip(self.theta, x_round, strict=True))
        if plain <= 0.0 or rounds <= 0.0:
            return 0.0
        grad = [p / plain - r / rounds for p, r in zip(x_plain, x_round, strict=True)]
        cov = self._covariance
        variance = sum(grad[i] * cov[i][j] * grad[j] for i in range(N_PARAMS) for j in range(N_PARAMS))
        return math.sqrt(max(0.0, variance))

    def assured_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        """The predicted speedup lowered by `assured_sigmas` of its uncertainty: a gain the fit's
        own data back, not one it extrapolates to a length it barely measured. Where no speculative
        round was measured near this batch the prediction is the prior's (bounded by the roofline,
        `predict_speedup`), and stands as it is: what needs checking is an extrapolation from data,
        which can bend far past both the data and the prior."""
        mean = self.predict_speedup(alpha, draft_length, batch, context_tokens)
        if draft_length <= 0 or self.confidence(batch).on < UNMEASURED_BELOW:
            return mean
        sigma = self.speedup_sigma(draft_length, batch, context_tokens)
        return mean * math.exp(-self.config.assured_sigmas * sigma)

    def assured(self) -> AssuredGain:
        """This model seen by its lower bound (a `policy.SpeedupModel`)."""
        return AssuredGain(self)

    def _prior_sds(self) -> tuple[float, ...]:
        c = self.config
        return (
            c.prior_scale_sigma,
            c.prior_fixed_sigma,
            c.prior_per_sequence_sigma,
            c.prior_fixed_sigma,
            c.prior_per_token_sigma,
            c.prior_per_token_sequence_sigma,
        )

    @property
    def calibrated(self) -> bool:
        """Whether any data shapes the model (else it is the roofline prior)."""
        return self.state.weight > 0.0

    @functools.cached_property
    def _roof(self) -> _Roofline:
        return _roofline(self.setup)

    def step_s(self, draft_length: int, batch: float, context_tokens: float | None = None) -> float:
        """Predicted seconds per plain step (length 0) or per speculative round."""
        return self._step_from(self._roof.features(draft_length, batch, context_tokens))

    def _step_from(self, x: tuple[float, ...]) -> float:
        scale = self._roof.scale
        t = self.theta  # the dot product written out: the same sums in the same order as sum(),
        # without a generator (the break-even search asks for a few hundred steps a tick)
        value = (t[0] * x[0] + t[1] * x[1] + t[2] * x[2] + t[3] * x[3] + t[4] * x[4] + t[5] * x[5]) * scale
        # A linear fit can dip below what the hardware allows far from its data; no step is
        # faster than a tenth of the roofline's.
        floor = 0.1 * x[0] * scale
        return max(value, floor)

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        """E(alpha, g) x plain(B) / round(g, B) under the calibrated model; 1.0 when g = 0."""
        if draft_length <= 0:
            return 1.0
        return self._speedup_list(
            (draft_length,), (expected_tokens(alpha, draft_length),), batch, context_tokens
        )[0]

    def speedup_table(
        self, alpha: float, batch: float, lo: int, hi: int, context_tokens: float | None = None
    ) -> tuple[float, ...]:
        """`predict_speedup` of every length lo..hi (lo >= 1) at one batch, in one pass: the same
        arithmetic, the plain step and the roofline's cap worked out once. A decision asks about
        the lengths at its batch a dozen times (the best, the current, the one it holds), and once
        unbatched; the model's tables are remembered (a few: a model lives for one tick)."""
        key = (alpha, batch, lo, hi, context_tokens)
        table = self._tables.get(key)
        if table is None:
            lengths = range(lo, hi + 1)
            tokens = [expected_tokens(alpha, g) for g in lengths]
            table = tuple(self._speedup_list(lengths, tokens, batch, context_tokens))
            if len(self._tables) >= TABLES_KEPT:
                self._tables.clear()
            self._tables[key] = table
        return table

    def _speedup_list(
        self,
        lengths: Sequence[int],
        tokens: Sequence[float],
        batch: float,
        context_tokens: float | None = None,
        *,
        first_paying: bool = False,
    ) -> list[float]:
        """The predicted speedup of each length (>= 1) at one batch, given its expected tokens per
        round; with ``first_paying``, only up to the first that beats plain (a break-even search
        asks only whether one does).

        Where rounds near the batch are unmeasured (`_unmeasured`) a speedup is capped at the
        roofline's: E x plain / round of the prior, which the roofline features give directly.

        `_step_from(features(g, batch))` written out per length: the same products and sums in the
        same order (the features' constant 1.0s multiply exactly), so the same values to the last
        bit, without a feature tuple and two calls per point. A decision evaluates a few dozen
        points, a break-even search about a hundred: this was a fifth of a tick's CPU."""
        roof = self._roof
        x = roof.features(0, batch, context_tokens)
        plain = self._step_from(x)
        capped = self._unmeasured(batch)
        b = x[2]
        t0, t1, t2, t3, t4, t5 = self.theta
        scale = roof.scale
        t2b = t2 * b
        found: list[float] = []
        for g, e, x0 in zip(lengths, tokens, roof.round_costs(lengths, batch, context_tokens), strict=True):
            gf = float(g)
            step = max((t0 * x0 + t1 + t2b + t3 + t4 * gf + t5 * (gf * b)) * scale, 0.1 * x0 * scale)
            speedup = e * plain / step
            if capped:
                speedup = min(speedup, e * x[0] / x0)
            found.append(speedup)
            if first_paying and speedup > 1.0:
                break
        return found

    def _unmeasured(self, batch: float) -> bool:
        """Whether rounds near this batch count as unmeasured: there the fit promises no more than
        the roofline (`_speedups`), since a linear fit extrapolated from small batches can
        make rounds look cheap at large ones."""
        return self.unmeasured_octaves()[bucket_of(batch)]

    def unmeasured_octaves(self) -> tuple[bool, ...]:
        """For each batch octave, whether its rounds count as unmeasured (`_unmeasured`)."""
        return self._unmeasured_octaves

    @functools.cached_property
    def _unmeasured_octaves(self) -> tuple[bool, ...]:
        # confidence depends on the batch's octave only: worked out once per model, not at each
        # of the few hundred points a decision evaluates
        if not self.calibrated:
            return (False,) * N_BUCKETS
        on = self.state.on_counts
        return tuple(_near(on, bucket) < UNMEASURED_BELOW for bucket in range(N_BUCKETS))

    def best_length(
        self, alpha: float, batch: float, bounds: tuple[int, int], context_tokens: float | None = None
    ) -> tuple[int, float]:
        """The length in [lo, hi] with the highest predicted speedup, or (0, 1.0) when none beats plain."""
        lo, hi = max(1, bounds[0]), max(1, bounds[1])
        best_g, best_s = 0, 1.0
        for g, s in enumerate(self.speedup_table(alpha, batch, lo, hi, context_tokens), start=lo):
            if s > best_s:
                best_g, best_s = g, s
        return best_g, best_s

    def break_even_batch(
        self, alpha: float, draft_length: int | tuple[int, int], max_batch: int = MAX_BATCH
    ) -> int | None:
        """Smallest batch at which speculation no longer pays; None if it pays up to max_batch.

        `draft_length` is one length, or (lo, hi) for "no length in the range pays".
        """
        bounds = (draft_length, draft_length) if isinstance(draft_length, int) else draft_length
        pays = self._pays(alpha, bounds)

        if not pays(1):
            return 1
        previous = 1
        batch = 2
        while batch <= max_batch:
            if not pays(batch):
                lo, hi = previous, batch
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if pays(mid):
                        lo = mid
                    else:
                        hi = mid
                return hi
            previous = batch
            batch = min(max_batch, batch * 2) if batch < max_batch else max_batch + 1
        return None

    def _pays(self, alpha: float, bounds: tuple[int, int]) -> Callable[[int], bool]:
        """Whether some length in bounds pays at a batch: `best_length(...)[0] > 0`, cheaper for a
        search that asks at a dozen batches: the expected tokens per round are worked out once,
        and the first length that pays ends the look (the search only asks whether one does)."""
        lo, hi = max(1, bounds[0]), max(1, bounds[1])
        lengths = range(lo, hi + 1)
        tokens = [expected_tokens(alpha, g) for g in lengths]

        def pays(batch: int) -> bool:
            return self._speedup_list(lengths, tokens, batch, first_paying=True)[-1] > 1.0

        return pays

    def confidence(self, batch: float) -> Confidence:
        """Effective samples at this batch's octave (neighbouring octaves count half)."""
        bucket = bucket_of(batch)
        return Confidence(on=_near(self.state.on_counts, bucket), off=_near(self.state.off_counts, bucket))

    def relative_fit_error(self) -> float | None:
        """Weighted RMS of the relative residuals of the data still remembered; None without data."""
        return self._relative_fit_error

    @functools.cached_property
    def _relative_fit_error(self) -> float | None:
        # asked by the status, the assured gain's covariance and Events: worked out once per model
        s = self.state
        if s.weight <= 0:
            return None
        theta, packed = self.theta, s.xtx
        quad = 0.0  # theta' A theta over the packed upper triangle, term by term in row order
        for i, row in enumerate(_PACKED_INDEX):
            ti = theta[i]
            for j, index in enumerate(row):
                quad += ti * packed[index] * theta[j]
        linear = sum(t * c for t, c in zip(self.theta, s.xty, strict=True))
        residual = max(0.0, s.yty - 2.0 * linear + quad)
        count = sum(s.on_counts) + sum(s.off_counts)
        return math.sqrt(residual / count) * self.config.relative_noise if count > 0 else None

    def parameters(self) -> dict[str, float]:
        """The fitted parameters; p*, q* in seconds (per sequence / per token as named)."""
        scale = self._roof.scale
        return {
            name: value if name == "s" else value * scale
            for name, value in zip(PARAMETERS, self.theta, strict=True)
        }


@dataclass(frozen=True)
class AssuredGain:
    """A calibrated model's lower bound as a speedup model (`CalibratedModel.assured_speedup`)."""

    model: CalibratedModel

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        return self.model.assured_speedup(alpha, draft_length, batch, context_tokens)


# --------------------------------------------------------------------- exploration


@dataclass(frozen=True)
class ProbeConfig:
    """Bounds of exploration: how much time probes may take and how often they may start."""

    max_fraction: float = 0.02  # probes take at most this share of the time ...
    budget_window_s: float = 3600.0  # ... of the elapsed time, or of this window while younger
    min_spacing_s: float = 180.0  # between the end of one probe and the start of the next
    probe_duration_s: float = 15.0  # one probe lasts about one decision interval
    min_samples: float = 0.5  # fewer effective samples than this near the batch = uncertain
    near_break_even: float = 0.05  # |predicted best speedup - 1| below this = worth checking
    refresh_off_after_s: float = 1800.0  # while on, re-measure plain speed at least this often
    # While on, skip the probe off where the predicted best speedup is at least this and the
    # measured rounds agree with the prior's within `prior_agrees` (the roofline holds here): a
    # spell off costs most where speculation gains most, and could not change the decision: with
    # the rounds within 20 % of the prior, plain speed would have to be 25 % off the fit's (which
    # shares its per-step terms with the rounds) to bring 1.3x down to the off threshold.
    off_below_speedup: float = 1.3
    prior_agrees: float = 0.2


@dataclass(frozen=True)
class ProbeLedger:
    """What exploration has spent: probe seconds against all seconds, and the last probe."""

    started_at_s: float | None = None
    elapsed_s: float = 0.0
    probe_s: float = 0.0
    last_probe_end_s: float | None = None
    probing_until_s: float | None = None
    probes: int = 0

    @property
    def cost_fraction(self) -> float:
        return self.probe_s / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class ProbePlan:
    """Whether to probe now, at which length (0 = a probe off), and why."""

    probe: bool
    draft_length: int
    reason: str


def account(ledger: ProbeLedger, now_s: float, dt_s: float, probing: bool) -> ProbeLedger:
    """The ledger after dt seconds, `probing` or not; a probe that ended is recorded as such."""
    started = ledger.started_at_s if ledger.started_at_s is not None else now_s - dt_s
    probe_s = ledger.probe_s + (dt_s if probing else 0.0)
    until = ledger.probing_until_s
    last_end = ledger.last_probe_end_s
    if until is not None and now_s >= until:
        last_end, until = now_s, None
    return replace(ledger, started_at_s=started, elapsed_s=ledger.elapsed_s + dt_s, probe_s=probe_s,
                   probing_until_s=until, last_probe_end_s=last_end)  # fmt: skip


def budget_allows(ledger: ProbeLedger, now_s: float, config: ProbeConfig, *, urgent: bool = False) -> bool:
    """A new probe fits: spacing since the last one, and the share of time after it stays bounded.

    The share is of max(elapsed, budget window): a young deployment may spend the first
    window's budget at once, which is when its model knows least; after one window probes
    never exceed `max_fraction` of the time. An `urgent` probe (a batch region with no
    samples at all on that side) waits only one probe duration after the last, not the spacing.
    """
    if ledger.probing_until_s is not None:
        return False
    spacing = config.probe_duration_s if urgent else config.min_spacing_s
    if ledger.last_probe_end_s is not None and now_s - ledger.last_probe_end_s < spacing:
        return False
    horizon = max(ledger.elapsed_s, config.budget_window_s) + config.probe_duration_s
    return ledger.probe_s + config.probe_duration_s <= config.max_fraction * horizon


def plan_probe(
    model: CalibratedModel,
    ledger: ProbeLedger,
    now_s: float,
    *,
    enabled: bool,
    alpha: float,
    batch: float,
    bounds: tuple[int, int],
    current_length: int,
    config: ProbeConfig | None = None,
) -> ProbePlan:
    """Whether the next interval should be a probe, within the budget.

    Off: probe on (at the predicted best length, or the shortest) when the model has few
    on-samples near this batch or predicts a speedup near break-even. On: probe off when
    plain speed near this batch is unmeasured or older than `refresh_off_after_s` (no
    probe since then).
    """
    config = config or ProbeConfig()
    seen = model.confidence(batch)
    unseen = (seen.off if enabled else seen.on) < 0.25  # nothing measured on that side near here
    if not budget_allows(ledger, now_s, config, urgent=unseen):
        return ProbePlan(False, current_length if enabled else 0, "probe budget or spacing")
    if not enabled:
        best_g, _best_s = model.best_length(alpha, batch, bounds)
        length = best_g if best_g > 0 else max(1, bounds[0])
        if seen.on < config.min_samples:
            return ProbePlan(True, length, f"only {seen.on:.1f} samples on near batch {batch:.0f}")
        closest = max_speedup(model, alpha, batch, bounds)
        if abs(closest - 1.0) < config.near_break_even:
            return ProbePlan(True, length, f"predicted {closest:.2f}x is near break-even")
        return ProbePlan(False, 0, "the model is sure speculation does not pay here")
    predicted = max_speedup(model, alpha, batch, bounds)
    if predicted >= config.off_below_speedup and current_length > 0 and seen.on >= config.min_samples:
        prior = roofline_model(model.setup, model.config)
        deviation = model.step_s(current_length, batch) / prior.step_s(current_length, batch) - 1.0
        if abs(deviation) <= config.prior_agrees:
            return ProbePlan(
                False, current_length, f"predicted {predicted:.2f}x where the rounds match the prior"
            )
    stale = ledger.last_probe_end_s is None or now_s - ledger.last_probe_end_s >= config.refresh_off_after_s
    if seen.off < config.min_samples:
        return ProbePlan(True, 0, f"only {seen.off:.1f} samples off near batch {batch:.0f}")
    if stale:
        return ProbePlan(True, 0, "plain speed not re-measured recently")
    return ProbePlan(False, current_length, "plain speed here is known")


def start_probe(ledger: ProbeLedger, now_s: float, config: ProbeConfig | None = None) -> ProbeLedger:
    """The ledger with a probe running from now for one probe duration."""
    config = config or ProbeConfig()
    return replace(ledger, probing_until_s=now_s + config.probe_duration_s, probes=ledger.probes + 1)


def max_speedup(model: CalibratedModel, alpha: float, batch: float, bounds: tuple[int, int]) -> float:
    """The highest predicted speedup of any length in bounds, below 1 too (how far from paying)."""
    lo, hi = max(1, bounds[0]), max(1, bounds[1])
    return max(model.speedup_table(alpha, batch, lo, hi))


# --------------------------------------------------------------------- linear algebra


@dataclass(frozen=True)
class _Roofline:
    """The roofline's step times (`perf.py`) for one setup, its constants worked out once.

    A decision evaluates the model at a few hundred (length, batch) points (best lengths, the
    break-even search, the assured gain); through `perf` each point cost a dataclass `replace` and
    a hash of the setup. Here a point is a handful of multiplications, in the same order as
    `perf._step_time`, so the values are the same to the last bit."""

    context_tokens: float
    bandwidth: float
    flops: float
    target_params: float
    target_weight_bytes: float
    draft_params: float
    draft_weight_bytes: float
    kv_bytes_per_token_per_param: float
    overhead_s: float
    scale: float
    """T1: the roofline's plain step at batch 1 without context; features and targets are in its units."""

    def _step(self, params: float, weight_bytes: float, batch: float, tokens: float, context: float) -> float:
        kv_bytes = batch * context * params * self.kv_bytes_per_token_per_param
        memory_s = (weight_bytes + kv_bytes) / self.bandwidth
        compute_s = 2.0 * params * batch * tokens / self.flops
        return max(memory_s, compute_s)

    def features(
        self, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> tuple[float, ...]:
        """The regression's features (the roofline in T1 units, then the correction terms)."""
        context = self.context_tokens if context_tokens is None else context_tokens
        b = max(1.0, batch)
        if draft_length <= 0:
            plain = self._step(self.target_params, self.target_weight_bytes, b, 1.0, context)
            return (plain / self.scale, 1.0, b, 0.0, 0.0, 0.0)
        g = float(draft_length)
        rounds = (
            draft_length * self._step(self.draft_params, self.draft_weight_bytes, b, 1.0, context)
            + self._step(self.target_params, self.target_weight_bytes, b, draft_length + 1.0, context)
            + self.overhead_s
        )
        return (rounds / self.scale, 1.0, b, 1.0, g, g * b)

    def round_costs(
        self, lengths: Sequence[int], batch: float, context_tokens: float | None = None
    ) -> Iterator[float]:
        """`features(g, batch)[0]` of each length (all >= 1) at one batch, the parts every length
        shares worked out once: the draft's step, and the target's memory time and compute per
        token. The same operations in the same order as `features`, so the same values to the last
        bit; yielded one length at a time (a break-even search stops at the first length that pays)."""
        context = self.context_tokens if context_tokens is None else context_tokens
        b = max(1.0, batch)
        draft_step = self._step(self.draft_params, self.draft_weight_bytes, b, 1.0, context)
        params = self.target_params
        kv_bytes = b * context * params * self.kv_bytes_per_token_per_param
        memory_s = (self.target_weight_bytes + kv_bytes) / self.bandwidth
        per_token = 2.0 * params * b
        flops, overhead, scale = self.flops, self.overhead_s, self.scale
        for draft_length in lengths:
            target_step = max(memory_s, per_token * (draft_length + 1.0) / flops)
            yield (draft_length * draft_step + target_step + overhead) / scale


@functools.lru_cache(maxsize=256)
def _roofline(setup: ModelSetup) -> _Roofline:
    gpus = max(1, setup.tensor_parallel)
    return _Roofline(
        context_tokens=setup.context_tokens,
        bandwidth=setup.gpu.hbm_bytes_per_s * gpus * setup.efficiency,
        flops=setup.gpu.bf16_flops * gpus * setup.efficiency,
        target_params=setup.target_params,
        target_weight_bytes=setup.target_params * setup.bytes_per_param,
        draft_params=setup.draft_params,
        draft_weight_bytes=setup.draft_params * setup.bytes_per_param,
        kv_bytes_per_token_per_param=setup.kv_bytes_per_token_per_param,
        overhead_s=setup.overhead_s,
        scale=target_step_time(setup.with_context(0.0), 1.0),
    )


_PACKED_INDEX: tuple[tuple[int, ...], ...] = tuple(
    tuple(
        min(i, j) * N_PARAMS - min(i, j) * (min(i, j) - 1) // 2 + (max(i, j) - min(i, j))
        for j in range(N_PARAMS)
    )
    for i in range(N_PARAMS)
)
"""Where A[i][j] sits in the packed upper triangle (`_unpack`'s order)."""


def _unpack(upper: Sequence[float]) -> list[list[float]]:
    a = [[0.0] * N_PARAMS for _ in range(N_PARAMS)]
    index = 0
    for i in range(N_PARAMS):
        for j in range(i, N_PARAMS):
            a[i][j] = a[j][i] = upper[index]
            index += 1
    return a


def _precision(state: CalibrationState, prior_sds: Sequence[float]) -> list[list[float]]:
    """P + X'WX: the posterior precision of the parameters."""
    a = _unpack(state.xtx)
    for i, sd in enumerate(prior_sds):
        a[i][i] += 1.0 / (sd * sd)
    return a


@functools.lru_cache(maxsize=256)
def roofline_model(setup: ModelSetup, config: CalibrationConfig) -> CalibratedModel:
    """The model before any data (the roofline itself), solved once per setup."""
    return CalibratedModel(setup, CalibrationState(), config)


def refitted(
    previous: Fit | None, setup: ModelSetup, state: CalibrationState, config: CalibrationConfig
) -> CalibratedModel:
    """The model of `state`, keeping the `previous` solve when `refit_due` finds no news since it."""
    if (
        previous is not None
        and previous.setup == setup
        and previous.config == config
        and not refit_due(previous.solved_from, state, config)
    ):
        return CalibratedModel(setup, state, config, keep=previous)
    return CalibratedModel(setup, state, config)


def _posterior(
    state: CalibrationState, prior_sds: Sequence[float]
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """The posterior mean and the parameters the non-negativity left free.

    Solve (P + X'WX) theta = P mu + X'Wy, P = diag(1 / sd^2), mu = (1, 0, ..., 0), with the
    per-sequence costs p1 and q2 kept >= 0.

    More sequences never make a step cheaper. A free fit can make a slope negative to match a
    few samples at one batch, and the plain step then vanishes at batches nobody measured
    (speculation "loses" at batch 80 where the data say 2x). Active set: a slope the solution
    drives below zero is fixed at zero and the rest solved again (at most two rounds; 6 x 6).
    The fixed costs stay free: a prior for a different engine can be off either way.
    """
    a = _precision(state, prior_sds)
    b = list(state.xty)
    prior_mean = (1.0,) + (0.0,) * (N_PARAMS - 1)
    for i, sd in enumerate(prior_sds):
        b[i] += prior_mean[i] / (sd * sd)
    free = list(range(N_PARAMS))
    while True:
        solved = _solve_spd([[a[i][j] for j in free] for i in free], [b[i] for i in free])
        theta = [0.0] * N_PARAMS
        for index, value in zip(free, solved, strict=True):
            theta[index] = value
        negative = [i for i in free if i in NON_NEGATIVE and theta[i] < 0.0]
        if not negative:
            return tuple(theta), tuple(free)
        free.remove(min(negative, key=lambda i: theta[i]))


def _solve_spd(a: list[list[float]], b: list[float]) -> list[float]:
    """Cholesky solve of a symmetric positive definite system (small: 6 x 6).

    The dot products are written out as loops adding in order from 0.0, which is what ``sum`` of a
    generator did here on CPython 3.11 (the same floats bit for bit), without a generator each:
    the solve was a sixth of a resource's rest."""
    n = len(b)
    lower = [[0.0] * n for _ in range(n)]
    for i in range(n):
        row, li = a[i], lower[i]
        for j in range(i + 1):
            lj = lower[j]
            dot = 0.0
            for k in range(j):
                dot += li[k] * lj[k]
            total = row[j] - dot
            if i == j:
                li[i] = math.sqrt(max(total, 1e-300))
            else:
                li[j] = total / lj[j]
    y = [0.0] * n
    for i in range(n):
        li = lower[i]
        dot = 0.0
        for k in range(i):
            dot += li[k] * y[k]
        y[i] = (b[i] - dot) / li[i]
    x = [0.0] * n
    for i in reversed(range(n)):
        dot = 0.0
        for k in range(i + 1, n):
            dot += lower[k][i] * x[k]
        x[i] = (y[i] - dot) / lower[i][i]
    return x
