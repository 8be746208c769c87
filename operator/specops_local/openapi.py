"""OpenAPI documents and Table responses for the emulated API server, so real kubectl works against it.

- ``/openapi/v3`` (index) and ``/openapi/v3/apis/<group>/<version>`` (one document per group
  version): the CRDs' schemas as the API server publishes them (``x-kubernetes-group-version-kind``,
  ObjectMeta by reference) and paths whose PATCH operations list the ``fieldValidation`` and
  ``dryRun`` parameters. kubectl reads them to decide that the server validates fields
  (``kubectl apply`` then sends ``fieldValidation=Strict``) and for ``kubectl explain``.
- ``/openapi/v2``: the same schemas in one Swagger 2.0 document, as JSON only (kubectl asks for
  protobuf first and is answered 406; it uses v3).
- Tables: ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` on a get or list answers a
  ``meta.k8s.io/v1`` Table with the CRD's additionalPrinterColumns evaluated (dates as ages),
  and for built-ins the columns kubectl users know for pods, deployments, jobs and events (Name + Age
  otherwise).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import kmock

from specops.api import columns

Body = dict[str, Any]

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
OBJECT_META_SCHEMA: Body = {
    "description": "ObjectMeta is metadata that all persisted resources must have.",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "generateName": {"type": "string", "description": "Prefix for a server-generated name."},
        "namespace": {
            "type": "string",
            "description": "Namespace defines the space within which the name is unique.",
        },
        "labels": {
            "type": "object",
            "additionalProperties": {"type": "string", "default": ""},
            "description": "Map of string keys and values to organize and categorize objects.",
        },
        "annotations": {
            "type": "object",
            "additionalProperties": {"type": "string", "default": ""},
            "description": "Unstructured key value map stored with a resource.",
        },
        "uid": {"type": "string", "description": "Unique in time and space for this object."},
        "resourceVersion": {"type": "string", "description": "Opaque version for optimistic concurrency."},
        "generation": {
            "type": "integer",
            "format": "int64",
            "description": "Sequence number of the desired state.",
        },
        "creationTimestamp": {
            "type": "string",
            "format": "date-time",
            "description": "When the object was created.",
        },
        "deletionTimestamp": {
            "type": "string",
            "format": "date-time",
            "description": "When deletion was requested.",
        },
        "finalizers": {
            "type": "array",
            "items": {"type": "string", "default": ""},
            "description": "Must be empty before the object is deleted.",
        },
        "ownerReferences": {
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "description": "Objects depended by this object.",
        },
    },
}
QUERY_PARAMETERS: list[Body] = [
    {
        "name": "dryRun",
        "in": "query",
        "description": "When present, modifications are not persisted. Valid value: All.",
        "schema": {"type": "string", "uniqueItems": True},
    },
    {
        "name": "fieldManager",
        "in": "query",
        "description": "A name for the actor making these changes.",
        "schema": {"type": "string", "uniqueItems": True},
    },
    {
        "name": "fieldValidation",
        "in": "query",
        "description": "How to handle unknown fields: Ignore, Warn (the default) or Strict.",
        "schema": {"type": "string", "uniqueItems": True},
    },
]
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")
BUILTIN_PATCH_TYPES = (*PATCH_TYPES, "application/strategic-merge-patch+json")


def reverse_domain(group: str) -> str:
    """specops.dev -> dev.specops; the core group is io.k8s.api.core."""
    return ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"


def group_version_path(res: kmock.resource) -> str:
    return f"apis/{res.group}/{res.version}" if res.group else f"api/{res.version}"


def definition_name(res: kmock.resource, kind: str) -> str:
    return f"{reverse_domain(res.group or '')}.{res.version}.{kind}"


def _with_meta_reference(schema: Mapping[str, Any], ref_prefix: str, kind_name: str, gvk: Body) -> Body:
    body = copy.deepcopy(dict(schema))
    properties = body.setdefault("properties", {})
    properties.setdefault(
        "apiVersion",
        {"type": "string", "description": "APIVersion defines the versioned schema of this object."},
    )
    properties.setdefault(
        "kind", {"type": "string", "description": "Kind is the REST resource this object represents."}
    )
    properties["metadata"] = {
        "description": "Standard object's metadata.",
        "allOf": [{"$ref": f"{ref_prefix}{OBJECT_META}"}],
    }
    body["x-kubernetes-group-version-kind"] = [gvk]
    body.setdefault("type", "object")
    body.setdefault("description", kind_name)
    return body


class OpenApi:
    """Builds the documents from what the emulator serves (registered resources and CRD schemas)."""

    def __init__(self, resources: Any, schemas: Mapping[kmock.resource, Body]) -> None:
        """``resources``: kmock's registry of served resources (resource -> ResourceInfo)."""
        self.resources = resources
        self.schemas = schemas

    def _group_versions(self) -> dict[str, list[kmock.resource]]:
        grouped: dict[str, list[kmock.resource]] = {}
        for res in self.resources:
            grouped.setdefault(group_version_path(res), []).append(res)
        return grouped

    def _schema(self, res: kmock.resource, ref_prefix: str) -> Body:
        info = self.resources[res]
        kind = info.kind or ""
        gvk = {"group": res.group or "", "version": res.version or "", "kind": kind}
        schema = self.schemas.get(res)
        if schema is None:
            schema = {
                "description": f"{kind}: a built-in kind; its fields are not described by this emulator.",
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
        return _with_meta_reference(schema, ref_prefix, kind, gvk)

    def _paths(self, resources: Sequence[kmock.resource], *, v3: bool, ref_prefix: str) -> Body:
        paths: Body = {}
        for res in resources:
            info = self.resources[res]
            kind = info.kind or ""
            gvk = {"group": res.group or "", "version": res.version or "", "kind": kind}
            ref = {"$ref": f"{ref_prefix}{definition_name(res, kind)}"}
            base = f"/{group_version_path(res)}"
            collection = (
                f"{base}/namespaces/{{namespace}}/{res.plural}"
                if info.namespaced is not False
                else f"{base}/{res.plural}"
            )
            patch_types = PATCH_TYPES if res in self.schemas else BUILTIN_PATCH_TYPES

            def operation(
                action: str,
                verb: str,
                *,
                body: Sequence[str] = (),
                kind: str = kind,
                gvk: Body = gvk,
                ref: Body = ref,
            ) -> Body:
                op: Body = {
                    "operationId": f"{verb}{kind}",
                    "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": copy.deepcopy(QUERY_PARAMETERS) if body else [],
                    "responses": {"200": {"description": "OK"}},
                }
                if v3:
                    if body:
                        op["requestBody"] = {"content": {t: {"schema": ref} for t in body}, "required": True}
                    op["responses"]["200"]["content"] = {"application/json": {"schema": ref}}
                else:
                    if body:
                        op["parameters"] = [
                            *(
                                {k: v for k, v in p.items() if k != "schema"} | {"type": "string"}
                                for p in QUERY_PARAMETERS
                            ),
                            {"name": "body", "in": "body", "required": True, "schema": ref},
                        ]
                        op["consumes"] = list(body)
                    op["responses"]["200"]["schema"] = ref
                return op

            paths[collection] = {
                "get": operation("list", "list"),
                "post": operation("post", "create", body=("application/json",)),
            }
            paths[f"{collection}/{{name}}"] = {
                "get": operation("get", "read"),
                "put": operation("put", "replace", body=("application/json",)),
                "patch": operation("patch", "patch", body=patch_types),
                "delete": operation("delete", "delete"),
            }
        return paths

    def v3_document(self, gv_path: str) -> Body | None:
        resources = self._group_versions().get(gv_path)
        if resources is None:
            return None
        prefix = "#/components/schemas/"
        schemas = {OBJECT_META: copy.deepcopy(OBJECT_META_SCHEMA)}
        for res in resources:
            schemas[definition_name(res, self.resources[res].kind or "")] = self._schema(res, prefix)
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": self._paths(resources, v3=True, ref_prefix=prefix),
            "components": {"schemas": schemas},
        }

    def v3_index(self) -> Body:
        paths = {}
        for gv_path in sorted(self._group_versions()):
            digest = hashlib.sha512(
                json.dumps(self.v3_document(gv_path), sort_keys=True).encode()
            ).hexdigest()
            paths[gv_path] = {"serverRelativeURL": f"/openapi/v3/{gv_path}?hash={digest[:64].upper()}"}
        return {"paths": paths}

    def v2_document(self) -> Body:
        prefix = "#/definitions/"
        definitions = {OBJECT_META: copy.deepcopy(OBJECT_META_SCHEMA)}
        paths: Body = {}
        for resources in self._group_versions().values():
            for res in resources:
                definitions[definition_name(res, self.resources[res].kind or "")] = self._schema(res, prefix)
            paths.update(self._paths(resources, v3=False, ref_prefix=prefix))
        return {
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": paths,
            "definitions": definitions,
        }


