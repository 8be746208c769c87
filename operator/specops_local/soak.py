"""The chaos soak: the whole local stack under a random, seeded schedule of faults, invariants checked every tick.

``specops local soak --seconds 3600 --seed 1`` (``make soak``; CI runs 300 s) starts the local
stack (emulated API server, Debian's Prometheus, simulated serving engines, the real operator)
with a few SpeculativeDeployments, two of them behind a Gateway API HTTPRoute, and then, one
after another with random gaps, injects:

- ``api-5xx-burst``: a share of the API writes (and half that share of the reads) answered 503 for a few seconds;
- ``watch-cut``: every watch stream ended, the watch history compacted (resumes get 410 Gone);
- ``prometheus-down``: Prometheus stopped for a while, then started on the same port and data;
- ``pod-crash``: one serving engine's process dies for a while and starts again (not ready until
  it reloaded), while its resource's load crosses break-even and comes back;
- ``load-surge``: one resource's load past break-even for a while (the engines' schedule gives K=0
  there; the operator may roll out another revision);
- ``operator-restart``: the operator stopped and started again, preferably mid-canary;
- ``new-draft``: a new draft version in spec.draft (a canary; some drafts are worse, some not lossless);
- ``spec-revert``: a new draft version in spec.draft, then, a random moment into its canary, the
  edit reverted (``git revert`` and a sync): the canary ends unpromoted and the stable draft serves;
- ``target-change``: a new target version (the draft goes stale, a training Job runs; the soak
  plays the Job controller and publishes the trained draft, which goes through a canary). The
  first round of a soak fails instead, its trainer's termination message carrying secrets;
- ``api-429-storm``: a share of the API requests answered 429 with ``Retry-After: 5`` for a while;
- ``metrics-nonfinite``: every engine of one resource exports NaN, +Inf or negative values for a
  while (Prometheus scrapes them as they are); it measures when MetricsUnavailable said so;
- ``route-elsewhere-at-deletion``: a resource whose HTTPRoute names another Service (not its
  stable one) is deleted; it measures how long the deletion took, then creates the resource again.

One resource's Prometheus URL carries a password, and the secrets of the corpus
(``tests/data/secret_shapes.txt``) are what the secret check looks for.

Every ``--check-interval`` seconds it checks, from the API server's store and the pods:

- ``route-to-missing-backend``: every HTTPRoute backendRef names a Service that exists;
- ``duplicate-training-job``: at most one unfinished training Job per resource, one Job per round;
- ``no-ready-condition``: every resource (30 s after creation) has a Ready condition;
- ``crash-loop``: no handler fails with an unexpected exception 3 times in a row, and no resource
  stays Degraded with TickFailed for 3 checks;
- ``revision-mismatch``: the stable variant's pods converge to the configuration revision in
  status (status.speculation.revision): every stable pod carries its digest within a rollout's
  time (each pod restarts, ``restart_s``) plus 2 decision intervals (longer only while a fault
  that explains it lasts, and for a grace of 2 intervals after: status writes failing, the
  operator down, the pod itself faulted); and an engine on that revision runs exactly its
  schedule (the K its parsed config gives at each batch is the status schedule's);
- ``serving-draft-not-spec``: once no canary runs, every running stable pod serves the spec's
  draft (its ``specops.dev/draft-version`` label) within a rollout's time, as for revisions.
  Only two drafts may serve instead, and then status.draft must: a spec draft a canary rejected
  (``rejectedDraft``), and a retraining draft promoted while spec.draft stayed as it was;
- ``stuck-in-deletion``: no resource stays deleted (deletionTimestamp) for more than 2 minutes
  without a True Degraded condition saying why;
- ``secret-in-output``: no secret of the corpus in any resource's status, any Event, or any log
  line of the process;
- ``non-finite-status``: no number in any resource's status is NaN or infinite, nor negative
  (but a predicted gain, and the canary's step before its first).

After each fault it measures the recovery time (until the resources are healthy again, see
``recovered``) and prints a summary: faults by kind, violations by invariant (must be 0),
recovery times, canary outcomes. The JSON (``--json``) holds the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kmock

from specops.api.models import DraftSpec
from specops.api.units import parse_duration
from specops.domain.drafts import draft_key
from specops.domain.names import LABEL_DEPLOYMENT
from specops.domain.phases import ACTIVE_PHASES
from specops.domain.retraining.naming import LABEL_JOB, LABEL_ROUND
from specops_local.serving import DRAFT_VERSION_LABEL, DraftBehaviour, PodSlot
from specops_local.sim import LoadPoint
from specops_local.stack import RESTART_S, LocalStack, fast_resource, local_stack, log_to_file
from specops_local.training import publish_result
from specops_local.upstream_crds import upstream_crds

log = logging.getLogger(__name__)

SPECULATIVE = "speculativedeployments"
INVARIANTS = (
    "route-to-missing-backend",
    "duplicate-training-job",
    "no-ready-condition",
    "crash-loop",
    "revision-mismatch",
    "serving-draft-not-spec",
    "stuck-in-deletion",
    "secret-in-output",
    "non-finite-status",
)
FAULT_KINDS = (
    "api-5xx-burst",
    "watch-cut",
    "prometheus-down",
    "pod-crash",
    "load-surge",
    "operator-restart",
    "new-draft",
    "spec-revert",
    "target-change",
    "api-429-storm",
    "metrics-nonfinite",
    "route-elsewhere-at-deletion",
)
BACKGROUND = frozenset({"new-draft", "target-change"})
"""Faults that start a canary: followed in the background while the next faults strike."""
FRESH_AFTER = frozenset(
    {
        "api-5xx-burst",
        "watch-cut",
        "prometheus-down",
        "operator-restart",
        "api-429-storm",
        "metrics-nonfinite",
    }
)
"""Faults after which recovery also waits for every resource's status to be refreshed by the operator."""
ALPHA = 0.8
LOAD = LoadPoint(batch=16, alpha=ALPHA)
SURGE = LoadPoint(batch=300, alpha=ALPHA)
"""Past break-even for the dense example (about 251 at alpha 0.8): the schedule gives K=0 there."""
INTERVAL = "2s"
REPLICAS = 2
"""Stable pods per resource (fast_resource's default)."""
SCHEDULE_PROBES = (1, 8, 16, 32, 64, 128, 256, 1024)
"""Batches at which an engine's parsed schedule is compared with the one status names."""
READY_GRACE_S = 30.0
DELETION_GRACE_S = 120.0
"""How long a deletion may last without a condition saying why."""
RETRY_AFTER_S = 5
SECRETS_CORPUS = Path(__file__).resolve().parents[2] / "tests" / "data" / "secret_shapes.txt"
PROMETHEUS_PASSWORD = "Fak3Pa55word"
"""The password in one resource's Prometheus URL (the corpus's url-userinfo secret)."""
TRAINER_FAILURE = (
    "Traceback (most recent call last): upload failed: huggingface-cli upload --token "
    "FakeTok3nValue9Z org/draft\nexport AWS_SECRET_KEY=FakeAwsSecret/Key+Value0\n"
    "request header Authorization: Bearer fake.jwt.valuefake01"
)
"""The termination message of the soak's failing trainer: secrets of the corpus."""
TRAINER_FAILED = "its trainer failed"
"""The detail of the target change whose training Job failed."""
CRASH_LOOP_COUNT = 3
RECOVERY_TIMEOUT_S = 120.0
CANARY = {
    "steps": [{"weight": 25, "pause": "6s"}, {"weight": 50, "pause": "6s"}],
    "goldenPrompts": {"prompts": ["What is the capital of France?"], "maxTokens": 16},
}
RETRAINING = {
    "enabled": True,
    "method": "onPolicy",
    "image": "registry.example.com/specops-trainer:1",
    "data": {"uri": "s3://prompts/soak/"},
}


