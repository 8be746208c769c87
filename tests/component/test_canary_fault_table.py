"""One API write failure at every write of the canary path, in every phase of a canary.

Each case drives a canary of draft v4 over a resource serving v3 with the production
tick (services.tick: one read, control, retraining, canary, one status write) against the
emulated API server, on a compressed clock (1 s steps, 1 s pauses), with a Deployment
controller and kubelet played by the test. In one phase the first write of one kind is
answered 503 (the write is not stored): the start, the lossless check (passed, or failed: a
rollback before any traffic), each step, the promotion, a rollback on evidence, an abort by a
person, deletion mid-canary. Afterwards the canary must end (promoted or rolled back, as the
evidence says) with status matching the cluster, and at no tick may a route
send users to a Service that does not exist.

The table lists only (phase, write) pairs where that write happens in that phase, and each
case checks that its fault really fired, so no row passes by never failing anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from specops.adapters.kube import KubeClient, load_connection_settings
from specops.api.models import SpeculativeDeployment
from specops.domain import drafts
from specops.domain.metrics import Measurement
from specops.domain.names import CANARY, STABLE, child_name, variant_service_name
from specops.ports import GenerateOutput
from specops.services.canary import RouteNotReleased
from specops.services.config import OperatorConfig
from specops.services.container import Services, build_services
from specops_local.cluster import EmulatedCluster
from tests.conftest import EXAMPLES

NAME, NAMESPACE, ROUTE = "chat", "default", "chat-route"
STABLE_SERVICE, CANARY_SERVICE = variant_service_name(NAME, STABLE), variant_service_name(NAME, CANARY)
STABLE_DEPLOYMENT = child_name(NAME, STABLE)
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
MAX_TICKS = 60
"""A canary of two 1 s steps ends in about 20 ticks; a case that needs three times that is stuck."""
CANARY_KINDS = ("deployments", "services", "configmaps")


# ---------------------------------------------------------------- the world around the operator


class VariantMetrics:
    """Healthy measurements for both variants; the canary's acceptance is `canary_alpha`."""

    def __init__(self, canary_alpha: float) -> None:
        self.canary_alpha = canary_alpha
        self.reads = 0

    def register(self, key: Hashable, url: str, backend: str, interval_s: float) -> None:
        return None

    def unregister(self, key: Hashable) -> None:
        return None

    def lookup(
        self,
        url: str,
        backend: str,
        namespace: str,
        name: str,
        variant: str,
        now: datetime,
        draft_length: int | None = None,
        draft: str | None = None,
    ) -> Measurement:
        self.reads += 1
        jitter = 0.01 * (self.reads % 5)  # ties everywhere would make the rank test say nothing
        alpha = (self.canary_alpha if variant == "canary" else 0.8) + jitter
        return Measurement(
            phase="Ok",
            at=now,
            alpha=alpha,
            acceptance_rate=alpha * 0.75,
            mean_draft_length=4.0,
            batch=4.0,
            request_rate=2.0,
            tokens_per_s=400.0,
            tpot_p50_s=0.01,
            tpot_p95_s=0.012,
            tpot_p99_s=0.013,
            pods_reporting=2,
        )

    async def close(self) -> None:
        return None


class LosslessEngines:
    """Every pod's engine (found by its address) answers a prompt greedily; speculation changes no
    answer, unless `lossless` is False: then a pod speculating with draft v4 answers differently
    (the stable draft v3 passed its own check)."""

    def __init__(self, cluster: EmulatedCluster, lossless: bool = True) -> None:
        self.cluster = cluster
        self.lossless = lossless
        self.asked: list[str] = []  # the pods asked, by name

    async def generate(
        self, url: str, backend: str, model: str, prompt: str, max_tokens: int, timeout_s: float
    ) -> GenerateOutput:
        host = url.removeprefix("http://").rsplit(":", 1)[0]
        pod = next(
            (
                p
                for p in self.cluster.objects("pods", NAMESPACE)
                if (p.get("status") or {}).get("podIP") == host
            ),
            None,
        )
        if pod is None:
            return GenerateOutput(ok=False, error=f"connection refused: {url}")
        self.asked.append(pod["metadata"]["name"])
        labels = pod["metadata"].get("labels") or {}
        drafting = (
            labels.get("specops.dev/mode") == "spec" and labels.get("specops.dev/draft-version") == "v4"
        )
        differs = not self.lossless and drafting
        return GenerateOutput(ok=True, text=prompt + (" (drafted)" if differs else ""))

    async def healthy(self, url: str, backend: str, timeout_s: float = 2.0) -> bool:
        return True

    async def close(self) -> None:
        return None