# ---------------------------------------------------------------- Table


def wants_table(accept: str) -> bool:
    """kubectl get asks for meta.k8s.io/v1 Tables first (and v1beta1, and plain JSON as fallbacks)."""
    first = accept.split(",")[0].replace(" ", "")
    return "as=Table" in first and "g=meta.k8s.io" in first


NAME_COLUMN: Body = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}
AGE_COLUMN: Body = {
    "name": "Age",
    "type": "date",
    "jsonPath": ".metadata.creationTimestamp",
    "description": "CreationTimestamp is when the object was created.",
    "priority": 0,
}


def _ready_pods(obj: Body) -> str:
    statuses = (obj.get("status") or {}).get("containerStatuses")
    containers = (obj.get("spec") or {}).get("containers") or []
    if statuses is None:  # no kubelet reports per container here: the Ready condition stands for all
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return f"{len(containers) if ready else 0}/{len(containers)}"
    return f"{sum(1 for c in statuses if c.get('ready'))}/{len(statuses)}"


def _ready_replicas(obj: Body) -> str:
    status = obj.get("status") or {}
    return f"{status.get('readyReplicas', 0)}/{(obj.get('spec') or {}).get('replicas', 1)}"


def _job_status(obj: Body) -> str:
    conditions = (obj.get("status") or {}).get("conditions") or []
    for kind in ("Complete", "Failed"):
        if any(c.get("type") == kind and c.get("status") == "True" for c in conditions):
            return kind
    return "Running"


