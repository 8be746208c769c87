"""SGLang: ``--speculative-*`` flags, and for EAGLE / EAGLE-3 an adaptive config file.

The adaptive config's integer keys are batch slots keyed by their LOWER edge (the largest key <=
the padded batch applies); specops gives each band one candidate step, so the engine runs the
schedule's K per band. SGLang adapts only EAGLE and EAGLE-3: a draft model (STANDALONE) or
n-gram revision runs the schedule's largest K at every batch.
"""

from __future__ import annotations

import json

from specops.domain.engines.base import (
    DRAFT_PATH,
    TARGET_PATH,
    ContainerPlan,
    MetricNames,
    Port,
    ServingInputs,
)
from specops.domain.engines.schedule import Method, Revision, Schedule

ALGORITHMS: dict[str, str] = {
    "draftModel": "STANDALONE",
    "eagle3": "EAGLE3",
    "mtp": "EAGLE",
    "ngram": "NGRAM",
}
ADAPTIVE_FILE = "adaptive.json"


def adaptive_config(schedule: Schedule) -> dict[str, object]:
    """One slot per band, keyed by the band's lower edge, one candidate step each."""
    config: dict[str, object] = {"strategy": "ema"}
    lower = 1
    for edge, k in schedule.bands:
        config[str(lower)] = {"candidate_steps": [k]}
        if edge is not None:
            lower = edge + 1
    return config


class Sglang:
    name = "sglang"
    default_image = "lmsysorg/sglang:latest"
    methods: frozenset[Method] = frozenset({"draftModel", "eagle3", "mtp", "ngram"})
    scheduled_methods: frozenset[Method] = frozenset({"eagle3", "mtp"})
    max_draft_len = 16
    ports: tuple[Port, ...] = (Port("http", 30000),)
    http_port = "http"
    metrics_port = "http"
    metrics_path = "/metrics"
    ready_path = "/health"
    live_path = "/health"
    generate_path = "/v1/completions"
    metrics = MetricNames(
        running="sglang:num_running_reqs",
        tpot_histogram="sglang:inter_token_latency_seconds",
        requests="sglang:num_requests_total",
        acceptance_rate_gauge="sglang:spec_accept_rate",
        output_tokens="sglang:generation_tokens_total",
        draft_length_gauge="sglang:spec_num_steps",
    )

    def container(self, revision: Revision, serving: ServingInputs) -> ContainerPlan:
        args = [
            "--model-path",
            TARGET_PATH,
            "--served-model-name",
            serving.served_model_name,
            "--host",
            "0.0.0.0",
            "--port",
            "30000",
            "--tp-size",
            str(serving.tensor_parallel),
            "--enable-metrics",
        ]
        files: dict[str, str] = {}
        if revision.mode == "spec" and revision.schedule is not None and revision.method is not None:
            k = revision.schedule.max_k
            args += ["--speculative-algorithm", ALGORITHMS[revision.method]]
            if revision.method in ("draftModel", "eagle3"):
                args += ["--speculative-draft-model-path", DRAFT_PATH]
            args += [
                "--speculative-num-steps",
                str(k),
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                str(k + 1),
            ]
            if revision.method in self.scheduled_methods and len(revision.schedule.bands) > 1:
                args += [
                    "--speculative-adaptive",
                    "--speculative-adaptive-config",
                    f"/etc/specops/engine/{ADAPTIVE_FILE}",
                ]
                files[ADAPTIVE_FILE] = json.dumps(adaptive_config(revision.schedule), sort_keys=True)
        return ContainerPlan(command=("python3", "-m", "sglang.launch_server"), args=tuple(args), files=files)
