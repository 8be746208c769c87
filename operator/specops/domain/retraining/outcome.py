"""How a round ended: read from the training object and its pods (the trainer's published result)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from specops.api.models import CHECKPOINT_URI_PATTERN
from specops.domain.redaction import redact_text, redact_untrusted
from specops.domain.retraining.jobs import job_kind
from specops.domain.retraining.naming import (
    ANNOTATION_OUTPUT_VERSION,
    ANNOTATION_RESULT,
    MAX_VERSION,
    VERSION_PATTERN,
)
from specops.domain.retraining.state import Failed, Outcome, Running, Succeeded

# ---------------------------------------------------------------- completion


def training_outcome(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Outcome:
    """Running, Succeeded (with the published draft) or Failed, from the Job and its pods.

    The result is the trainer's JSON ``{"draftVersion", "checkpointUri", "metrics"}``, taken
    from the Job's ``specops.dev/result`` annotation or else from the termination message
    of a container that exited 0. A run that completed without a valid result failed.
    """
    kind = job_kind(job.get("apiVersion"), job.get("kind"))
    if kind is None:
        return Failed(f"{job.get('apiVersion')} {job.get('kind')} is not a training Job specops can read")
    conditions = {
        c.get("type"): c
        for c in (job.get("status") or {}).get("conditions") or []
        if isinstance(c, Mapping) and c.get("status") == "True"
    }
    if "Failed" in conditions:
        failed = conditions["Failed"]
        detail = failed.get("message") or failed.get("reason") or "the training job failed"
        logs = _failure_messages(pods)
        return Failed(redact_text(f"{detail}; {logs}" if logs else str(detail)))
    if kind.success not in conditions:
        suspended = "Suspended" in conditions
        return Running("suspended" if suspended else "")
    expected = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_OUTPUT_VERSION)
    return _published_result(job, pods, expected)


def _terminated(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    found = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        pod_name = str((pod.get("metadata") or {}).get("name", "?"))
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = ((status or {}).get("state") or {}).get("terminated")
            if isinstance(terminated, Mapping):
                found.append((f"{pod_name}/{status.get('name', '?')}", terminated))
    return found


def _failure_messages(pods: Sequence[Mapping[str, Any]], limit: int = 500) -> str:
    """The tails of failed containers' termination messages, reduced to what redact_untrusted keeps."""
    messages = [
        f"{where}: {redact_untrusted(str(t.get('message')).strip())[-limit:]}"
        for where, t in _terminated(pods)
        if t.get("exitCode") not in (0, None) and str(t.get("message") or "").strip()
    ]
    return " | ".join(messages[:3])


def _published_result(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], expected: str | None
) -> Outcome:
    annotation = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RESULT)
    sources: list[tuple[str, str]] = []
    if annotation:
        sources.append((f"annotation {ANNOTATION_RESULT}", str(annotation)))
    else:
        sources += [
            (f"termination message of {where}", str(t.get("message")))
            for where, t in _terminated(pods)
            if t.get("exitCode") == 0 and str(t.get("message") or "").strip()
        ]
    if not sources:
        return Failed(
            "the training job completed but published no result: write "
            '{"draftVersion": ..., "checkpointUri": ...} to $SPECOPS_RESULT_PATH or to the '
            f"{ANNOTATION_RESULT} annotation"
        )
    results: list[tuple[str, Succeeded]] = []
    problems = []
    for where, text in sources:
        parsed = _parse_result(text, expected)
        if isinstance(parsed, Succeeded):
            results.append((where, parsed))
        else:
            problems.append(f"{where}: {parsed}")
    if not results:
        return Failed(
            redact_text("the training job completed with an invalid result: " + "; ".join(problems))
        )
    published = {(r.draft_version, r.checkpoint_uri) for _, r in results}
    if len(published) > 1:
        listing = ", ".join(f"{where} -> {r.draft_version} at {r.checkpoint_uri}" for where, r in results)
        return Failed(
            redact_text(f"containers published different drafts ({listing}); publish from one rank only")
        )
    return results[0][1]


def _parse_result(text: str, expected: str | None) -> Succeeded | str:
    """The result, or what is wrong with it."""
    try:
        data = json.loads(text)
    except ValueError:
        return "not JSON"
    if not isinstance(data, dict):
        return "not a JSON object"
    version, uri, metrics = data.get("draftVersion"), data.get("checkpointUri"), data.get("metrics", {})
    if not isinstance(version, str) or not VERSION_PATTERN.match(version) or len(version) > MAX_VERSION:
        return f"draftVersion {version!r} is not a valid draft version"
    if expected and version != expected:
        return f"draftVersion {version!r} differs from SPECOPS_OUTPUT_VERSION {expected!r}"
    if not isinstance(uri, str) or not re.match(CHECKPOINT_URI_PATTERN, uri) or len(uri) > 1024:
        return f"checkpointUri {uri!r} is not a pvc://, s3://, gs:// or hf://ORG/NAME@REVISION uri"
    if not isinstance(metrics, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values()
    ):
        return "metrics must be an object of numbers"
    return Succeeded(version, uri, {str(k): float(v) for k, v in metrics.items()})