def resource_body() -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"] = {"name": NAME, "namespace": NAMESPACE, "finalizers": [FINALIZER]}
    body["spec"]["metrics"] = {"prometheus": {"url": "http://127.0.0.1:9"}, "interval": "1s"}
    body["spec"]["speculation"] = {
        "rollout": {"baseline": "1s", "soak": "1s"},
        "calibration": {"enabled": False},
    }
    body["spec"]["canary"] = {
        "steps": [{"weight": 10, "pause": "1s"}, {"weight": 50, "pause": "1s"}],
        "trafficRouting": {"gatewayAPI": {"httpRoute": ROUTE}},
        "analysis": {"failureLimit": 0},
    }
    return body


def user_route() -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": ROUTE, "namespace": NAMESPACE},
        "spec": {
            "parentRefs": [{"name": "gateway"}],
            "rules": [{"backendRefs": [{"name": STABLE_SERVICE, "port": 8000}]}],
        },
    }


def sync_workloads(cluster: EmulatedCluster) -> None:
    """A Deployment controller and kubelet: every Deployment rolled out, its pods Ready with its labels.

    Written straight into the store (not over HTTP), so the injected faults never hit it.
    """
    deployments = {d["metadata"]["name"]: d for d in cluster.objects("deployments", NAMESPACE)}
    for pod in cluster.objects("pods", NAMESPACE):
        owner = pod["metadata"]["name"].rsplit("-", 1)[0]
        deployment = deployments.get(owner)
        template = (deployment or {}).get("spec", {}).get("template", {}).get("metadata", {})
        wanted = int((deployment or {}).get("spec", {}).get("replicas") or 0)
        index = int(pod["metadata"]["name"].rsplit("-", 1)[1])
        if deployment is None or index >= wanted or pod["metadata"].get("labels") != template.get("labels"):
            cluster.emulator.delete_object(cluster.resource("pods"), NAMESPACE, pod["metadata"]["name"])
    for name, deployment in deployments.items():
        replicas = int(deployment["spec"].get("replicas") or 0)
        status = deployment.get("status") or {}
        rolled = {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
        }
        if any(status.get(key) != value for key, value in rolled.items()):
            cluster.patch_status("deployments", name, rolled)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        for index in range(replicas):
            pod_name = f"{name}-{index}"
            if cluster.get("pods", pod_name) is not None:
                continue
            cluster.create(
                "pods",
                {
                    "metadata": {"name": pod_name, "namespace": NAMESPACE, "labels": labels},
                    "spec": {"containers": [{"name": "engine", "ports": [{"containerPort": 8000}]}]},
                },
            )
            # each pod its own address, so the engines tell which pod was asked
            address = f"10.0.{len(_ADDRESSES) // 250}.{len(_ADDRESSES) % 250 + 1}"
            _ADDRESSES.append(address)
            cluster.patch_status(
                "pods", pod_name, {"podIP": address, "conditions": [{"type": "Ready", "status": "True"}]}
            )


_ADDRESSES: list[str] = []


# ---------------------------------------------------------------- the fault


@dataclass
class OneFault:
    """Answers 503 to the first request of `write` made while armed; then never again."""

    write: str
    armed: bool = False
    phase: str = ""
    fired: list[str] = field(default_factory=list)
    writes: dict[str, set[str]] = field(default_factory=dict)
    """Write kinds seen per phase, for the message when a row names a write its phase never makes."""

    def __call__(self, request: Any) -> bool:
        kind = write_kind(request)
        if kind is not None:
            self.writes.setdefault(self.phase, set()).add(kind)
        if not self.armed or self.fired or kind != self.write:
            return False
        self.fired.append(f"{request.method} {request.url.path}")
        return True