@dataclass(frozen=True)
class SoakResource:
    name: str
    example: str
    route: bool
    retraining: bool


RESOURCES = (
    SoakResource("llama-70b-chat", "dense-70b-7b.yaml", route=True, retraining=True),
    SoakResource("qwen3-moe", "moe-expert-distilled.yaml", route=False, retraining=False),
    SoakResource("llama-70b-batch", "dense-70b-7b.yaml", route=True, retraining=False),
    SoakResource("qwen3-moe-b", "moe-expert-distilled.yaml", route=False, retraining=False),
)


@dataclass
class SoakSettings:
    seconds: float = 3600.0
    seed: int = 1
    resources: int = 3
    check_interval_s: float = 2.0
    gap_s: tuple[float, float] = (5.0, 15.0)
    """Quiet time between one fault's recovery and the next fault, drawn uniformly."""
    startup_timeout_s: float = 90.0
    kinds: tuple[str, ...] = FAULT_KINDS
    fault_scale: float = 1.0
    """Multiplies how long bursts, outages and faulty pods last."""
    """The faults drawn from: each round injects every kind once, in a seeded random order."""


@dataclass
class FaultRecord:
    kind: str
    target: str
    started_s: float
    ended_s: float | None = None
    ended_at: datetime | None = None
    cut_short: bool = False
    """Its canary was still running when the soak ended."""
    recovered_s: float | None = None
    detail: str = ""

    @property
    def recovery_s(self) -> float | None:
        if self.ended_s is None or self.recovered_s is None:
            return None
        return round(self.recovered_s - self.ended_s, 2)


@dataclass
class Violation:
    invariant: str
    at_s: float
    detail: str


@dataclass
class Excuse:
    """A fault that explains pods differing from status for a while: all resources, or one pod."""

    kind: str
    pod: str | None
    until_s: float | None  # None: the fault still lasts


HANDLER_MESSAGE = re.compile(r"^(?:Handler|Daemon|Timer|Activity) '([^']+)' ")
"""How Kopf names a handler in its log lines ("Daemon 'x' failed with an exception and will ...")."""


class HandlerFailures(logging.Handler):
    """Counts handlers failing with unexpected exceptions in a row, per handler and object (Kopf's logs)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.in_a_row: Counter[str] = Counter()
        self.worst: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        match = HANDLER_MESSAGE.match(message)
        if match is None:
            return
        handler = match.group(1)
        ref = getattr(record, "k8s_ref", None) or {}
        key = f"{handler} {ref.get('namespace', '')}/{ref.get('name', '')}"
        if "failed with an exception" in message:
            self.in_a_row[key] += 1
            self.worst[key] = max(self.worst[key], self.in_a_row[key])
        elif "succeeded" in message:
            self.in_a_row.pop(key, None)


class LogLines(logging.Handler):
    """Keeps the process's log lines (as handlers see them: redacted) until the next check reads them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # a malformed call: logging reports it itself
            return

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


def corpus_secrets(path: Path = SECRETS_CORPUS) -> list[str]:
    """The secrets of the corpus (third field of each line); none when the file is not there."""
    if not path.is_file():
        return []
    secrets = []
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and not line.startswith("#"):
            secrets.append(fields[2])
    return secrets


SENTINELS = {"status.canary.step": -1}
"""Negative numbers the API gives a meaning (the canary's step index before its first step)."""
SIGNED = frozenset({"status.speculation.predictedGain"})
"""Numbers that may be negative (a predicted loss); never NaN or infinite."""


