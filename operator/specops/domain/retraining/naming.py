"""Names of training objects and trained drafts, and the labels and annotations on them."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Literal

from specops.domain.names import (
    bounded,
)

TriggerReason = Literal["TargetVersionChanged", "AcceptanceBelowSLO"]
TARGET_VERSION_CHANGED: TriggerReason = "TargetVersionChanged"
ACCEPTANCE_BELOW_SLO: TriggerReason = "AcceptanceBelowSLO"

COMPONENT_RETRAINING = "retraining"
LABEL_ROUND = "specops.dev/retraining-round"
LABEL_JOB = "specops.dev/retraining-job"
ANNOTATION_RESULT = "specops.dev/result"
ANNOTATION_OUTPUT_VERSION = "specops.dev/output-version"
ANNOTATION_TRIGGER = "specops.dev/retraining-trigger"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""Set by the JobSet controller on every pod; a TrainJob's JobSet carries the TrainJob's name."""

DEFAULT_RESULT_PATH = "/dev/termination-log"
TRAINER_CONTAINER = "trainer"

MAX_JOB_NAME = 40
"""Well under 63: a JobSet names its Jobs ``<jobset>-<replicatedJob>-<index>`` and their pods
get hostnames from that, which must stay valid DNS labels too."""
MAX_VERSION = 63
JOB_BACKOFF_LIMIT = 1
"""A single-pod trainer may retry once (a lost node); more only burns GPU hours on a real bug."""
DISTRIBUTED_BACKOFF_LIMIT = 0
"""One rank restarting alone cannot rejoin a torch.distributed group: fail the Job, restart the set."""
JOBSET_MAX_RESTARTS = 1
TTL_AFTER_FINISHED_S = 86400
"""Finished Jobs stay a day: long enough for the outcome to be read and for people to read logs."""

BACKOFF_BASE_S = 600.0
BACKOFF_CAP_S = 12 * 3600.0
MAX_CONSECUTIVE_FAILURES = 5

_VERSION_ALLOWED = re.compile(r"[^A-Za-z0-9_.-]+")
_DNS_ALLOWED = re.compile(r"[^a-z0-9-]+")
VERSION_PATTERN = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


# ---------------------------------------------------------------- names


def _dns_label(text: str) -> str:
    return re.sub(r"-{2,}", "-", _DNS_ALLOWED.sub("-", text.lower())).strip("-")


def job_name(resource_name: str, target_version: str, reason: str, round_number: int) -> str:
    """``<resource>-rt<round>-<hash>``: a DNS label of at most ``MAX_JOB_NAME`` characters.

    The inputs all come from the resource and its status, so a restarted operator that
    decides the same round again renders the same name and finds the Job it created.
    The name starts with a letter because TrainJob names must be RFC 1035 labels.
    """
    digest = hashlib.sha256(
        json.dumps([resource_name, target_version, reason, round_number]).encode("utf-8")
    ).hexdigest()[:8]
    suffix = f"-rt{round_number}-{digest}"
    prefix = _dns_label(resource_name)
    if not prefix[:1].isalpha():
        prefix = f"sdep-{prefix}".rstrip("-")
    return f"{prefix[: MAX_JOB_NAME - len(suffix)].rstrip('-')}{suffix}"


def output_version(draft_version: str, target_version: str, round_number: int) -> str:
    """The version the trained draft must be published as: ``<draft>-rt<round>-<target>``."""
    target = _VERSION_ALLOWED.sub("-", target_version).strip("-_.") or "target"
    version = bounded(f"{draft_version}-rt{round_number}-{target}", MAX_VERSION)
    return version.strip("-_.")