def write_kind(request: Any) -> str | None:
    """The canary-path write a request is, or None for reads and other writes."""
    method, path = str(getattr(request.method, "value", request.method)).upper(), request.url.path
    parts = path.rstrip("/").split("/")
    if method not in ("POST", "PATCH", "PUT", "DELETE"):
        return None
    if "/httproutes/" in path and method in ("PATCH", "PUT"):
        return "route"
    if "/speculativedeployments/" in path and parts[-1] == "status":
        patch = ((request.data or {}).get("status") or {}) if isinstance(request.data, dict) else {}
        canary = patch.get("canary", {})
        # The write that records a canary transition (a new phase or step, or the end), not a sample.
        if "canary" in patch and (canary is None or "phase" in canary or "step" in canary):
            return "status"
        return None
    if "/speculativedeployments/" in path and method == "PATCH":
        return "annotation"
    kind = parts[-2] if method != "POST" else parts[-1]
    if kind not in CANARY_KINDS:
        return None
    if method == "POST":
        created = (
            (request.data or {}).get("metadata", {}).get("name", "") if isinstance(request.data, dict) else ""
        )
        return "canary-create" if created.startswith(CANARY_SERVICE) else None
    target = parts[-1]
    if method == "DELETE":
        return "canary-delete" if target.startswith(CANARY_SERVICE) else None
    if target == STABLE_DEPLOYMENT and kind == "deployments":
        return "stable-rollout"
    return "canary-scale" if target.startswith(CANARY_SERVICE) else None


# ---------------------------------------------------------------- phases and scenarios


def phase_of(status: Mapping[str, Any] | None, spec_version: str) -> str:
    """Which part of the canary the next tick carries out, from the stored status."""
    status = status or {}
    canary = status.get("canary")
    if canary is None:
        started = status.get("lastCanary") or (status.get("draft") or {}).get("version") == spec_version
        return "done" if started else "start"
    if canary.get("phase") == "LosslessCheck":
        return "lossless-check"
    if canary.get("phase") == "Promoting":
        return "promotion"
    return f"step-{int(canary.get('step') or 0) + 1}"


@dataclass(frozen=True)
class Scenario:
    canary_alpha: float
    """0.8 is as good as stable (promoted), 0.4 is much worse (rolled back)."""
    expect: str  # "Promoted" | "RolledBack" | "Deleted"
    person: str | None = None  # "abort" | "delete": done by a person when step 1 begins
    lossless: bool = True


PROMOTED = Scenario(0.8, "Promoted")
ROLLED_BACK = Scenario(0.4, "RolledBack")
ABORTED = Scenario(0.8, "RolledBack", person="abort")
DELETED = Scenario(0.8, "Deleted", person="delete")
NOT_LOSSLESS = Scenario(0.8, "RolledBack", lossless=False)

# (phase, write, scenario): every write each phase makes, as seen on the wire.
TABLE: list[tuple[str, str, Scenario]] = [
    ("start", "canary-create", PROMOTED),
    ("start", "status", PROMOTED),
    ("lossless-check", "canary-scale", PROMOTED),
    ("lossless-check", "route", PROMOTED),
    ("lossless-check", "status", PROMOTED),
    ("lossless-check", "canary-delete", NOT_LOSSLESS),
    ("lossless-check", "status", NOT_LOSSLESS),
    ("step-1", "route", PROMOTED),
    ("step-1", "canary-scale", PROMOTED),
    ("step-1", "status", PROMOTED),
    ("step-2", "route", PROMOTED),
    ("step-2", "status", PROMOTED),
    ("step-2", "stable-rollout", PROMOTED),
    ("promotion", "route", PROMOTED),
    ("promotion", "canary-delete", PROMOTED),
    ("promotion", "status", PROMOTED),
    ("step-1", "route", ROLLED_BACK),
    ("step-1", "canary-delete", ROLLED_BACK),
    ("step-1", "status", ROLLED_BACK),
    ("step-1", "annotation", ABORTED),
    ("step-1", "route", ABORTED),
    ("step-1", "canary-delete", ABORTED),
    ("step-1", "status", ABORTED),
    ("step-1", "route", DELETED),
]


