"""What the operator may do in the Kubernetes API, and nothing more: the one list.

deploy/10-rbac.yaml and the Helm chart's Role/ClusterRole both grant exactly these rules (and a
Role in the operator's own namespace grants exactly LEADER_ELECTION_RULES);
tests/unit/test_deploy_manifests.py and tests/unit/test_chart.py check each against this list,
and check this list against the code (every kind the client can address, every kind the
reconciler prunes, every training kind retraining creates).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    api_group: str
    resource: str
    verbs: frozenset[str]
    cluster_scoped: bool
    """A cluster-scoped resource needs a ClusterRole even when the operator watches a few namespaces."""
    why: str


def _rule(group: str, resource: str, verbs: str, why: str, *, cluster_scoped: bool = False) -> Rule:
    return Rule(group, resource, frozenset(verbs.split()), cluster_scoped, why)


OPERATOR_RULES: tuple[Rule, ...] = (
    _rule(
        "specops.dev",
        "speculativedeployments",
        "get list watch patch",
        "Kopf watches them and keeps its finalizer and bookkeeping annotations; services get before "
        "every write; the canary clears specops.dev/canary-action",
    ),
    _rule(
        "specops.dev",
        "speculativedeployments/status",
        "patch",
        "all controller state lives in status (optimistic merge patches carrying the resourceVersion)",
    ),
    _rule(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "list watch",
        "Kopf notices CRDs that appear or disappear after start-up",
        cluster_scoped=True,
    ),
    _rule("", "events", "create", "Events on SpeculativeDeployments (posted through Kopf)"),
    _rule(
        "apps",
        "deployments",
        "get list watch create patch delete",
        "serving Deployments: rendered, patched, pruned; watched so readiness reaches status at once",
    ),
    _rule(
        "",
        "configmaps",
        "get list create patch delete",
        "model-repository ConfigMaps, and golden prompts read from a ConfigMap",
    ),
    _rule("", "services", "get list create patch delete", "the serving Services"),
    _rule(
        "",
        "pods",
        "list watch delete",
        "serving pods' IPs (the lossless check through the engines' API; watched into the operator's pod "
        "index), training pods' termination messages; a serving pod whose acceptance collapsed is "
        "deleted so its Deployment starts a fresh engine",
    ),
    _rule(
        "monitoring.coreos.com",
        "podmonitors",
        "get list create patch delete",
        "PodMonitors, rendered only when the prometheus-operator CRDs are served",
    ),
    _rule(
        "gateway.networking.k8s.io",
        "httproutes",
        "get patch",
        "canary weights on the HTTPRoute named in spec.canary.trafficRouting.gatewayAPI",
    ),
    _rule(
        "batch",
        "jobs",
        "get create delete",
        "draft retraining: one training object per round, then its result; a round a new target "
        "version superseded is deleted",
    ),
    _rule("jobset.x-k8s.io", "jobsets", "get create delete", "draft retraining with a JobSet template"),
    _rule(
        "trainer.kubeflow.org", "trainjobs", "get create delete", "draft retraining with a TrainJob template"
    ),
    _rule("kubeflow.org", "pytorchjobs", "get create delete", "draft retraining with a PyTorchJob template"),
)


LEADER_ELECTION_RULES: tuple[Rule, ...] = (
    _rule(
        "coordination.k8s.io",
        "leases",
        "get create patch",
        "leader election (specops run --leader-election): one Lease in the operator's own namespace, "
        "granted by a Role there and nowhere else",
    ),
)
"""Granted only in the operator's namespace (a Role), not with the rules above."""


PROMETHEUS_SECRET_RULES: tuple[Rule, ...] = (
    _rule(
        "",
        "secrets",
        "get",
        "credentials of spec.metrics.prometheus (bearerTokenSecret, basicAuth, tlsConfig.ca.secret), read "
        "in the resource's namespace: granted only for the Secret names the chart's prometheus.secretNames "
        "lists (resourceNames), never list or watch",
    ),
)
"""Granted only by name (the chart's prometheus.secretNames), not with the rules above."""


def grants(rules: tuple[Rule, ...] = OPERATOR_RULES) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, the shape a test reads back from a rendered Role."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        granted.setdefault((rule.api_group, rule.resource), set()).update(rule.verbs)
    return granted
