"""A Kubernetes API server for tests: kmock's KubernetesEmulator plus a fidelity layer.

kmock 0.8 stores objects verbatim and matches requests quadratically, which is
not enough for Kopf (see DESIGN.md, "The emulated API server"). This subclass
takes over every Kubernetes request and serves it the way an API server does:
metadata stamping, optimistic concurrency, merge/JSON/strategic patches, a
status subresource, finalizers, ownerReference garbage collection, selectors,
resumable watches with 410 Gone, discovery and an admission hook.

The store stays kmock's ``emulator.objects`` (every write is a new version in
the object's history), so kmock-style assertions keep working. Reactions that
tests add with kmock's DSL (``emulator['patch', resource] << 500``) still win
over the emulated server, but they are matched against the current request only.
The write path is synchronous (no ``await`` between read and write), so
requests never interleave inside a write and no lock is needed.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import copy
import dataclasses
import datetime
import json
import logging
import random
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeAlias, cast

import aiohttp.web
import attrs
import kmock
import orjson
import yaml
from kmock._internal import enums, rendering
from typing_extensions import override

from specops.adapters.json_data import json_copy
from specops_local import openapi
from specops_local.admission import AdmissionError, CrdAdmission, prune_unknown
from specops_local.object_names import metadata_causes

log = logging.getLogger(__name__)

Body: TypeAlias = dict[str, Any]
AdmissionHook: TypeAlias = Callable[[str, Body, Body | None], Body]
ResourceRef: TypeAlias = "kmock.resource | str"

PROTOBUF: Final = "application/vnd.kubernetes.protobuf"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
ALL_VERBS: Final = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
CRD_RESOURCE: Final = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
NAMESPACES: Final = kmock.resource("", "v1", "namespaces")
_NAME_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
GENERATE_NAME_TRIES: Final = 8
"""Names kube-apiserver generates for one create with generateName before it answers 409 (KEP-4420)."""
OPENAPI_V2_PROTOBUF: Final = "application/com.github.proto-openapi.spec.v2"
FIELD_VALIDATIONS: Final = ("Ignore", "Warn", "Strict")
# Warnings of the request being served (one list per request task), sent as `Warning: 299 - "..."` headers.
_WARNINGS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("warnings", default=None)


def _warn(text: str) -> None:
    warnings = _WARNINGS.get()
    if warnings is not None:
        warnings.append(text)


class ApiError(kmock.KubernetesError):
    """A failure answered as a Kubernetes ``Status`` body (no traceback, unlike kmock's)."""


def _resource(ref: ResourceRef) -> kmock.resource:
    return ref if isinstance(ref, kmock.resource) else kmock.resource(ref)


class AdmissionHooks(dict[kmock.resource, AdmissionHook]):
    """Admission hooks by resource; keys may be given as strings like ``group/version/plural``."""

    def __setitem__(self, key: ResourceRef, value: AdmissionHook) -> None:
        super().__setitem__(_resource(key), value)

    def __getitem__(self, key: ResourceRef) -> AdmissionHook:
        return super().__getitem__(_resource(key))

    def __contains__(self, key: object) -> bool:
        return super().__contains__(_resource(key) if isinstance(key, str) else key)


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    revision: int
    type: str
    namespace: str | None
    name: str
    object: Body
    previous: Body | None  # for selector transitions: an object leaving a selection is DELETED


@dataclasses.dataclass(frozen=True)
class Route:
    """A request path split the way the API server routes it (kmock 0.8 mis-parses namespaces)."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_route(path: str) -> Route | None:
    parts = [part for part in path.strip("/").split("/") if part]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    serves_namespace_itself = len(rest) <= 2 or (len(rest) == 3 and rest[2] in ("status", "finalize"))
    if rest[0] == "namespaces" and not serves_namespace_itself:
        namespace, plural, *tail = rest[1:]
        return Route(group, version, plural, namespace, tail[0] if tail else None, "/".join(tail[1:]) or None)
    plural, *tail = rest
    return Route(group, version, plural, None, tail[0] if tail else None, "/".join(tail[1:]) or None)


# --- JSON -----------------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    """NaN and Infinity are not JSON: the API server's decoder refuses them, and so the store, whose
    objects are copied through orjson (`json_copy`: three copies per status write were a sixth of
    this server's CPU over a reconcile at 2,000), never holds one that a copy would turn into null."""
    raise ValueError(f"{name} is not JSON")


# --- patches --------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes a key, anything else replaces. Neither
    argument is changed; the result shares nothing with them."""
    if not isinstance(patch, dict):
        return json_copy(patch)
    result = json_copy(target) if isinstance(target, dict) else {}
    _merge_into(result, patch)
    return result


def _merge_into(result: dict[str, Any], patch: dict[str, Any]) -> None:
    """`merge_patch` onto ``result`` (a copy the caller owns), copying only what the patch brings."""
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            if not isinstance(current, dict):
                current = result[key] = {}
            _merge_into(current, value)
        else:
            result[key] = json_copy(value) if isinstance(value, list) else value


def strip_strategic_directives(patch: Any) -> Any:
    """Strategic merge patch is treated as a merge patch; its ``$``-directives are dropped."""
    if isinstance(patch, dict):
        return {k: strip_strategic_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [strip_strategic_directives(item) for item in patch]
    return patch


class PatchError(Exception):
    pass


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer: {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"doc is missing path: /{'/'.join(parts)}")
    return node


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    parent, last = _parent(doc, parts), parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"doc is missing path: /{'/'.join(parts)}")


def _remove(doc: Any, parts: list[str]) -> Any:
    value = _get(doc, parts)
    parent, last = _parent(doc, parts), parts[-1]
    if isinstance(parent, dict):
        del parent[last]
    else:
        del parent[int(last)]
    return value


def _add(doc: Any, parts: list[str], value: Any, *, replace: bool) -> Any:
    if not parts:
        return value
    parent, last = _parent(doc, parts), parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"replace operation does not apply: doc is missing key: /{'/'.join(parts)}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise PatchError(f"index out of range: /{'/'.join(parts)}")
    else:
        raise PatchError(f"doc is missing path: /{'/'.join(parts)}")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test); any failure is a PatchError (422)."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = json_copy(doc)
    for operation in operations:
        op, parts = operation.get("op"), _pointer(operation.get("path", ""))
        if op == "test":
            if _get(doc, parts) != operation.get("value"):
                raise PatchError(f"testing value /{'/'.join(parts)} failed")
        elif op == "remove":
            _remove(doc, parts)
        elif op in ("add", "replace"):
            doc = _add(doc, parts, copy.deepcopy(operation.get("value")), replace=op == "replace")
        elif op == "move":
            doc = _add(doc, parts, _remove(doc, _pointer(operation["from"])), replace=False)
        elif op == "copy":
            doc = _add(doc, parts, copy.deepcopy(_get(doc, _pointer(operation["from"]))), replace=False)
        else:
            raise PatchError(f"unsupported JSON patch operation: {op!r}")
    return doc


# --- selectors ------------------------------------------------------------------------------------

_LABEL_TERM: Final = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9_.-]*)|\s(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


@dataclasses.dataclass(frozen=True)
class LabelRequirement:
    """One term of a label selector; ``notin`` (and ``!=``) also match objects without the label."""

    key: str
    operator: str  # in, notin, exists, !exists
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "!exists":
            return self.key not in labels
        if self.operator == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values


def parse_label_selector(selector: str) -> list[LabelRequirement]:
    """Equality (``=``, ``==``, ``!=``), set (``in``, ``notin``) and existence (``k``, ``!k``) terms."""
    requirements = []
    for term in _split_terms(selector):
        match = _LABEL_TERM.match(term)
        if match is None or (match["neg"] and (match["op"] or match["set"])):
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
        key = match["key"]
        if match["op"]:
            operator = "notin" if match["op"] == "!=" else "in"
            requirements.append(LabelRequirement(key, operator, frozenset([match["value"]])))
        elif match["set"]:
            values = frozenset(value.strip() for value in match["values"].split(",") if value.strip())
            requirements.append(LabelRequirement(key, match["set"], values))
        else:
            requirements.append(LabelRequirement(key, "!exists" if match["neg"] else "exists"))
    return requirements


@dataclasses.dataclass(frozen=True)
class FieldRequirement:
    """``metadata.name``/``metadata.namespace`` (and, leniently, any dotted path) with =, ==, !=."""

    path: str
    value: str
    negated: bool

    def matches(self, obj: Body) -> bool:
        node: Any = obj
        for part in self.path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        actual = "" if node is None else str(node)
        return (actual == self.value) != self.negated


def parse_field_selector(selector: str) -> list[FieldRequirement]:
    requirements = []
    for term in _split_terms(selector):
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if match is None:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        path, operator, value = match.groups()
        requirements.append(FieldRequirement(path, value, negated=operator == "!="))
    return requirements


# --- the emulator ---------------------------------------------------------------------------------


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _timestamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _essence(obj: Body) -> Body:
    """What ``generation`` tracks: everything except metadata and status."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}


@attrs.define(kw_only=True)
class FidelityEmulator(kmock.KubernetesEmulator):
    """kmock's emulator taking over every Kubernetes request with API-server semantics."""

    history_limit: int = 10_000  # watch events kept per resource; older resumes get 410 Gone
    clock: Callable[[], datetime.datetime] = _utc_now
    admission: AdmissionHooks = attrs.field(factory=AdmissionHooks)
    # Structural schemas (pruning, OpenAPI) and printer columns (Tables) of CRD-served resources.
    schemas: dict[kmock.resource, Body] = attrs.field(factory=dict)
    printer_columns: dict[kmock.resource, list[Body]] = attrs.field(factory=dict)

    _revision: int = attrs.field(default=0, init=False)
    _events: dict[kmock.resource, collections.deque[WatchEvent]] = attrs.field(factory=dict, init=False)
    _compacted: dict[kmock.resource, int] = attrs.field(factory=dict, init=False)
    _changed: dict[kmock.resource, asyncio.Event] = attrs.field(factory=dict, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _cuts: int = attrs.field(default=0, init=False)
    _watchers: collections.Counter[kmock.resource] = attrs.field(factory=collections.Counter, init=False)
    _matching: rendering.Request | None = attrs.field(default=None, init=False)
    # Live objects by (resource, label key, label value), so a LIST with an equality term in its
    # label selector (an operator's pods LIST per tick) reads its matches, not the whole store.
    _label_index: dict[tuple[Any, str, str], set[Any]] = attrs.field(factory=dict, init=False)
    _labels_of: dict[Any, list[tuple[Any, str, str]]] = attrs.field(factory=dict, init=False)
    _stored_keys: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        """Register no fallback reactions: the emulated server below replaces all of them."""

    # kmock matches a reaction by scanning every request it ever recorded (quadratic);
    # while matching, the request log is narrowed to the request being served.
    @override
    def __iter__(self) -> Iterator[rendering.Request]:
        if self._matching is not None:
            yield self._matching
        else:
            yield from super().__iter__()

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def requests(self) -> list[kmock.Request]:
        """Every request answered so far, in order (tests count what the operator asked)."""
        return self._requests

    def watchers(self, res: ResourceRef) -> int:
        """How many watch streams are open on a resource (tests wait for an operator to be watching)."""
        return self._watchers[_resource(res)]

    # --- HTTP entry point ---

    @override
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw_request.read()
        request = self._parse_request(raw_request, body)
        self._requests.append(request)
        warnings: list[str] = []
        token = _WARNINGS.set(warnings)
        try:
            response = await self._handle(request)
        except ApiError as exc:
            response = self._status_response(exc)
        except kmock.KubernetesError as exc:
            response = self._status_response(ApiError(exc.status, exc.reason, exc.message, exc.details))
        finally:
            _WARNINGS.reset(token)
        if warnings and not response.prepared:
            for text in warnings:
                response.headers.add("Warning", f"299 - {json.dumps(text)}")
        return response

    def _parse_request(self, raw_request: aiohttp.web.BaseRequest, body: bytes) -> rendering.Request:
        route = parse_route(raw_request.path)
        method = enums.method(raw_request.method)
        params = dict(raw_request.query)
        action: enums.action | None = None
        if route is not None:
            if method == enums.method.GET:
                watching = params.get("watch") in ("true", "1")
                action = (
                    enums.action.WATCH
                    if watching
                    else (enums.action.FETCH if route.name else enums.action.LIST)
                )
            elif method == enums.method.POST:
                action = enums.action.CREATE
            elif method in (enums.method.PATCH, enums.method.PUT):
                action = enums.action.UPDATE
            elif method == enums.method.DELETE:
                action = enums.action.DELETE
        text = body.decode("utf-8", errors="replace")
        data: Any = None
        content_type = raw_request.headers.get("Content-Type", "")
        if body and not content_type.startswith(PROTOBUF):
            try:
                data = (
                    yaml.safe_load(text)
                    if content_type.startswith(APPLY_PATCH)
                    else json.loads(text, parse_constant=_refuse_constant)
                )
            except (ValueError, yaml.YAMLError):
                data = None
        return rendering.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=method,
            params=params,
            headers=dict(raw_request.headers),
            cookies=dict(raw_request.cookies),
            body=body,
            text=text,
            data=data,
            action=action,
            resource=kmock.resource(route.group, route.version, route.plural) if route else None,
            namespace=route.namespace if route else None,
            name=route.name if route else None,
            subresource=route.subresource if route else None,
        )

    @override
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.headers.get("Content-Type", "").startswith(PROTOBUF):
            raise ApiError(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {PROTOBUF}"
            )

        reaction = await self._user_reaction(request)
        if reaction is not None:
            return reaction

        path = request.url.path.rstrip("/") or "/"
        if request.method == enums.method.GET:
            discovery = self._discovery(path)
            if discovery is not None:
                return aiohttp.web.json_response(discovery)
            if path.startswith("/openapi/"):
                return self._openapi(path, request.headers.get("Accept", ""))
        route = parse_route(path)
        if route is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return await self._serve_resource(request, route)

    async def _user_reaction(self, request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        """kmock DSL reactions added by a test, matched against this request only."""
        for payload in self._payloads:
            self._matching = request
            try:
                matched = request in payload._source and not payload._disabled.is_set()
            finally:
                self._matching = None
            if matched:
                try:
                    return await payload(request)
                except rendering.ReactionMismatchError:
                    payload._disabled.set()
                except NotImplementedError:
                    pass
        return None

    @staticmethod
    def _status_response(exc: kmock.KubernetesError) -> aiohttp.web.Response:
        return aiohttp.web.json_response(_status_body(exc), status=exc.status)

    # --- OpenAPI ---

    def openapi(self) -> openapi.OpenApi:
        return openapi.OpenApi(self.resources, self.schemas)

    def _openapi(self, path: str, accept: str) -> aiohttp.web.Response:
        docs = self.openapi()
        if path == "/openapi/v2":
            if "json" not in accept and accept not in ("", "*/*"):
                raise ApiError(406, "NotAcceptable", f"only application/json is served, not {accept}")
            return aiohttp.web.json_response(docs.v2_document())
        if path == "/openapi/v3":
            return aiohttp.web.json_response(docs.v3_index())
        document = docs.v3_document(path.removeprefix("/openapi/v3/"))
        if document is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return aiohttp.web.json_response(document)

    def _table_response(
        self, request: rendering.Request, res: kmock.resource, objects: list[Body]
    ) -> aiohttp.web.Response:
        body = openapi.table(
            self.printer_columns.get(res) or openapi.BUILTIN_COLUMNS.get(res.plural or ""),
            objects,
            str(self._revision),
            self.clock(),
            request.params.get("includeObject", "Metadata"),
        )
        return aiohttp.web.json_response(body)

    # --- pruning and field validation ---

    def _prune_fields(self, res: kmock.resource, obj: Body, field_validation: str) -> Body:
        """Drop undeclared fields of a CRD object; Warn (default) adds warnings, Strict refuses (400)."""
        schema = self.schemas.get(res)
        if schema is None:
            return obj
        if field_validation not in FIELD_VALIDATIONS:
            raise ApiError(
                400,
                "BadRequest",
                f"fieldValidation must be one of {', '.join(FIELD_VALIDATIONS)}, got {field_validation!r}",
            )
        unknown = prune_unknown(schema, obj)
        if not unknown:
            return obj
        described = [f'unknown field "{path}"' for path in unknown]
        log.info(
            "%s %s: pruned %s (fieldValidation=%s)",
            res.plural,
            obj["metadata"].get("name"),
            unknown,
            field_validation,
        )
        if field_validation == "Strict":
            kind = self.resources[res].kind
            raise ApiError(
                400,
                "BadRequest",
                f'{kind} in version "{res.version}" cannot be handled as a {kind}: strict decoding error: '
                + ", ".join(described),
            )
        if field_validation == "Warn":
            for text in described:
                _warn(text)
        return obj

    # --- discovery ---

    def _discovery(self, path: str) -> Body | None:
        resources = cast(list[kmock.resource], list(self.resources))
        groups: dict[str, list[str]] = {}
        for res in resources:
            versions = groups.setdefault(res.group or "", [])
            if res.version not in versions:
                versions.append(res.version or "")
        parts = path.strip("/").split("/") if path != "/" else []
        if parts == []:
            paths = ["/api", "/api/v1", "/apis", "/version"]
            paths += [f"/apis/{g}" for g in groups if g] + [
                f"/apis/{g}/{v}" for g in groups if g for v in groups[g]
            ]
            return {"paths": sorted(paths)}
        if parts == ["version"]:
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": "linux/amd64"}
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if parts == ["apis"]:
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [self._group_body(g, vs) for g, vs in sorted(groups.items()) if g],
            }
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **self._group_body(parts[1], groups[parts[1]])}
        if (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            if version not in groups.get(group, []) and group:
                return None
            listed = [res for res in resources if (res.group or "") == group and res.version == version]
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": [
                    entry for res in sorted(listed, key=str) for entry in self._resource_entries(res)
                ],
            }
        return None

    @staticmethod
    def _group_body(group: str, versions: list[str]) -> Body:
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def _resource_entries(self, res: kmock.resource) -> list[Body]:
        info = self.resources[res]
        entry: Body = {
            "name": res.plural,
            "singularName": info.singular or (info.kind or "").lower(),
            "namespaced": info.namespaced is not False,
            "kind": info.kind or str(res.plural).capitalize(),
            "verbs": sorted(info.verbs) or list(ALL_VERBS),
            "shortNames": sorted(info.shortnames),
            "categories": sorted(info.categories),
        }
        subresources = [
            {
                "name": f"{res.plural}/{sub}",
                "singularName": "",
                "namespaced": entry["namespaced"],
                "kind": entry["kind"],
                "verbs": ["get", "patch", "update"],
            }
            for sub in sorted(info.subresources)
        ]
        return [entry, *subresources]

    # --- resource requests ---

    def _info(self, res: kmock.resource) -> kmock.ResourceInfo:
        if res not in self.resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return self.resources[res]

    async def _serve_resource(self, request: rendering.Request, route: Route) -> aiohttp.web.StreamResponse:
        res = kmock.resource(route.group, route.version, route.plural)
        info = self._info(res)
        namespace = route.namespace if info.namespaced is not False else None
        if route.subresource is not None and route.subresource not in info.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        method, params = request.method, request.params
        status = route.subresource == "status"
        dry_run = params.get("dryRun") == "All"
        if params.get("dryRun") not in (None, "", "All"):
            raise ApiError(400, "BadRequest", f"Invalid dry run value: {params['dryRun']!r} (only All)")
        writes: dict[str, Any] = {
            "field_validation": params.get("fieldValidation") or "Warn",
            "dry_run": dry_run,
        }
        table = openapi.wants_table(request.headers.get("Accept", ""))

        if method == enums.method.GET and params.get("watch") in ("true", "1"):
            return await self._watch_response(request, res, namespace, route.name)
        if method == enums.method.GET and route.name is None:
            body = self._list_body(res, namespace, params)
            if table:
                return self._table_response(request, res, body["items"])
            return aiohttp.web.json_response(body)
        if route.name is None and method == enums.method.POST:
            return aiohttp.web.json_response(
                self.create_object(res, self._body(request), namespace=namespace, **writes), status=201
            )
        if route.name is None and method == enums.method.DELETE:
            items = [
                self.delete_object(res, obj["metadata"].get("namespace"), obj["metadata"]["name"])
                for obj in self.list_objects(
                    res, namespace, params.get("labelSelector", ""), params.get("fieldSelector", "")
                )
            ]
            return aiohttp.web.json_response(self._list_envelope(res, items))
        if route.name is None:
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )

        if method == enums.method.GET:
            obj = self.read_object(res, namespace, route.name)
            if table and route.subresource is None:
                return self._table_response(request, res, [obj])
            return aiohttp.web.json_response(obj)
        if method == enums.method.PUT:
            return aiohttp.web.json_response(
                self.replace_object(res, namespace, route.name, self._body(request), status=status, **writes)
            )
        if method == enums.method.PATCH:
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            if content_type == APPLY_PATCH and self._find(res, namespace, route.name) is None:
                body = self._body(request)
                body.setdefault("metadata", {})["name"] = route.name
                return aiohttp.web.json_response(
                    self.create_object(res, body, namespace=namespace, **writes), status=201
                )
            result = self.patch_object(
                res, namespace, route.name, request.data, content_type, status=status, **writes
            )
            return aiohttp.web.json_response(result)
        if method == enums.method.DELETE:
            options = request.data if isinstance(request.data, dict) else {}
            propagation = params.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
            return aiohttp.web.json_response(
                self.delete_object(
                    res,
                    namespace,
                    route.name,
                    propagation=propagation,
                    dry_run=dry_run or "All" in (options.get("dryRun") or ()),
                )
            )
        raise ApiError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )

    @staticmethod
    def _body(request: rendering.Request) -> Body:
        if not isinstance(request.data, dict):
            raise ApiError(400, "BadRequest", "the request body is not a JSON object")
        return cast(Body, json_copy(request.data))

    # --- the store ---

    def _key(
        self, res: kmock.resource, namespace: str | None, name: str
    ) -> tuple[kmock.resource, str | None, str]:
        cluster_scoped = res in self.resources and self.resources[res].namespaced is False
        return (res, None if cluster_scoped else namespace, name)

    def _find(self, res: kmock.resource, namespace: str | None, name: str) -> Body | None:
        key = self._key(res, namespace, name)
        if key not in self._objects:
            return None
        stored = self._objects[key]
        return None if stored.deleted else stored.raw

    def _not_found(self, res: kmock.resource, name: str) -> ApiError:
        return ApiError(
            404,
            "NotFound",
            f'{_qualified(res)} "{name}" not found',
            {"name": name, "group": res.group, "kind": res.plural},
        )

    def _require_namespace(self, namespace: str) -> None:
        """A create in a namespace that does not exist is refused, as the API server's
        NamespaceLifecycle admission refuses it (404, ``namespaces "x" not found``)."""
        if NAMESPACES in self.resources and self._find(NAMESPACES, None, namespace) is None:
            raise self._not_found(NAMESPACES, namespace)

    def _store(self, res: kmock.resource, obj: Body, event: str, previous: Body | None) -> Body:
        """Write a new version with the next resourceVersion and publish it to watchers."""
        self._revision += 1
        obj["metadata"]["resourceVersion"] = str(self._revision)
        meta = obj["metadata"]
        key = self._key(res, meta.get("namespace"), meta["name"])
        if event == "DELETED":
            self._objects[key].history.append(obj)
            self._objects[key].delete()
        elif key in self._objects:
            self._objects[key].history.append(obj)
        else:
            self._objects[key] = obj
            self._stored_keys += 1
        self._index_labels(key, None if event == "DELETED" else obj)
        self._publish(
            res, WatchEvent(self._revision, event, meta.get("namespace"), meta["name"], obj, previous)
        )
        return obj

    def _publish(self, res: kmock.resource, event: WatchEvent) -> None:
        events = self._events.setdefault(res, collections.deque())
        if len(events) >= self.history_limit:
            self._compacted[res] = events.popleft().revision
        events.append(event)
        changed = self._changed.pop(res, None)
        if changed is not None:
            changed.set()

    def compact(self) -> None:
        """Forget all watch history, as etcd compaction does: older resumes get 410 Gone."""
        for res, events in self._events.items():
            if events:
                self._compacted[res] = events[-1].revision
            events.clear()

    def cut_watches(self) -> None:
        """End every open watch stream now and keep serving, as an API server restart or a proxy does.

        Clients reconnect and resume from their last resourceVersion (410 Gone after compact())."""
        self._cuts += 1
        for changed in self._changed.values():
            changed.set()
        self._changed.clear()

    def close(self) -> None:
        """End all watch streams (before the HTTP server stops)."""
        self._closing = True
        for changed in self._changed.values():
            changed.set()
        self._changed.clear()

    # --- reads ---

    def read_object(self, res: ResourceRef, namespace: str | None, name: str) -> Body:
        resource = _resource(res)
        self._info(resource)
        found = self._find(resource, namespace, name)
        if found is None:
            raise self._not_found(resource, name)
        return found

    def _index_labels(self, key: Any, obj: Body | None) -> None:
        """Replace a key's entries in the label index with those of its new version (none: deleted)."""
        for entry in self._labels_of.pop(key, ()):
            self._label_index[entry].discard(key)
        if obj is None:
            return
        res = key[0]
        kind = (res.group, res.version, res.plural)
        labels = obj["metadata"].get("labels") or {}
        entries = [(kind, label, value) for label, value in labels.items() if isinstance(value, str)]
        for entry in entries:
            self._label_index.setdefault(entry, set()).add(key)
        self._labels_of[key] = entries

    def _indexed_keys(self, res: kmock.resource, label_selector: str) -> set[Any] | None:
        """Keys that may match the selector's first equality term; None when the index cannot say
        (no such term, or the store was written around `_store`)."""
        if self._stored_keys != len(self._objects):
            return None
        term = next((r for r in parse_label_selector(label_selector) if r.operator == "in"), None)
        if term is None:
            return None
        kind = (res.group, res.version, res.plural)
        return set().union(*(self._label_index.get((kind, term.key, value), ()) for value in term.values))

    def list_objects(
        self,
        res: ResourceRef,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[Body]:
        resource = _resource(res)
        self._info(resource)
        selected = self._selection(label_selector, field_selector)
        indexed = self._indexed_keys(resource, label_selector)
        if indexed is not None:
            found = [
                stored.raw
                for key in indexed
                if (namespace is None or key[1] == namespace)
                and key in self._objects
                and not (stored := self._objects[key]).deleted
            ]
        else:
            found = [
                stored.raw
                for (key_res, key_ns, _), stored in self._objects.items()
                if key_res == resource and not stored.deleted and (namespace is None or key_ns == namespace)
            ]
        found = [obj for obj in found if selected(obj)]
        return sorted(
            found, key=lambda obj: (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
        )

    @staticmethod
    def _selection(label_selector: str, field_selector: str) -> Callable[[Body], bool]:
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector)

        def selected(obj: Body) -> bool:
            object_labels = obj.get("metadata", {}).get("labels") or {}
            return all(req.matches(object_labels) for req in labels) and all(
                req.matches(obj) for req in fields
            )

        return selected

    def _list_envelope(self, res: kmock.resource, items: list[Body]) -> Body:
        info = self.resources[res]
        return {
            "apiVersion": _api_version(res),
            "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": str(self._revision)},
            "items": items,
        }

    def _list_body(self, res: kmock.resource, namespace: str | None, params: Mapping[str, str]) -> Body:
        items = self.list_objects(
            res, namespace, params.get("labelSelector", ""), params.get("fieldSelector", "")
        )
        return self._list_envelope(res, items)

    # --- writes ---

    def create_object(
        self,
        res: ResourceRef,
        body: Body,
        *,
        namespace: str | None = None,
        field_validation: str = "Warn",
        dry_run: bool = False,
    ) -> Body:
        """POST semantics: stamp metadata, prune, run admission, store, publish ADDED (not with dry_run)."""
        resource = _resource(res)
        info = self._info(resource)
        obj = json_copy(body)
        meta = obj.setdefault("metadata", {})
        if info.namespaced is not False:
            body_namespace = meta.get("namespace")
            if namespace and body_namespace and body_namespace != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = namespace or body_namespace or "default"
            self._require_namespace(meta["namespace"])
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise self._invalid(
                    resource,
                    "",
                    [
                        (
                            "metadata.name",
                            "FieldValueRequired",
                            "Required value: name or generateName is required",
                        )
                    ],
                )
            # as kube-apiserver since 1.32 (KEP-4420, RetryGenerateName): a generated name that is
            # taken is generated again, up to GENERATE_NAME_TRIES in all, before a 409
            for _ in range(GENERATE_NAME_TRIES):
                meta["name"] = meta["generateName"] + "".join(random.choices(_NAME_SUFFIX_ALPHABET, k=5))
                if self._find(resource, meta.get("namespace"), meta["name"]) is None:
                    break
        if self._find(resource, meta.get("namespace"), meta["name"]) is not None:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{_qualified(resource)} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": resource.group, "kind": resource.plural},
            )
        obj = {"apiVersion": _api_version(resource), "kind": info.kind, **obj}
        meta = obj["metadata"]
        for system_field in (
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "managedFields",
        ):
            meta.pop(system_field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["generation"] = 1
        meta["creationTimestamp"] = _timestamp(self.clock())
        if "status" in info.subresources:
            obj.pop("status", None)
        obj = self._prune_fields(resource, obj, field_validation)
        self._check_names(resource, obj)
        obj = self._admit(resource, "CREATE", obj, None)
        if dry_run:
            return obj
        stored = self._store(resource, obj, "ADDED", None)
        if resource == CRD_RESOURCE:
            register_crd(self, stored, store=False)
        return stored

    def replace_object(
        self,
        res: ResourceRef,
        namespace: str | None,
        name: str,
        body: Body,
        *,
        status: bool = False,
        field_validation: str = "Warn",
        dry_run: bool = False,
    ) -> Body:
        """PUT semantics (the whole object, or only ``.status`` for the status subresource)."""
        resource = _resource(res)
        body_name = body.get("metadata", {}).get("name")
        if body_name and body_name != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        return self._update(
            resource,
            namespace,
            name,
            lambda _: json_copy(body),
            status=status,
            field_validation=field_validation,
            dry_run=dry_run,
        )

    def patch_object(
        self,
        res: ResourceRef,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str = MERGE_PATCH,
        *,
        status: bool = False,
        field_validation: str = "Warn",
        dry_run: bool = False,
    ) -> Body:
        """PATCH semantics for merge, JSON, strategic (as merge) and apply (as merge) patches."""
        resource = _resource(res)
        apply: Callable[[Body], Any]
        if content_type == JSON_PATCH:
            apply = lambda old: json_patch(old, patch)  # noqa: E731
        elif content_type in (MERGE_PATCH, APPLY_PATCH):
            apply = lambda old: merge_patch(old, patch)  # noqa: E731
        elif content_type == STRATEGIC_PATCH:
            apply = lambda old: merge_patch(old, strip_strategic_directives(patch))  # noqa: E731
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {content_type}",
            )
        if content_type != JSON_PATCH and not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "the patch is not a JSON object")
        return self._update(
            resource,
            namespace,
            name,
            apply,
            status=status,
            field_validation=field_validation,
            dry_run=dry_run,
        )

    def _update(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        change: Callable[[Body], Any],
        *,
        status: bool,
        field_validation: str = "Warn",
        dry_run: bool = False,
    ) -> Body:
        info = self._info(res)
        old = self._find(res, namespace, name)
        if old is None:
            raise self._not_found(res, name)
        try:
            candidate = change(old)  # every change copies what it returns (merge_patch, json_patch, PUT)
        except PatchError as exc:
            raise ApiError(
                422, "Invalid", str(exc), {"name": name, "group": res.group, "kind": res.plural}
            ) from exc
        if not isinstance(candidate, dict):
            raise ApiError(422, "Invalid", "the patched object is not a JSON object")
        old_meta = old["metadata"]
        given_version = (candidate.get("metadata") or {}).get("resourceVersion")
        if given_version and given_version != old_meta["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {_qualified(res)} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                {"name": name, "group": res.group, "kind": res.plural},
            )

        if status:
            # the old object but its status (the candidate's is already a copy of its own)
            new = json_copy({key: value for key, value in old.items() if key != "status"})
            if candidate.get("status") is not None:
                new["status"] = candidate["status"]
            new = self._prune_fields(res, new, field_validation)
        else:
            new = candidate
            if "status" in info.subresources:
                if "status" in old:
                    new["status"] = json_copy(old["status"])
                else:
                    new.pop("status", None)
            new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
            meta = new.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise ApiError(422, "Invalid", "metadata must be an object")
            for system_field in (
                "uid",
                "name",
                "namespace",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if system_field in old_meta:
                    meta[system_field] = old_meta[system_field]
                else:
                    meta.pop(system_field, None)
            if old_meta.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
                if added:
                    raise self._invalid(
                        res,
                        name,
                        [
                            (
                                "metadata.finalizers",
                                "FieldValueForbidden",
                                f"Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {sorted(added)}",
                            )
                        ],
                    )
            new = self._prune_fields(res, new, field_validation)
            self._check_names(res, new)
            new = self._admit(res, "UPDATE", new, old)
            if _essence(new) != _essence(old):
                new["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if new == old:
            return old  # a no-op write: no new resourceVersion and no watch event, as on a real server
        if dry_run:
            return new
        stored = self._store(res, new, "MODIFIED", old)
        if stored["metadata"].get("deletionTimestamp") and not stored["metadata"].get("finalizers"):
            return self._remove(res, stored)
        return stored

    def delete_object(
        self,
        res: ResourceRef,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        dry_run: bool = False,
    ) -> Body:
        """DELETE: mark for deletion while finalizers remain; otherwise remove and collect dependents."""
        resource = _resource(res)
        old = self._find(resource, namespace, name)
        if old is None:
            raise self._not_found(resource, name)
        if dry_run:
            return old
        if propagation == "Orphan":
            self._orphan_dependents(old["metadata"]["uid"])
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return old
            marked = json_copy(old)
            marked["metadata"]["deletionTimestamp"] = _timestamp(self.clock())
            marked["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._store(resource, marked, "MODIFIED", old)
        return self._remove(resource, old)

    def _remove(self, res: kmock.resource, obj: Body) -> Body:
        final = self._store(res, json_copy(obj), "DELETED", obj)
        self._collect_garbage(res, final)
        return final

    def _collect_garbage(self, res: kmock.resource, removed: Body) -> None:
        """Background cascade: dependents whose owners are all gone are deleted, recursively."""
        uid = removed["metadata"]["uid"]
        live_uids = {stored.raw["metadata"]["uid"] for stored in self._objects.values() if not stored.deleted}
        for (dep_res, dep_ns, dep_name), stored in list(self._objects.items()):
            if stored.deleted:
                continue
            dependent = stored.raw
            meta = dependent["metadata"]
            owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
            in_removed_namespace = res == NAMESPACES and dep_ns == removed["metadata"]["name"]
            orphaned = uid in owners and not owners & live_uids
            # an earlier cascade in this loop may already have removed it
            if (orphaned or in_removed_namespace) and self._find(dep_res, dep_ns, dep_name) is not None:
                self.delete_object(dep_res, dep_ns, dep_name)

    def _orphan_dependents(self, uid: str) -> None:
        for (dep_res, dep_ns, dep_name), stored in list(self._objects.items()):
            if stored.deleted:
                continue
            refs = stored.raw["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                kept = [ref for ref in refs if ref.get("uid") != uid]
                patch = {"metadata": {"ownerReferences": kept or None}}
                self.patch_object(dep_res, dep_ns, dep_name, patch)

    def _admit(self, res: kmock.resource, operation: str, new: Body, old: Body | None) -> Body:
        hook = self.admission.get(res)
        if hook is None:
            return new
        try:
            admitted = hook(operation, new, old)
        except AdmissionError as exc:
            causes = [(cause.field, cause.reason, cause.message) for cause in exc.causes]
            raise self._invalid(res, new["metadata"].get("name", ""), causes) from exc
        return admitted

    def _check_names(self, res: kmock.resource, obj: Body) -> None:
        """The server's name and label rules (object_names.py): 422 Invalid like a cluster."""
        kind = self.resources[res].kind or str(res.plural)
        causes = metadata_causes(kind, obj)
        if causes:
            name = str(obj["metadata"].get("name", ""))
            raise self._invalid(
                res, name, [(field, "FieldValueInvalid", message) for field, message in causes]
            )

    def _invalid(self, res: kmock.resource, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
        kind = self.resources[res].kind or str(res.plural)
        qualified_kind = f"{kind}.{res.group}" if res.group else kind
        described = [f"{field}: {message}" for field, _, message in causes]
        summary = described[0] if len(described) == 1 else f"[{', '.join(described)}]"
        return ApiError(
            422,
            "Invalid",
            f'{qualified_kind} "{name}" is invalid: {summary}',
            {
                "name": name,
                "group": res.group,
                "kind": kind,
                "causes": [
                    {"reason": reason, "message": message, "field": field}
                    for field, reason, message in causes
                ],
            },
        )

    # --- watch ---

    async def _watch_response(
        self, request: rendering.Request, res: kmock.resource, namespace: str | None, name: str | None
    ) -> aiohttp.web.StreamResponse:
        params = request.params
        selected = self._selection(params.get("labelSelector", ""), params.get("fieldSelector", ""))

        def visible(obj: Body | None) -> bool:
            if obj is None:
                return False
            meta = obj["metadata"]
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and (name is None or meta["name"] == name)
                and selected(obj)
            )

        since_text = params.get("resourceVersion", "")
        if since_text not in ("", "0") and not since_text.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resource version: {since_text!r}")
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None

        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)

        self._watchers[res] += 1
        try:
            as_table = openapi.wants_table(request.headers.get("Accept", ""))
            await self._stream_events(response, res, since_text, deadline, visible, params, as_table)
        except ConnectionResetError:
            # the watcher's connection is gone (its client stopped, or the server is stopping): the
            # watch ends, as kube-apiserver's does, instead of an error for every open stream
            return response
        finally:
            self._watchers[res] -= 1
        await response.write_eof()
        return response

    async def _stream_events(
        self,
        response: aiohttp.web.StreamResponse,
        res: kmock.resource,
        since_text: str,
        deadline: float | None,
        visible: Callable[[Body | None], bool],
        params: Mapping[str, str],
        as_table: bool = False,
    ) -> None:
        loop = asyncio.get_running_loop()

        async def send(kind: str, obj: Body) -> None:
            if as_table and kind in ("ADDED", "MODIFIED", "DELETED"):
                # kubectl get -w: each event carries a one-row Table, as the server sends
                obj = openapi.table(
                    self.printer_columns.get(res) or openapi.BUILTIN_COLUMNS.get(res.plural or ""),
                    [obj],
                    obj["metadata"].get("resourceVersion", ""),
                    self.clock(),
                    params.get("includeObject", "Metadata"),
                )
            await response.write(orjson.dumps({"type": kind, "object": obj}) + b"\n")

        if since_text in ("", "0"):
            since = self._revision
            initial = [obj for obj in self.list_objects(res) if visible(obj)]
            for obj in initial:
                await send("ADDED", obj)
            if params.get("sendInitialEvents") == "true" and params.get("allowWatchBookmarks") == "true":
                await send("BOOKMARK", self._bookmark(res, since, initial_end=True))
        else:
            since = int(since_text)

        cuts = self._cuts
        while not self._closing and self._cuts == cuts:
            changed = self._changed.setdefault(res, asyncio.Event())
            if since < self._compacted.get(res, 0):
                gone = ApiError(410, "Expired", f"too old resource version: {since} ({self._compacted[res]})")
                await send("ERROR", _status_body(gone))
                break
            for event in self._events_since(res, since):
                since = event.revision
                now_visible, was_visible = visible(event.object), visible(event.previous)
                if event.type == "MODIFIED" and now_visible != was_visible:
                    await send("ADDED" if now_visible else "DELETED", event.object)
                elif now_visible or (event.type == "DELETED" and was_visible):
                    await send(event.type, event.object)
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                break

    def _events_since(self, res: kmock.resource, since: int) -> list[WatchEvent]:
        events = self._events.get(res, collections.deque())
        newer: list[WatchEvent] = []
        for event in reversed(events):
            if event.revision <= since:
                break
            newer.append(event)
        return newer[::-1]

    def _bookmark(self, res: kmock.resource, revision: int, *, initial_end: bool) -> Body:
        meta: Body = {"resourceVersion": str(revision)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"apiVersion": _api_version(res), "kind": self.resources[res].kind, "metadata": meta}


def _api_version(res: kmock.resource) -> str:
    return f"{res.group}/{res.version}" if res.group else str(res.version)


def _qualified(res: kmock.resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else str(res.plural)


def _status_body(exc: kmock.KubernetesError) -> Body:
    body: Body = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": exc.message or "",
        "reason": exc.reason or "",
        "code": exc.status,
    }
    if exc.details:
        body["details"] = exc.details
    return body


# --- resource registration ------------------------------------------------------------------------


def register_resource(
    emulator: FidelityEmulator,
    ref: ResourceRef,
    *,
    kind: str,
    namespaced: bool = True,
    status: bool = False,
    short_names: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
) -> kmock.resource:
    """Declare a resource for discovery and serving; ``status`` adds the ``/status`` subresource."""
    resource = _resource(ref)
    emulator.resources[resource] = kmock.ResourceInfo(
        kind=kind,
        singular=kind.lower(),
        namespaced=namespaced,
        verbs=set(ALL_VERBS),
        shortnames=set(short_names),
        categories=set(categories),
        subresources={"status"} if status else set(),
    )
    return resource


BUILTIN_RESOURCES: Final[tuple[tuple[str, str, bool, bool, tuple[str, ...]], ...]] = (
    # (group/version/plural, kind, namespaced, status subresource, short names)
    ("v1/pods", "Pod", True, True, ("po",)),
    ("v1/services", "Service", True, True, ("svc",)),
    ("v1/configmaps", "ConfigMap", True, False, ("cm",)),
    ("v1/secrets", "Secret", True, False, ()),
    ("v1/events", "Event", True, False, ("ev",)),
    ("v1/namespaces", "Namespace", False, True, ("ns",)),
    ("apps/v1/deployments", "Deployment", True, True, ("deploy",)),
    ("batch/v1/jobs", "Job", True, True, ()),
    ("discovery.k8s.io/v1/endpointslices", "EndpointSlice", True, False, ()),
    ("gateway.networking.k8s.io/v1/httproutes", "HTTPRoute", True, True, ()),
    ("coordination.k8s.io/v1/leases", "Lease", True, False, ()),
    (
        "apiextensions.k8s.io/v1/customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        True,
        ("crd", "crds"),
    ),
)


def register_builtin_resources(emulator: FidelityEmulator) -> None:
    """The built-in kinds specops and its tests touch, plus the ``default`` namespace."""
    for ref, kind, namespaced, status, short_names in BUILTIN_RESOURCES:
        register_resource(
            emulator, ref, kind=kind, namespaced=namespaced, status=status, short_names=short_names
        )
    if emulator._find(NAMESPACES, None, "default") is None:
        emulator.create_object(NAMESPACES, {"metadata": {"name": "default"}})


def register_crd(
    emulator: FidelityEmulator, crd: Mapping[str, Any], *, store: bool = True
) -> list[kmock.resource]:
    """Serve a CRD's resource (every served version) and admit its objects through its schema and CEL rules.

    With ``store``, the CRD object itself is also created (when CRDs are registered), so
    ``kubectl get crd`` and operators that look for their CRD see it.
    """
    spec = crd["spec"]
    names = spec["names"]
    admission = CrdAdmission(crd)
    registered = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        has_status = "status" in (version.get("subresources") or {})
        resource = register_resource(
            emulator,
            kmock.resource(spec["group"], version["name"], names["plural"]),
            kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            status=has_status,
            short_names=tuple(names.get("shortNames", ())),
            categories=tuple(names.get("categories", ())),
        )
        emulator.admission[resource] = admission
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is not None:
            emulator.schemas[resource] = copy.deepcopy(schema)
        emulator.printer_columns[resource] = copy.deepcopy(version.get("additionalPrinterColumns") or [])
        registered.append(resource)
    crd_name = crd["metadata"]["name"]
    if store and CRD_RESOURCE in emulator.resources and emulator._find(CRD_RESOURCE, None, crd_name) is None:
        emulator.create_object(CRD_RESOURCE, copy.deepcopy(dict(crd)))
    return registered