def _case_id(case: tuple[str, str, Scenario]) -> str:
    phase, write, scenario = case
    outcome = scenario.person or ("notlossless" if not scenario.lossless else scenario.expect.lower())
    return f"{outcome}-{phase}-{write}"


# ---------------------------------------------------------------- driving it


@pytest.fixture
async def services(cluster: EmulatedCluster, operator_env: None) -> AsyncIterator[Services]:
    built = await build_services(OperatorConfig.from_env())
    await built.kube.close()
    built.kube = KubeClient(load_connection_settings(str(cluster.kubeconfig_path)))
    try:
        yield built
    finally:
        await built.close()


def rewire(services: Services, metrics: VariantMetrics, engines: LosslessEngines) -> None:
    """Point every service at the test's client, metrics and engines."""
    services.metrics = metrics  # type: ignore[assignment]
    for service in (
        services.ticker,
        services.control,
        services.canary,
        services.retraining,
        services.reconciler,
    ):
        for attribute, value in (("kube", services.kube), ("metrics", metrics), ("engines", engines)):
            if hasattr(service, attribute):
                setattr(service, attribute, value)
    for router in services.canary.routers.values():
        if hasattr(router, "kube"):
            router.kube = services.kube


def route_backends(cluster: EmulatedCluster) -> list[str]:
    live = cluster.get("httproutes", ROUTE)
    assert live is not None
    return [ref["name"] for rule in live["spec"]["rules"] for ref in rule.get("backendRefs") or []]


def assert_no_route_to_a_missing_backend(cluster: EmulatedCluster, at: str) -> None:
    missing = [name for name in route_backends(cluster) if cluster.get("services", name) is None]
    if cluster.get("speculativedeployments", NAME) is None:
        missing = [name for name in missing if name != STABLE_SERVICE]  # the user's route, the user's stable
    assert not missing, f"{at}: the route sends users to missing Service(s) {missing}"


def canary_objects(cluster: EmulatedCluster) -> list[str]:
    return [
        f"{kind}/{obj['metadata']['name']}"
        for kind in CANARY_KINDS
        for obj in cluster.objects(kind, NAMESPACE)
        if obj["metadata"]["name"].startswith(CANARY_SERVICE)
    ]


async def serving_v3(cluster: EmulatedCluster, services: Services, now: datetime) -> datetime:
    """The resource serves draft v3 (Serving, children rolled out), its route to stable only."""
    cluster.create("speculativedeployments", resource_body())
    cluster.create("httproutes", user_route())
    body = cluster.get("speculativedeployments", NAME)
    assert body is not None
    await services.reconciler.reconcile(body, now)
    sync_workloads(cluster)
    await services.reconciler.refresh(NAMESPACE, NAME, now)
    # its first draft checked on a check pod (created, ready, compared, deleted)
    for _ in range(5):
        now += timedelta(seconds=1)
        await services.tick(NAMESPACE, NAME, lambda at=now: at)
        sync_workloads(cluster)
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None and live["status"].get("canary") is None, live["status"]
    assert live["status"]["draft"]["losslessCheck"] == "Passed", live["status"]["draft"]
    assert canary_objects(cluster) == [], "the check pod goes once the verdict is written"
    return now


def new_draft_v4(cluster: EmulatedCluster) -> None:
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None
    spec = dict(live["spec"])
    spec["draft"] = {**spec["draft"], "version": "v4", "uri": "pvc://models/llama-70b-draft/v4"}
    cluster.emulator.patch_object(cluster.resource("speculativedeployments"), NAMESPACE, NAME, {"spec": spec})


async def act_as_a_person(cluster: EmulatedCluster, services: Services, person: str) -> None:
    if person == "abort":
        patch = {"metadata": {"annotations": {"specops.dev/canary-action": "abort"}}}
        cluster.emulator.patch_object(cluster.resource("speculativedeployments"), NAMESPACE, NAME, patch)
    else:
        cluster.emulator.delete_object(cluster.resource("speculativedeployments"), NAMESPACE, NAME)


async def finalize(cluster: EmulatedCluster, services: Services) -> bool:
    """What the delete handler and Kopf do: release the route, then drop the finalizer (GC follows)."""
    body = cluster.get("speculativedeployments", NAME)
    if body is None:
        return True
    try:
        await services.canary.release(body)
    except RouteNotReleased:
        return False  # Kopf retries the handler; the finalizer keeps the resource
    patch = {"metadata": {"finalizers": []}}
    cluster.emulator.patch_object(cluster.resource("speculativedeployments"), NAMESPACE, NAME, patch)
    return True


@pytest.mark.parametrize("case", TABLE, ids=[_case_id(case) for case in TABLE])
async def test_one_failed_write_never_strands_traffic_and_the_canary_still_ends(
    cluster: EmulatedCluster, services: Services, case: tuple[str, str, Scenario]
) -> None:
    phase, write, scenario = case
    engines = LosslessEngines(cluster, scenario.lossless)
    rewire(services, VariantMetrics(scenario.canary_alpha), engines)
    now = await serving_v3(cluster, services, T0)
    engines.asked.clear()
    fault = OneFault(write)

    def matches(request: Any) -> bool:  # kmock takes plain functions as request filters
        return fault(request)

    cluster.emulator[matches] << 503

    # Given a new draft v4 on a resource serving v3
    new_draft_v4(cluster)
    seen: list[str] = []
    person_done = False
    for tick in range(MAX_TICKS):
        live = cluster.get("speculativedeployments", NAME)
        if live is None:
            break
        current = phase_of(live.get("status"), "v4")
        if current == "done":
            break
        seen.append(current)
        if scenario.person and current == "step-1" and not person_done:
            await act_as_a_person(cluster, services, scenario.person)
            person_done = True
        # When the first write of this kind in this phase is answered 503
        fault.armed, fault.phase = current == phase and not fault.fired, current
        now += timedelta(seconds=1)
        if scenario.person == "delete" and person_done:
            await finalize(cluster, services)
        else:
            await services.tick(NAMESPACE, NAME, lambda at=now: at)
        fault.armed = False
        sync_workloads(cluster)
        # Then at no tick does the route send users to a Service that is gone
        assert_no_route_to_a_missing_backend(cluster, f"tick {tick} ({current})")
    else:
        pytest.fail(f"the canary did not end in {MAX_TICKS} ticks; phases: {seen}")

    assert fault.fired, f"no {write} write happened in phase {phase}; writes seen: {fault.writes}"
    if "lossless-check" in seen:  # the check compared a canary pod's answers with a stable pod's
        asked = set(engines.asked)
        assert {f"{CANARY_SERVICE}-0", f"{STABLE_DEPLOYMENT}-0"} <= asked, asked
    # And the canary ended as the evidence says, with status telling what the cluster shows
    assert canary_objects(cluster) == [], canary_objects(cluster)
    assert CANARY_SERVICE not in route_backends(cluster)
    if scenario.expect == "Deleted":
        assert cluster.get("speculativedeployments", NAME) is None
        return
    assert route_backends(cluster) == [STABLE_SERVICE]
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None
    status = SpeculativeDeployment.model_validate(live).status
    rollout = next(c for c in status.conditions if c.type == "CanaryRollout")
    assert status.canary is None and status.phase != "Canary"
    stable = cluster.get("deployments", STABLE_DEPLOYMENT)
    assert stable is not None
    serving_version = stable["spec"]["template"]["metadata"]["labels"]["specops.dev/draft-version"]
    if scenario.expect == "Promoted":
        assert rollout.reason == "CanaryPromoted", rollout
        assert status.draft is not None and status.draft.version == "v4"
        assert serving_version == "v4"
        assert status.rejected_draft is None
    else:
        assert rollout.reason == "CanaryRolledBack", rollout
        assert status.draft is not None and status.draft.version == "v3"
        assert serving_version == "v3"
        spec_draft = SpeculativeDeployment.model_validate(live).spec.draft
        assert status.rejected_draft == drafts.draft_key(spec_draft)
        annotations = live["metadata"].get("annotations") or {}
        assert "specops.dev/canary-action" not in annotations
