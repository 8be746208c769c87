"""The install manifests in deploy/: valid for a current API server, restricted, least privilege.

The operator rules (specops/rbac.py, which the ClusterRole must equal) are checked against the code: every kind the Kubernetes client can
address (adapters/kube.py PLURALS) and every training kind retraining can create must be
granted exactly the verbs their call sites use, plus what Kopf itself needs; nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from specops import rbac
from specops.adapters.kube import PLURALS
from specops.domain import retraining
from specops.services.reconciler import MANAGED_KINDS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SOURCE = ROOT / "operator" / "specops"
NAMESPACE = "specops-system"
OPERATOR = "specops-operator"

Grant = tuple[str, str]  # (apiGroup, resource)

# What the code and Kopf use, per resource: specops/rbac.py is the one list the manifests and the
# chart grant; the tests below check that list against the code and deploy/ against the list.
USED: dict[Grant, set[str]] = rbac.grants()


def _objects() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(DEPLOY.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path.name, document


OBJECTS = list(_objects())


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [obj for _, obj in OBJECTS if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in deploy/, found {len(found)}"
    return found[0]


def _granted(role: dict[str, Any]) -> dict[Grant, set[str]]:
    granted: dict[Grant, set[str]] = {}
    for rule in role["rules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Breaches of the Kubernetes "restricted" Pod Security Standard, plus a read-only root filesystem."""
    problems = [f"{key} is set" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    allowed_volumes = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            problems.append(f"volume {volume['name']} uses {sorted(kinds - allowed_volumes)}")
    pod_security = pod.get("securityContext", {})
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        name = container["name"]
        security = container.get("securityContext", {})
        if security.get("privileged"):
            problems.append(f"{name}: privileged")
        if security.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = security.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
        if not security.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot is not true")
        if security.get("runAsUser", pod_security.get("runAsUser")) == 0:
            problems.append(f"{name}: runs as user 0")
        seccomp = security.get("seccompProfile", pod_security.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is not RuntimeDefault")
        if security.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: root filesystem is writable")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{name}: uses a hostPort")
    return problems


# ---------------------------------------------------------------- validity


def test_the_schemas_are_those_of_a_current_kubernetes() -> None:
    newest = tuple(int(part) for part in kubernetes_validate.latest_version().split(".")[:2])
    assert newest >= (1, 31)


@pytest.mark.parametrize(
    ("file", "obj"), OBJECTS, ids=[f"{file}:{obj['kind']}/{obj['metadata']['name']}" for file, obj in OBJECTS]
)
def test_every_object_passes_strict_schema_validation(file: str, obj: dict[str, Any]) -> None:
    # Given an object from deploy/; when validated strictly (unknown fields refused)
    # then the newest Kubernetes schema accepts it
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_namespaced_objects_live_in_the_operator_namespace() -> None:
    namespaced = [obj for _, obj in OBJECTS if obj["kind"] in ("ServiceAccount", "Deployment")]
    assert namespaced
    assert {obj["metadata"]["namespace"] for obj in namespaced} == {NAMESPACE}
    assert _one("Namespace", NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
        "restricted"
    )


# ---------------------------------------------------------------- the operator Deployment


def test_the_operator_pod_meets_the_restricted_profile() -> None:
    pod = _one("Deployment", OPERATOR)["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []


def test_the_restricted_check_catches_a_breach() -> None:
    # Given the operator's pod with one container allowed to escalate and a hostPath volume
    pod = yaml.safe_load(yaml.safe_dump(_one("Deployment", OPERATOR)["spec"]["template"]["spec"]))
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    # Then both are reported
    assert restricted_violations(pod) == [
        "volume host uses ['hostPath']",
        "operator: allowPrivilegeEscalation is not false",
    ]


def test_two_leader_elected_operators_run_with_their_liveness_endpoint_probed() -> None:
    deployment = _one("Deployment", OPERATOR)
    # Two replicas, of which only the Lease holder acts; a rolling update adds a follower first
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == OPERATOR
    (container,) = pod["containers"]
    assert container["command"] == [
        "specops",
        "run",
        "--leader-election",
        "--liveness",
        "http://0.0.0.0:8080/healthz",
    ]
    (pod_namespace,) = [env for env in container["env"] if env["name"] == "POD_NAMESPACE"]
    assert pod_namespace["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and ports[probe["port"]] == 8080
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def test_a_disruption_budget_keeps_one_of_the_two_operators_through_drains() -> None:
    deployment = _one("Deployment", OPERATOR)
    budget = _one("PodDisruptionBudget", OPERATOR)
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert budget["metadata"]["namespace"] == NAMESPACE


def test_every_operator_setting_in_the_manifest_is_one_the_operator_reads() -> None:
    read = set(re.findall(r"SPECOPS_[A-Z_]+", (SOURCE / "services" / "config.py").read_text()))
    (container,) = _one("Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"]
    set_here = {env["name"] for env in container["env"] if env["name"].startswith("SPECOPS_")}
    # Every setting is shown (so it is documented where it is changed), and none is invented
    assert set_here == read


# ---------------------------------------------------------------- RBAC


def test_the_service_account_is_bound_to_the_operator_role() -> None:
    binding = _one("ClusterRoleBinding", OPERATOR)
    _one("ServiceAccount", OPERATOR)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": OPERATOR,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]


def test_the_operator_role_grants_exactly_the_operator_rules() -> None:
    granted = _granted(_one("ClusterRole", OPERATOR))
    assert granted == USED


def test_the_leader_election_role_grants_the_lease_only_in_the_operator_namespace() -> None:
    role = _one("Role", f"{OPERATOR}-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _granted(role) == rbac.grants(rbac.LEADER_ELECTION_RULES)
    binding = _one("RoleBinding", f"{OPERATOR}-leader-election")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]


def test_no_role_uses_wildcards() -> None:
    for _, obj in OBJECTS:
        if obj["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in obj["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in value for value in rule.get(field, [])), (obj["metadata"]["name"], rule)


def test_every_kind_the_client_can_address_is_granted_or_unused() -> None:
    """A kind added to PLURALS fails here until specops/rbac.py (and so the ClusterRole) says what it needs."""
    granted = rbac.grants(rbac.OPERATOR_RULES + rbac.LEADER_ELECTION_RULES + rbac.PROMETHEUS_SECRET_RULES)
    kube_client = SOURCE / "adapters" / "kube.py"
    sources = [path for path in SOURCE.rglob("*.py") if path != kube_client]
    for (api_version, kind), plural in PLURALS.items():
        if (_group(api_version), plural) in granted:
            continue
        # Not granted: then no code outside the plural table may name the kind.
        users = [str(path.relative_to(ROOT)) for path in sources if f'"{kind}"' in path.read_text()]
        assert users == [], f"{kind} is used by {users} but not granted"


def test_the_serving_objects_the_reconciler_prunes_are_fully_granted() -> None:
    granted = USED
    for api_version, kind in MANAGED_KINDS:
        grant = (_group(api_version), PLURALS[(api_version, kind)])
        assert {"get", "list", "create", "patch", "delete"} <= granted[grant], kind


def test_every_training_kind_retraining_supports_can_be_created_and_followed() -> None:
    granted = USED
    for training in retraining.SUPPORTED_KINDS:
        grant = (_group(training.api_version), f"{training.kind.lower()}s")
        assert {"get", "create"} <= granted.get(grant, set()), training.kind
