"""charts/specops: lints clean, renders valid objects for default and custom values, grants exactly
the operator's rules (specops/rbac.py) in both modes, and refuses bad values naming them."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from specops import rbac
from specops.adapters.leader import DEFAULT_TIMINGS, LeaseTimings
from specops.api.crd import render_yaml
from specops.api.models import DEFAULT_PROMETHEUS_URL, SpeculativeDeployment
from specops.domain.engines.schedule import Revision, Schedule
from specops.domain.metrics import DRAFT_LABEL, GROUP_LABELS
from specops.domain.render import RenderOptions, render_children
from specops.services.config import OperatorConfig
from specops_local.admission import AdmissionError
from tests.unit.chart import (
    CHART,
    MONITORING_ON,
    NAMESPACE,
    ROOT,
    RUNBOOK,
    notes,
    one,
    render,
    upstream_admission,
)
from tests.unit.test_deploy_manifests import restricted_violations

FULLNAME = "specops"
NAMESPACED: dict[str, Any] = {"watch": {"mode": "namespaced", "namespaces": ["team-a", "team-b"]}}
CUSTOM: dict[str, Any] = {
    **MONITORING_ON,
    **NAMESPACED,
    "image": {"repository": "registry.example/specops", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "pull"}],
    "operator": {
        "defaultServingImage": "tritonserver:25.01-trtllm-python-py3",
        "scrapeIntervalSeconds": 30,
        "log": {"level": "debug", "format": "json"},
        "metricsPort": 9090,
    },
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
                ]
            }
        }
    },
    "priorityClassName": "system-cluster-critical",
    "podLabels": {"team": "ml-platform"},
    "serviceAccount": {"annotations": {"example.com/role": "specops"}},
    "extraEnv": [
        {"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
        {"name": "TEAM", "valueFrom": {"configMapKeyRef": {"name": "ops", "key": "team"}}},
    ],
    "extraArgs": ["--verbose"],
    "extraVolumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
    "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 4},
    "prometheus": {"url": "https://prometheus.example/api/prom", "secretNames": ["prometheus-auth"]},
    "networkPolicy": {
        "enabled": True,
        "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
        "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [443]},
    },
}
VALUE_SETS = {"default": None, "custom": CUSTOM}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def _granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def _operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(objects, "Deployment", FULLNAME)["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {env["name"]: env["value"] for env in container["env"] if "value" in env}


# ---------------------------------------------------------------- lint, CRDs


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_chart_lints_clean_in_strict_mode(values: dict[str, Any] | None) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    # Severity 2 is a warning, 3 an error; strict mode fails on both.
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert report["errors"] == [] and problems == []


def test_the_chart_crds_are_the_generated_crd_byte_for_byte() -> None:
    generated = render_yaml()
    chart_copy = CHART / "crds" / "specops.dev_speculativedeployments.yaml"
    assert (ROOT / "crds" / "specops.dev_speculativedeployments.yaml").read_text() == generated
    assert chart_copy.read_text() == generated, "run `make crds`: the chart's CRD has drifted"
    with helm.Chart.load(CHART) as chart:
        # and Helm installs exactly that file, unchanged
        assert [crd["data"] for crd in chart.crds] == [generated]


# ---------------------------------------------------------------- validity


def _cases() -> list[Any]:
    cases = []
    for label, values in VALUE_SETS.items():
        for obj in render(values):
            ident = f"{label}:{obj['kind']}/{obj['metadata'].get('namespace', '-')}/{obj['metadata']['name']}"
            cases.append(pytest.param(obj, id=ident))
    return cases


CASES = _cases()


def test_default_values_render_the_operator_and_no_monitoring_objects() -> None:
    kinds = sorted(obj["kind"] for obj in render())
    assert kinds == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]


def test_monitoring_values_add_each_monitoring_object() -> None:
    kinds = {obj["kind"] for obj in render(MONITORING_ON)}
    assert {*MONITORING_KINDS, "Service", "ConfigMap"} <= kinds


@pytest.mark.parametrize("obj", [case for case in CASES if case.values[0]["kind"] not in MONITORING_KINDS])
def test_every_built_in_object_passes_strict_schema_validation(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("obj", [case for case in CASES if case.values[0]["kind"] in MONITORING_KINDS])
def test_every_monitoring_object_passes_its_upstream_crd(obj: dict[str, Any]) -> None:
    admission = upstream_admission(obj["apiVersion"].split("/")[0], obj["kind"])
    admission("CREATE", obj, None)


def test_the_upstream_crd_check_refuses_a_wrong_monitoring_object() -> None:
    monitor = one(render(MONITORING_ON), "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = "every now and then"
    monitor["spec"]["endpoints"][0]["scheme"] = "gopher"
    with pytest.raises(AdmissionError) as refused:
        upstream_admission("monitoring.coreos.com", "ServiceMonitor")("CREATE", monitor, None)
    assert "spec.endpoints[0].interval" in str(refused.value)
    assert "spec.endpoints[0].scheme" in str(refused.value)


# ---------------------------------------------------------------- the operator Deployment


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_the_operator_pod_meets_the_restricted_profile(values: dict[str, Any] | None) -> None:
    pod = one(render(values), "Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []


def test_two_leader_elected_operators_run_probed_on_kopfs_health_endpoint_with_metrics_served() -> None:
    objects = render()
    deployment = one(objects, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    container = _operator_container(objects)
    command = container["command"]
    assert command[:7] == [
        "specops",
        "run",
        "--leader-election",
        "--lease-name",
        FULLNAME,
        "--liveness",
        "http://0.0.0.0:8080/healthz",
    ]
    (pod_namespace,) = [env for env in container["env"] if env["name"] == "POD_NAMESPACE"]
    assert pod_namespace["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    anti_affinity = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (preferred,) = anti_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert command[command.index("--metrics-port") + 1] == "8081"
    assert command[-1] == "--all-namespaces"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": 8080, "metrics": 8081}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def test_two_operators_get_a_disruption_budget_that_keeps_one_through_drains() -> None:
    objects = render()
    budget = one(objects, "PodDisruptionBudget", FULLNAME)
    selector = one(objects, "Deployment", FULLNAME)["spec"]["selector"]["matchLabels"]
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert budget["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize(
    ("values", "spec"),
    [
        ({"podDisruptionBudget": {"minAvailable": 1}}, {"minAvailable": 1}),
        ({"podDisruptionBudget": {"maxUnavailable": "50%"}}, {"maxUnavailable": "50%"}),
        ({"replicas": 3, "podDisruptionBudget": {"minAvailable": "60%"}}, {"minAvailable": "60%"}),
    ],
)
def test_the_disruption_budget_takes_min_available_or_max_unavailable(
    values: dict[str, Any], spec: dict[str, Any]
) -> None:
    budget = one(render(values), "PodDisruptionBudget", FULLNAME)
    kubernetes_validate.validate(budget, kubernetes_validate.latest_version(), strict=True)
    assert {k: v for k, v in budget["spec"].items() if k != "selector"} == spec


@pytest.mark.parametrize(
    "values", [{"replicas": 1}, {"replicas": 0}, {"podDisruptionBudget": {"enabled": False}}]
)
def test_no_disruption_budget_for_a_single_operator_or_when_disabled(values: dict[str, Any]) -> None:
    # One replica: a budget would block every drain (minAvailable 1) or protect nothing
    assert [obj for obj in render(values) if obj["kind"] == "PodDisruptionBudget"] == []


def test_every_operator_setting_the_operator_reads_is_set_by_the_chart() -> None:
    read = set(re.findall(r"SPECOPS_[A-Z_]+", (ROOT / "operator/specops/services/config.py").read_text()))
    set_here = {name for name in _env(_operator_container(render())) if name.startswith("SPECOPS_")}
    assert set_here == read


def test_custom_values_reach_the_operator() -> None:
    objects = render(CUSTOM)
    container = _operator_container(objects)
    pod = one(objects, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    command = container["command"]
    assert container["image"] == "registry.example/specops:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    assert command[command.index("--log-level") + 1] == "debug"
    assert command[command.index("--log-format") + 1] == "json"
    assert command[command.index("--metrics-port") + 1] == "9090"
    assert [command[i + 1] for i, arg in enumerate(command) if arg == "--namespace"] == ["team-a", "team-b"]
    assert "--all-namespaces" not in command
    env = _env(container)
    assert env["SPECOPS_DEFAULT_IMAGE"] == "tritonserver:25.01-trtllm-python-py3"
    assert env["SPECOPS_SCRAPE_INTERVAL_SECONDS"] == "30"
    # The chart's PodMonitor covers the serving pods: the operator renders none of its own
    assert env["SPECOPS_POD_MONITOR"] == "false"
    assert pod["nodeSelector"] == CUSTOM["nodeSelector"]
    assert pod["tolerations"] == CUSTOM["tolerations"]
    assert pod["affinity"] == CUSTOM["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "pull"}]
    assert (
        one(objects, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]["team"]
        == "ml-platform"
    )
    assert one(objects, "Service")["spec"]["ports"][0]["port"] == 9090
    pod_monitor = one(objects, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_the_serving_pod_monitor_adds_the_labels_the_operator_queries_group_by() -> None:
    pod_monitor = one(render(MONITORING_ON), "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    targets = {relabel["targetLabel"]: relabel["sourceLabels"] for relabel in endpoint["relabelings"]}
    assert set(targets) == {*GROUP_LABELS, "pod"}
    assert targets[DRAFT_LABEL] == ["__meta_kubernetes_pod_label_specops_dev_draft"]


def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_dashboard() -> None:
    config_map = one(render(MONITORING_ON), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["specops.json"]) == json.loads(
        (CHART / "files" / "dashboard.json").read_text()
    )


def test_the_install_notes_name_the_watched_namespaces() -> None:
    assert "namespaces team-a, team-b" in notes(NAMESPACED)
    assert "every namespace" in notes()


# ---------------------------------------------------------------- RBAC


def test_cluster_mode_grants_exactly_the_operator_rules_cluster_wide() -> None:
    objects = render()
    assert _granted(one(objects, "ClusterRole", FULLNAME)) == rbac.grants()
    binding = one(objects, "ClusterRoleBinding", FULLNAME)
    assert binding["roleRef"]["name"] == FULLNAME
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert not [
        obj
        for obj in objects
        if obj["kind"] in ("Role", "RoleBinding") and obj["metadata"]["name"] == FULLNAME
    ]


@pytest.mark.parametrize("values", [None, NAMESPACED], ids=["cluster", "namespaced"])
def test_the_leader_election_role_grants_the_lease_only_in_the_release_namespace(
    values: dict[str, Any] | None,
) -> None:
    objects = render(values)
    role = one(objects, "Role", f"{FULLNAME}-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _granted(role) == rbac.grants(rbac.LEADER_ELECTION_RULES)
    binding = one(objects, "RoleBinding", f"{FULLNAME}-leader-election")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


def test_namespaced_mode_grants_the_operator_rules_only_in_the_watched_namespaces() -> None:
    objects = render(NAMESPACED)
    namespaced = tuple(rule for rule in rbac.OPERATOR_RULES if not rule.cluster_scoped)
    cluster_scoped = tuple(rule for rule in rbac.OPERATOR_RULES if rule.cluster_scoped)
    roles = [obj for obj in objects if obj["kind"] == "Role" and obj["metadata"]["name"] == FULLNAME]
    bindings = [
        obj for obj in objects if obj["kind"] == "RoleBinding" and obj["metadata"]["name"] == FULLNAME
    ]
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _granted(role) == rbac.grants(namespaced)
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": FULLNAME,
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    # Only what is cluster-scoped (CRDs, for Kopf) stays in a ClusterRole
    assert _granted(one(objects, "ClusterRole", FULLNAME)) == rbac.grants(cluster_scoped)


def test_the_operator_rules_split_into_cluster_scoped_and_namespaced_cover_everything() -> None:
    # In namespaced mode the Roles and the small ClusterRole together grant the whole list
    merged: dict[tuple[str, str], set[str]] = {}
    objects = render(NAMESPACED)
    for obj in objects:
        if obj["kind"] in ("Role", "ClusterRole") and obj["metadata"]["name"] == FULLNAME:
            for grant, verbs in _granted(obj).items():
                merged.setdefault(grant, set()).update(verbs)
    assert merged == rbac.grants()


def test_no_role_uses_wildcards() -> None:
    for obj in render(CUSTOM):
        for rule in obj.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in value for value in rule.get(field, [])), (obj["metadata"]["name"], rule)


# ---------------------------------------------------------------- values schema

BAD_VALUES = {
    "a digest that is no sha256": ({"image": {"digest": "latest"}}, "/image/digest", "latest"),
    "a relative default Prometheus": (
        {"prometheus": {"url": "prometheus:9090"}},
        "/prometheus/url",
        "prometheus:9090",
    ),
    "a Secret name that is no DNS name": (
        {"prometheus": {"secretNames": ["Prom_Auth"]}},
        "/prometheus/secretNames/0",
        "Prom_Auth",
    ),
    "a lease of zero seconds": (
        {"leaderElection": {"leaseDurationSeconds": 0}},
        "/leaderElection/leaseDurationSeconds",
        "0",
    ),
    "an engine port out of range": (
        {"networkPolicy": {"enginePorts": [0]}},
        "/networkPolicy/enginePorts/0",
        "0",
    ),
    "too many replicas": ({"replicas": 9}, "/replicas", "got 9, want 5"),
    "unknown watch mode": ({"watch": {"mode": "everywhere"}}, "/watch/mode", "'cluster', 'namespaced'"),
    "namespaced without namespaces": ({"watch": {"mode": "namespaced"}}, "/watch", "namespaces"),
    "a namespace that is no DNS label": (
        {"watch": {"mode": "namespaced", "namespaces": ["Team_A"]}},
        "/watch/namespaces/0",
        "Team_A",
    ),
    "log format": ({"operator": {"log": {"format": "xml"}}}, "/operator/log/format", "'text', 'json'"),
    "port out of range": ({"operator": {"metricsPort": 70000}}, "/operator/metricsPort", "got 70,000"),
    "typo at the top": ({"replica": 1}, "replica", "replica"),
    "a budget that is no count": (
        {"podDisruptionBudget": {"maxUnavailable": "one"}},
        "/podDisruptionBudget/maxUnavailable",
        "one",
    ),
    "a budget below zero": (
        {"podDisruptionBudget": {"minAvailable": -1}},
        "/podDisruptionBudget/minAvailable",
        "-1",
    ),
    "scrape interval not a duration": (
        {"monitoring": {"serviceMonitor": {"interval": "often"}}},
        "/monitoring/serviceMonitor/interval",
        "often",
    ),
}


@pytest.mark.parametrize(("values", "path", "named"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_are_refused_with_a_message_naming_them(
    values: dict[str, Any], path: str, named: str
) -> None:
    # The message names the value's path and what is wrong with it (the bad value, or the allowed ones)
    with pytest.raises(helm.HelmValuesError) as refused:
        render(values)
    message = str(refused.value)
    assert path in message and named in message, message


def test_alerts_without_a_scrape_of_the_operator_are_flagged_at_install() -> None:
    rules_only = {"monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": RUNBOOK}}}
    assert "nothing scrapes them" in notes(rules_only)
    assert "nothing scrapes them" not in notes(MONITORING_ON)
    # With the user's own scrape job named, the absence alert watches that job
    own_job = {
        "monitoring": {
            "prometheusRule": {"enabled": True, "operatorJob": "kubernetes-pods", "runbookBaseUrl": RUNBOOK}
        }
    }
    assert "nothing scrapes them" not in notes(own_job)
    rules = [
        rule for group in one(render(own_job), "PrometheusRule")["spec"]["groups"] for rule in group["rules"]
    ]
    (absent,) = [rule for rule in rules if rule["alert"] == "SpecopsOperatorAbsent"]
    assert absent["expr"] == 'absent(up{job="kubernetes-pods"} == 1)'


# ---------------------------------------------------------------- values that fit real clusters


def _pod(objects: list[dict[str, Any]], name: str = FULLNAME) -> dict[str, Any]:
    pod: dict[str, Any] = one(objects, "Deployment", name)["spec"]["template"]["spec"]
    return pod


def test_name_overrides_rename_every_object_the_lease_and_the_name_label() -> None:
    objects = render({"fullnameOverride": "llm-operator", "nameOverride": "specdec"})
    deployment = one(objects, "Deployment", "llm-operator")
    assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "specdec"
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--lease-name") + 1] == "llm-operator"
    assert one(objects, "ServiceAccount")["metadata"]["name"] == "llm-operator"
    assert one(objects, "ClusterRole", "llm-operator")
    assert one(objects, "Role", "llm-operator-leader-election")
    # nameOverride alone: <release>-<name>
    assert one(render({"nameOverride": "specdec"}), "Deployment", "specops-specdec")


def test_security_contexts_are_values_and_stay_restricted_by_default() -> None:
    pod = _pod(render())
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    custom = {
        "podSecurityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1001,
            "fsGroup": 1001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod = _pod(render(custom))
    # Helm merges the given keys into the defaults
    assert pod["securityContext"] == {**custom["podSecurityContext"], "runAsGroup": 65532}
    assert pod["containers"][0]["securityContext"].items() >= custom["securityContext"].items()
    assert restricted_violations(pod) == []
    # a context that breaks the profile renders as asked: the namespace's admission refuses it
    loose = _pod(render({"securityContext": {"allowPrivilegeEscalation": True}}))
    assert restricted_violations(loose) != []


def test_extra_env_args_volumes_and_spread_reach_the_operator_pod() -> None:
    objects = render(CUSTOM)
    pod, container = _pod(objects), _operator_container(objects)
    assert container["command"][-1] == "--verbose"
    assert [env for env in container["env"] if env["name"] in ("HTTPS_PROXY", "TEAM")] == CUSTOM["extraEnv"]
    assert CUSTOM["extraVolumeMounts"][0] in container["volumeMounts"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert CUSTOM["extraVolumes"][0] in pod["volumes"]
    (spread,) = pod["topologySpreadConstraints"]
    # a constraint without labelSelector spreads the operator's own pods
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["labelSelector"] == {
        "matchLabels": one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    }
    own = {"matchLabels": {"team": "ml"}}
    (kept,) = _pod(
        render(
            {"topologySpreadConstraints": [{**CUSTOM["topologySpreadConstraints"][0], "labelSelector": own}]}
        )
    )["topologySpreadConstraints"]
    assert kept["labelSelector"] == own


def test_an_image_digest_pins_the_image() -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    container = _operator_container(
        render({"image": {"repository": "registry.example/specops", "digest": digest}})
    )
    assert container["image"] == f"registry.example/specops@{digest}"
    assert _operator_container(render())["image"] == "specops:0.1.0"


def test_lease_timings_reach_the_operator_and_a_wrong_order_is_refused() -> None:
    env = _env(_operator_container(render(CUSTOM)))
    config = OperatorConfig.from_env(env)
    assert (config.lease_duration_s, config.renew_deadline_s, config.retry_period_s) == (30, 20, 4)
    # the operator builds its leader election from them (LeaseTimings checks the order too)
    assert LeaseTimings(config.lease_duration_s, config.renew_deadline_s, config.retry_period_s)
    defaults = OperatorConfig.from_env(_env(_operator_container(render())))
    assert LeaseTimings(defaults.lease_duration_s, defaults.renew_deadline_s, defaults.retry_period_s) == (
        DEFAULT_TIMINGS
    )
    with pytest.raises(helm.HelmRenderError) as refused:
        render({"leaderElection": {"renewDeadlineSeconds": 20}})
    assert "retryPeriodSeconds (2) < renewDeadlineSeconds (20) < leaseDurationSeconds (15)" in str(
        refused.value
    )


def test_the_default_prometheus_url_reaches_the_operator() -> None:
    env = _env(_operator_container(render(CUSTOM)))
    assert OperatorConfig.from_env(env).prometheus_url == "https://prometheus.example/api/prom"
    # empty: the built-in default
    assert (
        OperatorConfig.from_env(_env(_operator_container(render()))).prometheus_url == DEFAULT_PROMETHEUS_URL
    )


@pytest.mark.parametrize(
    "values", [CUSTOM, {**CUSTOM, **{"watch": {"mode": "cluster"}}}], ids=["namespaced", "cluster"]
)
def test_prometheus_secret_names_grant_get_on_exactly_those_secrets(values: dict[str, Any]) -> None:
    objects = render(values)
    name = f"{FULLNAME}-prometheus-secrets"
    roles = [
        obj for obj in objects if obj["kind"] in ("Role", "ClusterRole") and obj["metadata"]["name"] == name
    ]
    bindings = [
        obj
        for obj in objects
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding") and obj["metadata"]["name"] == name
    ]
    namespaced = values["watch"]["mode"] == "namespaced"
    expected_namespaces = ["team-a", "team-b"] if namespaced else [None]
    assert sorted(role["metadata"].get("namespace") or "" for role in roles) == sorted(
        n or "" for n in expected_namespaces
    )
    for role in roles:
        assert role["kind"] == ("Role" if namespaced else "ClusterRole")
        (rule,) = role["rules"]
        assert rule["resourceNames"] == ["prometheus-auth"]
        assert _granted(role) == rbac.grants(rbac.PROMETHEUS_SECRET_RULES)  # get only: no list, no watch
        kubernetes_validate.validate(role, kubernetes_validate.latest_version(), strict=True)
    for binding in bindings:
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert len(bindings) == len(roles)


def test_no_secret_is_readable_unless_named() -> None:
    for obj in render(NAMESPACED):
        for rule in obj.get("rules", []):
            assert "secrets" not in rule["resources"], obj["metadata"]["name"]


def _serving_pod_labels() -> dict[str, str]:
    body = yaml.safe_load((ROOT / "docs/examples/dense-70b-7b.yaml").read_text())
    body["metadata"]["uid"] = "0b6f1c52-1c1e-4c1a-9d7e-3a1f2e4b5c6d"
    resource = SpeculativeDeployment.model_validate(body)
    revision = Revision(mode="spec", method="draftModel", draft="d", schedule=Schedule.constant(4))
    children = render_children(resource, RenderOptions(triton_model_source="# model\n"), revision)
    deployments = [obj for obj in children if obj["kind"] == "Deployment"]
    labels: dict[str, str] = deployments[0]["spec"]["template"]["metadata"]["labels"]
    return labels


@pytest.mark.parametrize(
    "values", [CUSTOM, {**CUSTOM, "watch": {"mode": "cluster"}}], ids=["namespaced", "cluster"]
)
def test_the_network_policy_allows_exactly_the_operators_flows(values: dict[str, Any]) -> None:
    objects = render(values)
    policy = one(objects, "NetworkPolicy", FULLNAME)
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # ingress: the metrics port only, from the monitoring namespace
    (ingress,) = spec["ingress"]
    assert ingress["ports"] == [{"port": 9090, "protocol": "TCP"}]  # CUSTOM's operator.metricsPort
    assert ingress["from"] == values["networkPolicy"]["metricsFrom"]
    api, prometheus, engines, dns = spec["egress"]
    assert api == {"ports": [{"port": 443, "protocol": "TCP"}], "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}
    assert [port["port"] for port in prometheus["ports"]] == [9090, 443]
    assert "to" not in prometheus  # any address: a managed Prometheus is outside the cluster
    assert [port["port"] for port in engines["ports"]] == [8000, 30000]
    (serving,) = engines["to"]
    # the peer selects the pods the operator renders (the lossless check talks to them)
    assert serving["podSelector"]["matchLabels"].items() <= _serving_pod_labels().items()
    if values["watch"]["mode"] == "namespaced":
        assert serving["namespaceSelector"]["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]
    else:
        assert serving["namespaceSelector"] == {}
    assert sorted((port["port"], port["protocol"]) for port in dns["ports"]) == [(53, "TCP"), (53, "UDP")]
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)


def test_no_network_policy_by_default() -> None:
    assert not [obj for obj in render() if obj["kind"] == "NetworkPolicy"]


def test_alerts_need_an_absolute_runbook_url() -> None:
    rules = {"monitoring": {"prometheusRule": {"enabled": True}}}
    with pytest.raises(helm.HelmRenderError) as refused:
        render(rules)
    assert "monitoring.prometheusRule.runbookBaseUrl is required" in str(refused.value)
    with pytest.raises(helm.HelmValuesError) as relative:
        render({"monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": "docs/runbook.md"}}})
    assert "/monitoring/prometheusRule/runbookBaseUrl" in str(relative.value)
    rule = one(
        render({"monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": RUNBOOK + "/"}}}),
        "PrometheusRule",
    )
    urls = {r["annotations"]["runbook_url"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert all(url.startswith(RUNBOOK + "#") for url in urls)
    # without the alerts no URL is needed
    assert not [obj for obj in render() if obj["kind"] == "PrometheusRule"]


def test_the_install_notes_warn_while_the_image_is_the_unpublished_default() -> None:
    assert "no such\nimage is published" in notes()
    assert "no such" not in notes({"image": {"repository": "registry.example/specops"}})