def bad_numbers(value: Any, where: str = "status") -> list[str]:
    """Where a document holds a NaN or infinite number, or a negative one other than a sentinel or
    a signed field."""
    if isinstance(value, bool) or SENTINELS.get(where) == value:
        return []
    if isinstance(value, (int, float)):
        negative = value < 0 and where not in SIGNED
        return [f"{where} = {value}"] if not math.isfinite(value) or negative else []
    if isinstance(value, dict):
        return [bad for key, item in value.items() for bad in bad_numbers(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [bad for index, item in enumerate(value) for bad in bad_numbers(item, f"{where}[{index}]")]
    return []


def _conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    conditions = (body.get("status") or {}).get("conditions") or []
    return {c.get("type", ""): c for c in conditions if isinstance(c, dict)}


def round_order(kinds: Sequence[str], schedule: random.Random) -> list[str]:
    """One round's faults in the order they strike: shuffled, the background ones (a new draft's
    canary, a retraining round and its canary) first. The round's other faults then strike while
    those run (a restart mid-canary), and a 5-minute soak still sees them end: shuffled among the
    rest, a target change came at 269 s of 300 and its recovery went unmeasured."""
    order = list(kinds)
    schedule.shuffle(order)
    return sorted(order, key=lambda kind: kind not in BACKGROUND)


class Soak:
    def __init__(self, stack: LocalStack, settings: SoakSettings, drafts: dict[str, DraftBehaviour]) -> None:
        self.stack = stack
        self.settings = settings
        self.drafts = drafts
        self.schedule = random.Random(settings.seed)
        self.chance = random.Random(settings.seed + 1)  # the 5xx coin flips, apart from the schedule
        self.resources = list(RESOURCES[: max(1, min(settings.resources, len(RESOURCES)))])
        self.started = time.monotonic()
        self.created_s: dict[str, float] = {}
        self.faults: list[FaultRecord] = []
        self.violations: list[Violation] = []
        self.checks = 0
        self.excuses: list[Excuse] = []
        self.mismatch_since: dict[str, float] = {}
        self.draft_since: dict[str, float] = {}
        self.reported: set[str] = set()
        self.degraded_checks: Counter[str] = Counter()
        self.failures = HandlerFailures()
        self.write_failure_share = 0.0
        self.writes_failed = 0
        self.reads_failed = 0
        self.canaries: Counter[str] = Counter()
        self.versions = 4
        self.rounds = 0
        self.busy: set[str] = set()
        """Resources whose canary the soak follows (no second new draft until it ended)."""
        self.seen: Counter[str] = Counter()
        """What the checks looked at, so a report shows they had something to check."""
        self.check_errors = 0
        self.throttle_share = 0.0
        self.throttled = 0
        self.log_lines = LogLines()
        self.secrets = corpus_secrets()
        self.deleting_since: dict[str, float] = {}
        self.trainer_failed = False

    # ------------------------------------------------------------------ helpers

    def now_s(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def interval_s(self) -> float:
        return parse_duration(INTERVAL)

    def bodies(self) -> list[dict[str, Any]]:
        return [
            body
            for body in self.stack.cluster.objects(SPECULATIVE, self.stack.namespace)
            if body["metadata"]["name"] in {r.name for r in self.resources}
        ]

    def body(self, name: str) -> dict[str, Any] | None:
        return self.stack.cluster.get(SPECULATIVE, name, namespace=self.stack.namespace)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        """A person's kubectl patch, written straight into the store (the injected 5xx are the operator's)."""
        res = self.stack.cluster.resource(SPECULATIVE)
        self.stack.cluster.emulator.patch_object(res, self.stack.namespace, name, {"spec": spec})

    def violate(self, invariant: str, key: str, detail: str) -> None:
        """Count an invariant violation once per episode (key), so one stuck state is one violation."""
        if key in self.reported:
            return
        self.reported.add(key)
        self.violations.append(Violation(invariant, self.now_s(), detail))
        log.error("soak invariant %s violated at %.1f s: %s", invariant, self.now_s(), detail)

    def settle(self, key: str) -> None:
        self.reported.discard(key)

    # ------------------------------------------------------------------ start

    async def create_resources(self) -> None:
        for index, spec in enumerate(self.resources):
            await self.create_resource(spec, password=index == 1)

    async def create_resource(self, spec: SoakResource, *, password: bool = False) -> None:
        """One resource (and its route); with ``password``, its Prometheus URL carries one."""
        url = self.stack.prometheus.url
        if password:
            url = url.replace("://", f"://soak:{PROMETHEUS_PASSWORD}@", 1)
        body = fast_resource(
            spec.example,
            prometheus_url=url,
            namespace=self.stack.namespace,
            interval=INTERVAL,
            baseline="6s",
            soak="6s",
        )
        body["metadata"]["name"] = spec.name
        canary: dict[str, Any] = dict(CANARY)
        route = f"{spec.name}-route"
        if spec.route:
            canary["trafficRouting"] = {"gatewayAPI": {"httpRoute": route}}
        if spec.route and self.stack.cluster.get("httproutes", route, namespace=self.stack.namespace) is None:
            self.stack.cluster.create(
                "httproutes",
                {
                    "apiVersion": "gateway.networking.k8s.io/v1",
                    "kind": "HTTPRoute",
                    "metadata": {"name": route, "namespace": self.stack.namespace},
                    "spec": {
                        "parentRefs": [{"name": "gateway"}],
                        "rules": [{"backendRefs": [{"name": f"{spec.name}-stable", "port": 8000}]}],
                    },
                },
                namespace=self.stack.namespace,
            )
        body["spec"]["canary"] = canary
        if spec.retraining:
            body["spec"]["retraining"] = RETRAINING
        await self.stack.kube.create(body)
        self.created_s[spec.name] = self.now_s()

    async def wait_serving(self) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            phases = {b["metadata"]["name"]: (b.get("status") or {}).get("phase") for b in self.bodies()}
            if len(phases) == len(self.resources) and all(
                phase in ACTIVE_PHASES for phase in phases.values()
            ):
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"resources not serving after {self.settings.startup_timeout_s} s: {phases}")

    # ------------------------------------------------------------------ invariants

    async def check_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.check()
            except Exception:  # a check that cannot run is a soak bug: say it loudly, fail the run
                self.check_errors += 1
                log.exception("soak check failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.check_interval_s)

    def check(self) -> None:
        self.checks += 1
        self.check_routes()
        self.check_jobs()
        self.check_ready()
        self.check_crash_loops()
        self.check_revisions()
        self.check_serving_drafts()
        self.check_deletions()
        self.check_secrets()
        self.check_numbers()

    def check_deletions(self) -> None:
        now = self.now_s()
        deleting = set()
        for body in self.bodies():
            name = body["metadata"]["name"]
            if not body["metadata"].get("deletionTimestamp"):
                continue
            deleting.add(name)
            self.seen["deletions watched"] += 1
            since = self.deleting_since.setdefault(name, now)
            degraded = _conditions(body).get("Degraded") or {}
            key = f"deletion {name}"
            if now - since > DELETION_GRACE_S and degraded.get("status") != "True":
                self.violate(
                    "stuck-in-deletion",
                    key,
                    f"{name} deleted {now - since:.0f} s ago and still there, no condition says why",
                )
        for name in set(self.deleting_since) - deleting:
            del self.deleting_since[name]
            self.settle(f"deletion {name}")

    def check_secrets(self) -> None:
        if not self.secrets:
            return
        places = [
            (f"status of {body['metadata']['name']}", json.dumps(body.get("status") or {}))
            for body in self.bodies()
        ]
        places += [
            (f"Event {event['metadata']['name']}", f"{event.get('reason', '')} {event.get('message', '')}")
            for event in self.stack.cluster.objects("events", self.stack.namespace)
        ]
        places += [("a log line", line) for line in self.log_lines.take()]
        self.seen["secret scans"] += len(places)
        for where, text in places:
            for secret in self.secrets:
                if secret in text:
                    self.violate("secret-in-output", f"secret {where} {secret}", f"{where} shows {secret!r}")

    def check_numbers(self) -> None:
        for body in self.bodies():
            name = body["metadata"]["name"]
            bad = bad_numbers(body.get("status") or {})
            self.seen["status number scans"] += 1
            if bad:
                self.violate("non-finite-status", f"numbers {name}", f"{name}: {', '.join(bad[:3])}")
            else:
                self.settle(f"numbers {name}")

    def check_routes(self) -> None:
        cluster, namespace = self.stack.cluster, self.stack.namespace
        services = {obj["metadata"]["name"] for obj in cluster.objects("services", namespace)}
        for route in cluster.objects("httproutes", namespace):
            for rule in route["spec"].get("rules") or []:
                for ref in rule.get("backendRefs") or []:
                    key = f"route {route['metadata']['name']} -> {ref['name']}"
                    if ref["name"].endswith("-canary"):
                        self.seen["route checks with a canary backend"] += 1
                    if ref["name"] not in services:
                        self.violate("route-to-missing-backend", key, f"{key}: no such Service")
                    else:
                        self.settle(key)

    def check_jobs(self) -> None:
        jobs = self.stack.cluster.objects("jobs", self.stack.namespace)
        active: Counter[str] = Counter()
        rounds: Counter[tuple[str, str]] = Counter()
        for job in jobs:
            labels = job["metadata"].get("labels") or {}
            owner = labels.get(LABEL_DEPLOYMENT, "")
            if labels.get(LABEL_ROUND):
                rounds[(owner, labels[LABEL_ROUND])] += 1
            done = {
                c.get("type")
                for c in (job.get("status") or {}).get("conditions") or []
                if c.get("status") == "True"
            }
            if not done & {"Complete", "Failed"}:
                active[owner] += 1
        for owner, count in active.items():
            if count > 1:
                self.violate("duplicate-training-job", f"active {owner}", f"{owner}: {count} unfinished Jobs")
        for (owner, number), count in rounds.items():
            if count > 1:
                self.violate(
                    "duplicate-training-job",
                    f"round {owner} {number}",
                    f"{owner}: {count} Jobs of round {number}",
                )

    def check_ready(self) -> None:
        for body in self.bodies():
            name = body["metadata"]["name"]
            if self.now_s() - self.created_s.get(name, 0.0) < READY_GRACE_S:
                continue
            key = f"ready {name}"
            if "Ready" not in _conditions(body):
                self.violate("no-ready-condition", key, f"{name} has no Ready condition")
            else:
                self.settle(key)

    def check_crash_loops(self) -> None:
        for key, count in self.failures.in_a_row.items():
            if count >= CRASH_LOOP_COUNT:
                self.violate("crash-loop", f"handler {key}", f"handler {key} failed {count} times in a row")
        for body in self.bodies():
            name = body["metadata"]["name"]
            degraded = _conditions(body).get("Degraded") or {}
            if degraded.get("status") == "True" and degraded.get("reason") == "TickFailed":
                self.degraded_checks[name] += 1
                if self.degraded_checks[name] >= CRASH_LOOP_COUNT:
                    self.violate("crash-loop", f"tick {name}", f"{name}: {degraded.get('message', '')}")
            else:
                self.degraded_checks.pop(name, None)
                self.settle(f"tick {name}")

    def excused(self, pod: str) -> bool:
        now = self.now_s()
        grace = 2 * self.interval_s()
        return any(
            (excuse.pod in (None, pod)) and (excuse.until_s is None or now < excuse.until_s + grace)
            for excuse in self.excuses
        )

    def stable_slots(self, name: str) -> list[PodSlot]:
        """The stable variant's pods of one resource (their revision label and engine)."""
        return [
            slot
            for serving in self.stack.serving.sets.values()
            if serving.owner == name and serving.variant == "stable"
            for slot in serving.slots
        ]

    def rollout_allowance_s(self) -> float:
        """How long a revision change may take to reach every pod: each pod restarts in turn
        (maxSurge 1, maxUnavailable 0), after the operator's decision and its write."""
        return 2 * self.interval_s() + self.settings.check_interval_s + REPLICAS * (RESTART_S + 2.0)

    def check_revisions(self) -> None:
        now = self.now_s()
        allowed = self.rollout_allowance_s()
        self.excuses = [e for e in self.excuses if e.until_s is None or now < e.until_s + 60.0]
        seen: set[str] = set()
        for body in self.bodies():
            name = body["metadata"]["name"]
            speculation = (body.get("status") or {}).get("speculation") or {}
            revision = speculation.get("revision") or {}
            digest = revision.get("digest")
            if not digest or not self.stack.operator.running:
                continue
            for slot in self.stable_slots(name):
                engine = slot.engine
                if engine is None or not engine.running:
                    continue
                key = f"revision {slot.name}"
                seen.add(key)
                self.seen["pod revision checks"] += 1
                problem = None
                if slot.revision != digest:
                    self.seen["pods on another revision within the allowance"] += 1
                    problem = f"runs revision {slot.revision}, status of {name} names {digest}"
                elif engine.ready:
                    self.seen["ready pods on the status revision, schedule compared"] += 1
                    wanted = schedule_ks(revision)
                    running = [engine.k_at(batch) for batch in SCHEDULE_PROBES]
                    if running != wanted:
                        problem = (
                            f"is labelled with revision {digest} ({speculation.get('schedule')}) but its engine "
                            f"drafts K {running} at batches {list(SCHEDULE_PROBES)}, not {wanted}"
                        )
                if problem is None or self.excused(slot.name):
                    self.mismatch_since.pop(key, None)
                    self.settle(key)
                    continue
                since = self.mismatch_since.setdefault(key, now)
                if now - since > allowed:
                    self.violate(
                        "revision-mismatch",
                        key,
                        f"{slot.name} {problem} ({speculation.get('reason')}) for {now - since:.0f} s",
                    )
        for key in set(self.mismatch_since) - seen:
            del self.mismatch_since[key]

    def serving_draft_problem(self, body: dict[str, Any]) -> str | None:
        """Why the stable pods do not serve the draft they should once no canary runs (None: they do,
        or a canary runs, or there is nothing to compare yet)."""
        name, status = body["metadata"]["name"], body.get("status") or {}
        recorded = status.get("draft") or {}
        if status.get("canary") is not None or not recorded.get("version"):
            return None
        spec_draft = body["spec"]["draft"]
        key = draft_key(DraftSpec.model_validate(spec_draft))
        retrained = recorded.get("source") == "Retraining" and status.get("observedSpecDraft") == key
        wanted = (
            recorded["version"] if key == status.get("rejectedDraft") or retrained else spec_draft["version"]
        )
        slots = [s for s in self.stable_slots(name) if s.engine is not None and s.engine.running]
        serving = sorted({str(slot.labels.get(DRAFT_VERSION_LABEL)) for slot in slots})
        self.seen["serving draft checks"] += 1
        if not slots or (serving == [wanted] and recorded["version"] == wanted):
            return None
        return (
            f"{name}: no canary runs, spec.draft names {spec_draft['version']}, status.draft "
            f"{recorded['version']}, stable pods serve {', '.join(serving)}"
        )

    def check_serving_drafts(self) -> None:
        now = self.now_s()
        allowed = self.rollout_allowance_s()
        for body in self.bodies():
            name = body["metadata"]["name"]
            key = f"serving draft {name}"
            problem = self.serving_draft_problem(body) if self.stack.operator.running else None
            if problem is None or any(self.excused(slot.name) for slot in self.stable_slots(name)):
                self.draft_since.pop(key, None)
                self.settle(key)
                continue
            since = self.draft_since.setdefault(key, now)
            if now - since > allowed:
                self.violate("serving-draft-not-spec", key, f"{problem} for {now - since:.0f} s")

    def on_revision(self, name: str, speculation: dict[str, Any]) -> bool:
        """Every running stable pod carries the revision status names, and no rollout is under way."""
        digest = (speculation.get("revision") or {}).get("digest")
        slots = [s for s in self.stable_slots(name) if s.engine is not None and s.engine.running]
        return bool(digest) and all(s.revision == digest for s in slots)

    # ------------------------------------------------------------------ recovery

    def healthy(self, record: FaultRecord) -> bool:
        """Recovered: every resource Ready and not failing, every stable pod on the revision in status,
        and what the fault disturbed is back (fresh metrics, the draft's canary ended, the draft current)."""
        ended = record.ended_s or 0.0
        bodies = self.bodies()
        if len(bodies) < len(self.resources):
            return False
        for body in bodies:
            conditions = _conditions(body)
            if (conditions.get("Ready") or {}).get("status") != "True":
                return False
            if (conditions.get("Degraded") or {}).get("reason") == "TickFailed":
                return False
            speculation = (body.get("status") or {}).get("speculation") or {}
            if not self.on_revision(body["metadata"]["name"], speculation):
                return False
            if (
                record.kind in ("prometheus-down", "metrics-nonfinite")
                and (conditions.get("MetricsUnavailable") or {}).get("status") == "True"
            ):
                return False
            if record.kind in FRESH_AFTER and not self.refreshed_since(body, record.ended_at):
                return False
        target = self.body(record.target) if record.target else None
        status = (target or {}).get("status") or {}
        if record.kind == "spec-revert":
            return (
                status.get("canary") is None
                and target is not None
                and self.serving_draft_problem(target) is None
                and self.now_s() >= ended
            )
        if record.detail == TRAINER_FAILED:  # the round ended, and status says why
            retraining = status.get("retraining") or {}
            return not retraining.get("active") and bool(retraining.get("lastMessage"))
        if record.kind in BACKGROUND:
            # The draft's canary ended (a retraining round's once its Job published the draft).
            trained = record.kind == "new-draft" or not record.detail.startswith("target ")
            return (
                status.get("canary") is None
                and trained
                and self.canary_outcome(record.target, record.detail) is not None
            )
        return self.now_s() >= ended

    def refreshed_since(self, body: dict[str, Any], moment: datetime | None) -> bool:
        """The operator measured and wrote this resource's status after `moment` (it works again)."""
        if not self.stack.operator.running:
            return False
        at = ((body.get("status") or {}).get("observed") or {}).get("at")
        if not at or moment is None:
            return False
        return datetime.fromisoformat(str(at).replace("Z", "+00:00")) >= moment.replace(microsecond=0)

    def canary_outcome(self, name: str, version: str) -> str | None:
        status = (self.body(name) or {}).get("status") or {}
        if status.get("canary") is not None:
            return None
        if ((status.get("draft") or {}).get("version")) == version:
            return "Promoted"
        if str(status.get("rejectedDraft") or "").startswith(f"{version}@"):
            return "RolledBack"
        last = status.get("lastCanary") or {}
        if last.get("draft") == version and last.get("result") == "Superseded":
            return "Superseded"
        return None

    async def await_recovery(self, record: FaultRecord, stop: asyncio.Event) -> None:
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while not stop.is_set() and time.monotonic() < deadline:
            if self.healthy(record):
                record.recovered_s = self.now_s()
                return
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ faults

    def pick_resource(self, *, idle: bool = False, retraining: bool = False) -> str | None:
        candidates = []
        for spec in self.resources:
            status = (self.body(spec.name) or {}).get("status") or {}
            if idle and (status.get("canary") is not None or spec.name in self.busy):
                continue
            if retraining and not spec.retraining:
                continue
            candidates.append(spec.name)
        return self.schedule.choice(candidates) if candidates else None

    async def fault(self, kind: str, stop: asyncio.Event) -> FaultRecord | None:
        rng = self.schedule
        if kind == "api-5xx-burst":
            share, seconds = rng.uniform(0.3, 1.0), self.lasting(4.0, 15.0)
            record = self.begin(kind, "", f"{share:.0%} of writes for {seconds:.0f} s")
            excuse = self.excuse(kind)
            self.write_failure_share = share
            failed_before = self.writes_failed + self.reads_failed
            await self.sleep(seconds, stop)
            # A steady operator makes few API requests (measurements are written once a refresh
            # period): a burst that met none was no fault yet, so it holds until one request
            # failed, for at most three times its length.
            waited = seconds
            while self.writes_failed + self.reads_failed == failed_before and waited < 3 * seconds:
                if stop.is_set():
                    break
                await self.sleep(1.0, stop)
                waited += 1.0
            self.write_failure_share = 0.0
            return self.end(record, excuse)
        if kind == "watch-cut":
            cuts = rng.randint(1, 3)
            record = self.begin(kind, "", f"{cuts} cut(s) with compaction, 2 s apart")
            for index in range(cuts):
                self.stack.cluster.emulator.compact()
                self.stack.cluster.emulator.cut_watches()
                if index + 1 < cuts:
                    await self.sleep(2.0, stop)
            return self.end(record, None)
        if kind == "prometheus-down":
            seconds = self.lasting(5.0, 30.0)
            record = self.begin(kind, "", f"{seconds:.0f} s")
            await self.stack.prometheus.stop()
            await self.sleep(seconds, stop)
            await self.stack.prometheus.start()
            return self.end(record, None)
        if kind == "pod-crash":
            pods = [
                (spec.name, pod)
                for spec in self.resources
                for pod in self.stack.pods(spec.name, "stable")
                if pod.ready
            ]
            if not pods:
                return None
            owner, pod = rng.choice(pods)
            seconds = self.lasting(5.0, 20.0)
            record = self.begin(kind, pod.name, f"down {seconds:.0f} s, load past break-even for half of it")
            excuse = self.excuse(kind, pod.name)
            # The load crosses break-even and comes back meanwhile: the other engines follow their
            # schedule, the operator may decide a revision this pod must then roll onto.
            await pod.stop()
            self.stack.set_load(owner, SURGE)
            await self.sleep(seconds / 2, stop)
            self.stack.set_load(owner, LOAD)
            await self.sleep(seconds / 2, stop)
            if pod in self.stack.pods(owner, "stable"):  # not replaced by a rollout meanwhile
                await pod.start()
                pod.set_load(LOAD)
            return self.end(record, excuse)
        if kind == "load-surge":
            owner = rng.choice([spec.name for spec in self.resources])
            seconds = self.lasting(8.0, 30.0)
            record = self.begin(kind, owner, f"batch {SURGE.batch:.0f} per pod for {seconds:.0f} s")
            self.stack.set_load(owner, SURGE)
            await self.sleep(seconds, stop)
            self.stack.set_load(owner, LOAD)
            return self.end(record, None)
        if kind == "operator-restart":
            busy = [b["metadata"]["name"] for b in self.bodies() if (b.get("status") or {}).get("canary")]
            record = self.begin(kind, busy[0] if busy else "", "mid-canary" if busy else "idle")
            excuse = self.excuse(kind)
            await self.stack.operator.restart()
            return self.end(record, excuse)
        if kind == "new-draft":
            name = self.pick_resource(idle=True)
            if name is None:
                return None
            self.versions += 1
            version = f"v{self.versions}"
            alpha = round(rng.uniform(0.6, 0.92), 2)
            lossless = rng.random() > 0.15
            self.drafts[version] = DraftBehaviour(alpha=alpha, lossless=lossless)
            body = self.body(name) or {}
            draft = dict(body["spec"]["draft"])
            uri = str(draft["uri"]).rsplit("/", 1)[0]
            draft.update(version=version, uri=f"{uri}/{version}")
            record = self.begin(kind, name, version)
            record.detail = version
            self.patch_spec(name, {"draft": draft})
            self.canaries["started"] += 1
            return self.end(record, None)
        if kind == "spec-revert":
            return await self.spec_revert(stop)
        if kind == "api-429-storm":
            share, seconds = rng.uniform(0.3, 1.0), self.lasting(5.0, 15.0)
            record = self.begin(
                kind, "", f"{share:.0%} of requests 429 Retry-After {RETRY_AFTER_S} for {seconds:.0f} s"
            )
            excuse = self.excuse(kind)
            self.throttle_share = share
            await self.sleep(seconds, stop)
            self.throttle_share = 0.0
            return self.end(record, excuse)
        if kind == "metrics-nonfinite":
            return await self.metrics_nonfinite(stop)
        if kind == "route-elsewhere-at-deletion":
            return await self.delete_with_route_elsewhere(stop)
        if kind == "target-change":
            name = self.pick_resource(idle=True, retraining=True)
            if name is None:
                return None
            self.rounds += 1
            version = f"2027-{(self.rounds % 12) + 1:02d}-{(self.rounds % 27) + 1:02d}"
            record = self.begin(kind, name, f"target {version}")
            self.patch_spec(
                name, {"target": {**(self.body(name) or {})["spec"]["target"], "version": version}}
            )
            return self.end(record, None)  # the Job, its draft and the canary follow in the background
        raise ValueError(f"unknown fault kind {kind!r}")

    async def metrics_nonfinite(self, stop: asyncio.Event) -> FaultRecord | None:
        """Every engine of one resource exports spoiled values for a while; when status said so."""
        owner = self.schedule.choice([spec.name for spec in self.resources])
        corruption = self.schedule.choice(("nan", "inf", "negative"))
        seconds = self.lasting(15.0, 35.0)
        record = self.begin("metrics-nonfinite", owner, f"{corruption} for {seconds:.0f} s")
        spoiled = self.stack.pods(owner)
        for pod in spoiled:
            pod.metrics_fault = corruption
        flagged = None
        waited = 0.0
        while waited < seconds and not stop.is_set():
            unavailable = _conditions(self.body(owner) or {}).get("MetricsUnavailable") or {}
            if flagged is None and unavailable.get("status") == "True":
                flagged = waited
                record.detail += f"; MetricsUnavailable {unavailable.get('reason')} after {waited:.1f} s"
            await self.sleep(0.5, stop)
            waited += 0.5
        for pod in set(spoiled) | set(self.stack.pods(owner)):
            pod.metrics_fault = None
        if flagged is None:
            record.detail += "; MetricsUnavailable never said so"
        return self.end(record, None)

    async def delete_with_route_elsewhere(self, stop: asyncio.Event) -> FaultRecord | None:
        """A resource whose route names another Service (a typo, a migration) is deleted: the
        deletion must end; then the resource is created again."""
        candidates = [
            spec
            for spec in self.resources
            if spec.route
            and spec.name not in self.busy
            and ((self.body(spec.name) or {}).get("status") or {}).get("canary") is None
        ]
        if not candidates:
            return None
        spec = self.schedule.choice(candidates)
        cluster, namespace = self.stack.cluster, self.stack.namespace
        route, other = f"{spec.name}-route", f"{spec.name}-legacy"
        if cluster.get("services", other, namespace=namespace) is None:
            cluster.create(
                "services",
                {"metadata": {"name": other, "namespace": namespace}, "spec": {"ports": [{"port": 8000}]}},
                namespace=namespace,
            )
        routes = cluster.resource("httproutes")
        rules = [{"backendRefs": [{"name": other, "port": 8000}]}]
        cluster.emulator.patch_object(routes, namespace, route, {"spec": {"rules": rules}})
        record = self.begin("route-elsewhere-at-deletion", spec.name, f"route names {other}")
        excuse = self.excuse("route-elsewhere-at-deletion")
        self.busy.add(spec.name)
        try:
            cluster.emulator.delete_object(cluster.resource(SPECULATIVE), namespace, spec.name)
            started = time.monotonic()
            while self.body(spec.name) is not None and not stop.is_set():
                if time.monotonic() - started > DELETION_GRACE_S + 30.0:
                    break
                await self.sleep(0.5, stop)
            gone = self.body(spec.name) is None
            record.detail += f"; deleted in {time.monotonic() - started:.1f} s" if gone else "; not deleted"
            if not gone or stop.is_set():
                return self.end(record, excuse)
            stable = [{"backendRefs": [{"name": f"{spec.name}-stable", "port": 8000}]}]
            cluster.emulator.patch_object(routes, namespace, route, {"spec": {"rules": stable}})
            await self.create_resource(spec, password=self.resources.index(spec) == 1)
        finally:
            self.busy.discard(spec.name)
        return self.end(record, excuse)

    async def spec_revert(self, stop: asyncio.Event) -> FaultRecord | None:
        """A good new draft in spec.draft, then a random moment into its canary the edit reverted."""
        name = self.pick_resource(idle=True)
        if name is None:
            return None
        self.versions += 1
        version = f"v{self.versions}"
        self.drafts[version] = DraftBehaviour(alpha=round(self.schedule.uniform(0.8, 0.92), 2))
        original = dict((self.body(name) or {})["spec"]["draft"])
        draft = {**original, "version": version, "uri": f"{str(original['uri']).rsplit('/', 1)[0]}/{version}"}
        into_s = self.lasting(0.0, 12.0)
        record = self.begin("spec-revert", name, f"{version}, reverted {into_s:.0f} s into its canary")
        self.busy.add(name)
        try:
            self.patch_spec(name, {"draft": draft})
            waited = 0.0
            while waited < 30.0 and not stop.is_set():  # until its canary runs
                canary = ((self.body(name) or {}).get("status") or {}).get("canary") or {}
                if (canary.get("draft") or {}).get("version") == version:
                    break
                await self.sleep(0.5, stop)
                waited += 0.5
            await self.sleep(into_s, stop)
            self.patch_spec(name, {"draft": original})
        finally:
            self.busy.discard(name)
        log.info("soak spec-revert of %s: spec.draft back to %s", name, original["version"])
        record.detail = version
        return self.end(record, None)

    async def train(self, record: FaultRecord, stop: asyncio.Event) -> None:
        """Play the Job controller: every unfinished training Job of the resource succeeds a few
        seconds after it appears, oldest first, until the one for the new target version did.

        A round the operator started earlier (acceptance below the SLO) may still be running when
        the target changes: it finishes first, and its draft, trained for the old target, is not
        rolled out; the round for the new target follows it."""
        name, target = record.target, record.detail.removeprefix("target ")
        deadline = time.monotonic() + 60.0
        while not stop.is_set() and time.monotonic() < deadline:
            jobs = sorted(
                (
                    job
                    for job in self.stack.cluster.objects("jobs", self.stack.namespace)
                    if (job["metadata"].get("labels") or {}).get(LABEL_DEPLOYMENT) == name
                    and not (job.get("status") or {}).get("conditions")
                ),
                key=lambda job: (job["metadata"].get("creationTimestamp") or "", job["metadata"]["name"]),
            )
            for job in jobs:
                await self.sleep(3.0, stop)
                container = job["spec"]["template"]["spec"]["containers"][0]
                env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
                if env.get("SPECOPS_TARGET_VERSION") == target and not self.trainer_failed:
                    self.fail_job(job)
                    record.detail = TRAINER_FAILED
                    return
                version = env.get("SPECOPS_OUTPUT_VERSION", "")
                self.drafts[version] = DraftBehaviour(alpha=round(self.schedule.uniform(0.75, 0.92), 2))
                result = {"draftVersion": version, "checkpointUri": f"pvc://models/soak/{version}"}
                publish_result(self.stack.cluster, job, result)
                if env.get("SPECOPS_TARGET_VERSION") == target:
                    record.detail = version
                    self.canaries["started"] += 1
                    return
                log.warning(
                    "soak: %s's earlier round %s (for target %s) finished first",
                    name,
                    version,
                    env.get("SPECOPS_TARGET_VERSION"),
                )
            await asyncio.sleep(0.5)

    def fail_job(self, job: dict[str, Any]) -> None:
        """The Job's trainer exits 1 with secrets in its termination message; the Job fails."""
        self.trainer_failed = True
        cluster, name = self.stack.cluster, job["metadata"]["name"]
        container = job["spec"]["template"]["spec"]["containers"][0]
        pod = cluster.create(
            "pods",
            {
                "metadata": {
                    "name": f"{name}-0",
                    "namespace": self.stack.namespace,
                    "labels": {LABEL_JOB: name},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": container["name"], "image": "trainer"}],
                },
            },
            namespace=self.stack.namespace,
        )
        terminated = {"exitCode": 1, "reason": "Error", "message": TRAINER_FAILURE}
        cluster.patch_status(
            "pods",
            pod["metadata"]["name"],
            {
                "phase": "Failed",
                "containerStatuses": [{"name": container["name"], "state": {"terminated": terminated}}],
            },
            namespace=self.stack.namespace,
        )
        cluster.patch_status(
            "jobs",
            name,
            {
                "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}],
                "failed": 1,
            },
            namespace=self.stack.namespace,
        )
        log.warning("soak: %s's trainer failed with secrets in its termination message", name)

    def lasting(self, low: float, high: float) -> float:
        """A fault's length, drawn from the schedule and scaled (short soaks use shorter faults)."""
        return self.schedule.uniform(low, high) * self.settings.fault_scale

    def begin(self, kind: str, target: str, detail: str) -> FaultRecord:
        record = FaultRecord(kind, target, self.now_s(), detail=detail)
        self.faults.append(record)
        log.warning("soak fault %s %s (%s) at %.1f s", kind, target, detail, record.started_s)
        return record

    def excuse(self, kind: str, pod: str | None = None) -> Excuse:
        excuse = Excuse(kind, pod, None)
        self.excuses.append(excuse)
        return excuse

    def end(self, record: FaultRecord, excuse: Excuse | None) -> FaultRecord:
        record.ended_s = self.now_s()
        record.ended_at = datetime.now(UTC)
        if excuse is not None:
            excuse.until_s = record.ended_s
        return record

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    def failing_request(self, request: Any) -> bool:
        """The emulator's fault filter: during a burst, that share of the writes is answered 503, and
        half that share of the reads (watches are cut by their own fault)."""
        share = self.write_failure_share
        if share <= 0.0 or request.resource is None or request.params.get("watch") in ("true", "1"):
            return False
        method = str(getattr(request.method, "value", request.method)).upper()
        write = method in ("POST", "PUT", "PATCH", "DELETE")
        if self.chance.random() >= (share if write else share / 2):
            return False
        if write:
            self.writes_failed += 1
        else:
            self.reads_failed += 1
        return True

    def throttling_request(self, request: Any) -> bool:
        """The emulator's 429 filter: during a storm, that share of the requests (watches aside)."""
        share = self.throttle_share
        if share <= 0.0 or request.resource is None or request.params.get("watch") in ("true", "1"):
            return False
        if self.chance.random() >= share:
            return False
        self.throttled += 1
        return True

    # ------------------------------------------------------------------ the run

    async def run(self) -> dict[str, Any]:
        emulator = self.stack.cluster.emulator

        def failing(request: Any) -> bool:  # kmock takes plain functions as request filters
            return self.failing_request(request)

        def throttling(request: Any) -> bool:
            return self.throttling_request(request)

        emulator[failing] << 503
        status = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429}
        emulator[throttling] << 429 << kmock.headers({"Retry-After": str(RETRY_AFTER_S)}) << status
        logging.getLogger("kopf").addHandler(self.failures)
        logging.getLogger().addHandler(self.log_lines)
        stop = asyncio.Event()
        try:
            await self.create_resources()
            await self.wait_serving()
            checker = asyncio.get_running_loop().create_task(self.check_forever(stop), name="soak checks")
            deadline = time.monotonic() + self.settings.seconds
            round_left: list[str] = []
            following: list[asyncio.Task[None]] = []
            try:
                while time.monotonic() < deadline:
                    await self.sleep(self.schedule.uniform(*self.settings.gap_s), stop)
                    if time.monotonic() >= deadline:
                        break
                    if not round_left:
                        round_left = round_order(self.settings.kinds, self.schedule)
                    kind = round_left.pop(0)
                    record = await self.fault(kind, stop)
                    if record is None:
                        continue
                    if record.kind in BACKGROUND:
                        # A canary takes a while: later faults strike while it runs (restarts mid-canary).
                        task = asyncio.get_running_loop().create_task(self.follow(record, stop))
                        following.append(task)
                    else:
                        await self.await_recovery(record, stop)
                        if record.kind == "spec-revert":  # how the reverted draft's canary ended
                            outcome = self.canary_outcome(record.target, record.detail) or "unfinished"
                            self.canaries[f"reverted mid-canary: {outcome.lower()}"] += 1
            finally:
                stop.set()
                await checker
                await asyncio.gather(*following)
            self.check()
        finally:
            logging.getLogger("kopf").removeHandler(self.failures)
            logging.getLogger().removeHandler(self.log_lines)
        return self.report()

    async def follow(self, record: FaultRecord, stop: asyncio.Event) -> None:
        """A new draft's (or a retraining round's) canary, from the spec change until it ended."""
        self.busy.add(record.target)
        try:
            if record.kind == "target-change":
                await self.train(record, stop)
            await self.await_recovery(record, stop)
            if record.detail == TRAINER_FAILED:
                self.canaries["training failed"] += 1
                return
            outcome = self.canary_outcome(record.target, record.detail) if record.detail else None
            if record.recovered_s is None and stop.is_set():
                record.cut_short = True  # still recovering when the soak ended: no recovery time
            self.canaries[
                (outcome or ("running at the end" if record.cut_short else "unfinished")).lower()
            ] += 1
        finally:
            self.busy.discard(record.target)

    def report(self) -> dict[str, Any]:
        by_kind: Counter[str] = Counter(record.kind for record in self.faults)
        recovery: dict[str, dict[str, Any]] = {}
        for kind in FAULT_KINDS:
            of_kind = [r for r in self.faults if r.kind == kind]
            times = [r.recovery_s for r in of_kind if r.recovery_s is not None]
            pending = [r for r in of_kind if r.recovery_s is None]
            cut_short = sum(1 for r in pending if r.cut_short)
            unrecovered = len(pending) - cut_short
            if times or pending:
                recovery[kind] = {
                    "count": len(times) + unrecovered + cut_short,
                    "mean_s": round(statistics.fmean(times), 2) if times else None,
                    "max_s": max(times) if times else None,
                    "unrecovered": unrecovered,
                    "cut_short": cut_short,
                    # still recovering when the soak ended (a retraining round and its canary
                    # started late): neither a recovery time nor a failure to recover
                }
        violations = Counter(v.invariant for v in self.violations)
        return {
            "seed": self.settings.seed,
            "seconds": round(self.now_s(), 1),
            "resources": [r.name for r in self.resources],
            "checks": self.checks,
            "check_errors": self.check_errors,
            "invariants": list(INVARIANTS),
            "faults": {kind: by_kind.get(kind, 0) for kind in FAULT_KINDS},
            "faults_total": sum(by_kind.values()),
            "writes_failed": self.writes_failed,
            "reads_failed": self.reads_failed,
            "requests_throttled": self.throttled,
            "secrets_watched": len(self.secrets),
            "violations": {invariant: violations.get(invariant, 0) for invariant in INVARIANTS},
            "violations_total": len(self.violations),
            "violation_samples": [v.__dict__ for v in self.violations[:20]],
            "recovery": recovery,
            "canaries": dict(self.canaries),
            "checked": dict(self.seen),
            "handler_failures_worst_streak": max(self.failures.worst.values(), default=0),
            "timeline": [
                {**{k: v for k, v in vars(r).items() if k != "ended_at"}, "recovery_s": r.recovery_s}
                for r in self.faults
            ],
        }


def schedule_ks(revision: dict[str, Any]) -> list[int]:
    """The K a status revision's schedule gives at each of SCHEDULE_PROBES (all 0 for plain)."""
    bands = [(band.get("maxBatch"), int(band.get("k") or 0)) for band in revision.get("schedule") or []]
    if revision.get("mode") != "spec" or not bands:
        return [0 for _ in SCHEDULE_PROBES]
    ks = []
    for batch in SCHEDULE_PROBES:
        k = next((k for edge, k in bands if edge is None or batch <= edge), bands[-1][1])
        ks.append(k)
    return ks


def summary(report: dict[str, Any]) -> str:
    lines = [
        f"soak: {report['seconds']:.0f} s, seed {report['seed']}, {len(report['resources'])} resources, "
        f"{report['checks']} invariant checks"
        + (f" ({report['check_errors']} failed to run)" if report["check_errors"] else ""),
        "faults injected: "
        + ", ".join(f"{kind} {count}" for kind, count in report["faults"].items())
        + f" (total {report['faults_total']}; API answered 503 to {report['writes_failed']} writes and "
        f"{report['reads_failed']} reads)",
        "invariant violations: "
        + ", ".join(f"{name} {count}" for name, count in report["violations"].items())
        + f" (total {report['violations_total']})",
    ]
    for sample in report["violation_samples"]:
        lines.append(f"  at {sample['at_s']:.0f} s {sample['invariant']}: {sample['detail']}")
    lines.append("recovery after each fault (s): " + ("none measured" if not report["recovery"] else ""))
    for kind, row in report["recovery"].items():
        lines.append(
            f"  {kind:<17} {row['count']:>3} x  mean {row['mean_s']}  max {row['max_s']}"
            + (
                f"  not recovered in {RECOVERY_TIMEOUT_S:.0f} s: {row['unrecovered']}"
                if row["unrecovered"]
                else ""
            )
            + (f"  still recovering when the soak ended: {row['cut_short']}" if row["cut_short"] else "")
        )
    canaries = report["canaries"]
    lines.append(
        f"canaries: {canaries.get('started', 0)} started, {canaries.get('promoted', 0)} promoted, "
        f"{canaries.get('rolledback', 0)} rolled back, {canaries.get('unfinished', 0)} unfinished, "
        f"{canaries.get('running at the end', 0)} running at the end"
        + "".join(
            f"; {key.removeprefix('reverted mid-canary: ')} {count} reverted mid-canary"
            for key, count in canaries.items()
            if key.startswith("reverted mid-canary: ")
        )
    )
    lines.append("checked: " + ", ".join(f"{what} {count}" for what, count in report["checked"].items()))
    return "\n".join(lines)


async def run_soak(settings: SoakSettings, workdir: Path | None = None) -> dict[str, Any]:
    """Start the local stack with Gateway API served, run the soak on it, stop everything."""
    drafts = {"v3": DraftBehaviour(alpha=ALPHA)}
    with contextlib.ExitStack() as exits:
        if workdir is None:
            workdir = Path(exits.enter_context(tempfile.TemporaryDirectory(prefix="specops-soak-")))
        workdir.mkdir(parents=True, exist_ok=True)
        exits.enter_context(log_to_file(workdir / "operator.log"))
        async with local_stack(workdir, load=LOAD, drafts=drafts, extra_crds=upstream_crds()) as stack:
            report = await Soak(stack, settings, drafts).run()
    report["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    return report


def exit_code(report: dict[str, Any]) -> int:
    """0: faults were injected, invariants were checked (no check failed to run) and none was violated."""
    if (
        report["violations_total"]
        or report["check_errors"]
        or not report["faults_total"]
        or not report["checks"]
    ):
        return 1
    return 0