def _completions(obj: Body) -> str:
    return f"{(obj.get('status') or {}).get('succeeded', 0)}/{(obj.get('spec') or {}).get('completions', 1)}"


def _event_first_seen(obj: Body) -> str | None:
    return obj.get("firstTimestamp") or obj.get("eventTime")


def _event_last_seen(obj: Body) -> str | None:
    series = obj.get("series") or {}
    return series.get("lastObservedTime") or obj.get("lastTimestamp") or _event_first_seen(obj)


def _event_object(obj: Body) -> str:
    involved = obj.get("involvedObject") or {}
    kind = str(involved.get("kind") or "").lower()
    return f"{kind}/{involved['name']}" if involved.get("name") else kind


def _event_source(obj: Body) -> str:
    source = obj.get("source") or {}
    component = source.get("component") or obj.get("reportingComponent") or ""
    instance = source.get("host") or obj.get("reportingInstance") or ""
    if not component:
        return "<unknown>"
    return f"{component}, {instance}" if instance else component


def _event_count(obj: Body) -> int:
    series = obj.get("series") or {}
    return int(series.get("count") or obj.get("count") or 1)


# The columns kubectl shows for the built-ins the local stack runs (computed where the server computes).
# A list holding a column of format "name" places the name itself (Events: last, wide only).
BUILTIN_COLUMNS: dict[str, list[Body]] = {
    "pods": [
        {"name": "Ready", "type": "string", "compute": _ready_pods},
        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Restarts", "type": "integer", "compute": lambda obj: 0},
        AGE_COLUMN,
        {"name": "IP", "type": "string", "jsonPath": ".status.podIP", "priority": 1},
    ],
    "deployments": [
        {"name": "Ready", "type": "string", "compute": _ready_replicas},
        {"name": "Up-to-date", "type": "integer", "jsonPath": ".status.updatedReplicas"},
        {"name": "Available", "type": "integer", "jsonPath": ".status.availableReplicas"},
        AGE_COLUMN,
    ],
    "jobs": [
        {"name": "Status", "type": "string", "compute": _job_status},
        {"name": "Completions", "type": "string", "compute": _completions},
        AGE_COLUMN,
    ],
    "events": [
        {"name": "Last Seen", "type": "date", "compute": _event_last_seen},
        {"name": "Type", "type": "string", "jsonPath": ".type"},
        {"name": "Reason", "type": "string", "jsonPath": ".reason"},
        {"name": "Object", "type": "string", "compute": _event_object},
        {"name": "Subobject", "type": "string", "jsonPath": ".involvedObject.fieldPath", "priority": 1},
        {"name": "Source", "type": "string", "compute": _event_source, "priority": 1},
        {"name": "Message", "type": "string", "compute": lambda obj: str(obj.get("message") or "").strip()},
        {"name": "First Seen", "type": "date", "compute": _event_first_seen, "priority": 1},
        {"name": "Count", "type": "integer", "compute": _event_count, "priority": 1},
        {**NAME_COLUMN, "priority": 1},
    ],
}


def table(
    printer_columns: Sequence[Mapping[str, Any]] | None,
    objects: Sequence[Body],
    resource_version: str,
    now: datetime.datetime,
    include_object: str = "Metadata",
) -> Body:
    """A meta.k8s.io/v1 Table as the API server renders one for a CRD (or Name + Age without columns)."""
    shown = list(printer_columns) if printer_columns else [AGE_COLUMN]
    named = any(c.get("format") == "name" for c in shown)
    definitions = ([] if named else [NAME_COLUMN]) + [
        {
            "name": c["name"],
            "type": "string" if c["type"] == "date" else c["type"],
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": int(c.get("priority", 0)),
        }
        for c in shown
    ]
    rows = []
    for obj in objects:
        cells: list[Any] = [] if named else [obj["metadata"]["name"]]
        for column in shown:
            if column.get("format") == "name":
                cells.append(obj["metadata"]["name"])
                continue
            compute = column.get("compute")
            value = compute(obj) if compute is not None else columns.evaluate(str(column["jsonPath"]), obj)
            if column["type"] == "date":
                cells.append(columns.age(value, now) if value else None)
            else:
                cells.append(columns.cell_value(value, str(column["type"])))
        row: Body = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }
