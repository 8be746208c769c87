"""What a simulated engine reads at start-up: its command, args, environment and mounted files.

Each parser takes exactly what a serving container gets (``argv`` = command + args, files by
absolute path, env) and is as strict as the real engine needs to be: a flag or config key the
engine does not know, a malformed schedule or a combination the engine refuses raises
`EngineConfigError` naming it, and the engine never becomes ready (a crash loop). Nothing here
does I/O; the result is an `EngineConfig` whose `spec.k_at(batch)` is the engine's own reading
of its schedule.

Schedule semantics, per engine (see ENGINES.md in the shared notes):

- TensorRT-LLM (trtllm-serve, Triton's LLM API model): ``draft_len_schedule`` ``{upper: K}``;
  batch b takes the value of the first key >= b, K=0 above the largest key.
- vLLM: ``num_speculative_tokens_per_batch_size`` ``[[start, end, K], ...]`` inclusive; a gap
  takes the previous range's K, batches above the last range keep the last K.
- SGLang: adaptive slots ``{"<lower>": {"candidate_steps": [K, ...]}}``; the largest slot key
  <= b applies. The real engine moves among a slot's candidates by an EMA of acceptance; the
  simulated one runs the slot's largest candidate.
"""

from __future__ import annotations

import bisect
import itertools
import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import yaml

Backend = Literal["triton", "trtllm-serve", "vllm", "sglang"]
BACKENDS: tuple[Backend, ...] = ("triton", "trtllm-serve", "vllm", "sglang")


class EngineConfigError(ValueError):
    """A configuration the engine refuses at start-up (the message says which flag or key and why)."""


class KSchedule(Protocol):
    """An engine's reading of its draft-length schedule."""

    def k_at(self, batch: int) -> int: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class ConstantK:
    """No schedule: every iteration drafts ``k``."""

    k: int

    def k_at(self, batch: int) -> int:
        return self.k

    def describe(self) -> str:
        return f"K={self.k} at every batch"


@dataclass(frozen=True)
class UpperEdgeSchedule:
    """TensorRT-LLM ``draft_len_schedule``: the first key >= batch; K=0 above the largest key."""

    edges: tuple[int, ...]
    ks: tuple[int, ...]

    def k_at(self, batch: int) -> int:
        index = bisect.bisect_left(self.edges, batch)
        return self.ks[index] if index < len(self.edges) else 0

    def describe(self) -> str:
        return ", ".join(f"<={e}: K={k}" for e, k in zip(self.edges, self.ks, strict=True)) + ", above: K=0"


@dataclass(frozen=True)
class RangeSchedule:
    """vLLM ``num_speculative_tokens_per_batch_size``: inclusive ranges; the last K carries on."""

    ranges: tuple[tuple[int, int, int], ...]

    def k_at(self, batch: int) -> int:
        k = self.ranges[0][2]
        for start, _end, range_k in self.ranges:
            if batch >= start:
                k = range_k  # inside this range, in the gap after it, or above the last one
            else:
                break
        return k

    def describe(self) -> str:
        return ", ".join(f"{s}-{e}: K={k}" for s, e, k in self.ranges) + ", above: last K"


@dataclass(frozen=True)
class LowerEdgeSchedule:
    """SGLang adaptive slots: the largest slot key <= batch (its largest candidate step)."""

    slots: tuple[int, ...]
    ks: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...] = ()

    def k_at(self, batch: int) -> int:
        index = bisect.bisect_right(self.slots, max(batch, self.slots[0])) - 1
        return self.ks[index]

    def describe(self) -> str:
        return ", ".join(f">={s}: K={k}" for s, k in zip(self.slots, self.ks, strict=True))


@dataclass(frozen=True)
class SpecConfig:
    """The speculation an engine was started with."""

    method: str
    """The engine's own name of the method (Eagle3, draft_model, STANDALONE, ...)."""
    max_k: int
    schedule: KSchedule
    draft_model: str | None = None

    def k_at(self, batch: int) -> int:
        return self.schedule.k_at(batch)


@dataclass(frozen=True)
class EngineConfig:
    """An engine's start-up configuration as the engine read it."""

    backend: Backend
    model: str
    """The target checkpoint's path."""
    served_model_name: str
    tensor_parallel: int = 1
    spec: SpecConfig | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    """Backend-specific settings the simulated engine acts on (e.g. return_perf_metrics)."""

    @property
    def speculating(self) -> bool:
        return self.spec is not None


# ------------------------------------------------------------------------- dispatch


def backend_of(argv: Sequence[str]) -> Backend:
    """Which engine a container's command + args start."""
    if not argv:
        raise EngineConfigError("the container has no command")
    program = posixpath.basename(argv[0])
    if program == "trtllm-serve":
        return "trtllm-serve"
    if program == "vllm" and len(argv) > 1 and argv[1] == "serve":
        return "vllm"
    if program.startswith("python") and list(argv[1:3]) == ["-m", "sglang.launch_server"]:
        return "sglang"
    if program == "tritonserver" or (program == "mpirun" and _triton_index(argv) is not None):
        return "triton"
    raise EngineConfigError(f"not a serving engine command: {shlex.join(argv[:3])}")


def parse(
    argv: Sequence[str], files: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None
) -> EngineConfig:
    """Read the engine's configuration from its command + args, mounted files and environment."""
    files = files or {}
    env = env or {}
    backend = backend_of(argv)
    if backend == "trtllm-serve":
        return parse_trtllm_serve(argv[1:], files)
    if backend == "vllm":
        return parse_vllm(argv[2:])
    if backend == "sglang":
        return parse_sglang(argv[3:], files)
    return parse_triton(argv, files, env)


# ------------------------------------------------------------------------- args


@dataclass
class _Flag:
    names: tuple[str, ...]
    takes_value: bool = True
    kind: type = str
    repeatable: bool = False


class _Args:
    """A strict argparse-like reader: every flag must be known, values typed, no flag twice."""

    def __init__(
        self, engine: str, flags: Sequence[_Flag], *, positional: int = 0, equals_only: bool = False
    ):
        self.engine = engine
        self.flags = {name: flag for flag in flags for name in flag.names}
        self.positional = positional
        self.equals_only = equals_only

    def read(self, args: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
        values: dict[str, Any] = {}
        positionals: list[str] = []
        index = 0
        while index < len(args):
            arg = args[index]
            index += 1
            if not arg.startswith("-") or arg == "-":
                positionals.append(arg)
                continue
            name, equals, inline = arg.partition("=")
            flag = self.flags.get(name)
            if flag is None:
                raise EngineConfigError(f"{self.engine}: unrecognized argument {name}")
            key = flag.names[0].lstrip("-").replace("-", "_")
            if not flag.takes_value:
                if equals:
                    raise EngineConfigError(f"{self.engine}: {name} takes no value")
                raw: str = "true"
            elif equals:
                raw = inline
            else:
                if (
                    self.equals_only
                    or index >= len(args)
                    or (args[index].startswith("--") and not _is_number(args[index]))
                ):
                    raise EngineConfigError(f"{self.engine}: {name} expects a value")
                raw = args[index]
                index += 1
            try:
                value: Any = True if not flag.takes_value else flag.kind(raw)
            except ValueError:
                raise EngineConfigError(
                    f"{self.engine}: {name}: invalid {flag.kind.__name__} value {raw!r}"
                ) from None
            if flag.repeatable:
                values.setdefault(key, []).append(value)
            elif key in values:
                raise EngineConfigError(f"{self.engine}: {name} given twice")
            else:
                values[key] = value
        if len(positionals) > self.positional:
            raise EngineConfigError(f"{self.engine}: unrecognized arguments: {shlex.join(positionals)}")
        return positionals, values


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_file(engine: str, files: Mapping[str, str], path: str, what: str) -> str:
    normal = posixpath.normpath(path)
    if normal not in files:
        raise EngineConfigError(f"{engine}: {what} {path} does not exist")
    return files[normal]


def _yaml_mapping(engine: str, text: str, path: str) -> dict[Any, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise EngineConfigError(f"{engine}: {path} is not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EngineConfigError(f"{engine}: {path} must hold a mapping, not {type(data).__name__}")
    return data


def _int(engine: str, where: str, value: object, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineConfigError(f"{engine}: {where} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise EngineConfigError(f"{engine}: {where} must be >= {minimum}, got {value}")
    return value


def _bool(engine: str, where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise EngineConfigError(f"{engine}: {where} must be true or false, got {value!r}")
    return value


# ------------------------------------------------------------------------- TensorRT-LLM


TRTLLM_DECODING_TYPES = {"Draft_Target": True, "Eagle3": True, "Eagle": True, "MTP": False, "NGram": False}
"""decoding_type -> whether it loads a draft checkpoint (``speculative_model``)."""
_TRTLLM_SPEC_KEYS = {
    "decoding_type",
    "max_draft_len",
    "speculative_model",
    "speculative_model_dir",
    "draft_len_schedule",
    "max_concurrency",
    "acceptance_rate_window_size",
    "acceptance_rate_threshold",
    "eagle3_one_model",
    "num_nextn_predict_layers",
    "max_matching_ngram_size",
    "is_public_pool",
    "is_keep_all",
    "is_use_oldest",
}
_TRTLLM_NGRAM_KEYS = {"max_matching_ngram_size", "is_public_pool", "is_keep_all", "is_use_oldest"}
_TRTLLM_LLM_KEYS = {
    "return_perf_metrics",
    "enable_iter_perf_stats",
    "disable_overlap_scheduler",
    "speculative_config",
    "kv_cache_config",
    "cuda_graph_config",
    "max_batch_size",
    "max_num_tokens",
    "max_seq_len",
    "enable_chunked_prefill",
    "print_iter_log",
    "trust_remote_code",
}
"""The LLM API arguments the simulated TensorRT-LLM accepts in its YAML (a subset of the real ones)."""


def parse_speculative_config(engine: str, where: str, raw: object) -> SpecConfig:
    """TensorRT-LLM's ``speculative_config`` (trtllm-serve's --config YAML or Triton's model.yaml)."""
    if not isinstance(raw, dict):
        raise EngineConfigError(f"{engine}: {where} must be a mapping")
    unknown = sorted(str(key) for key in raw if key not in _TRTLLM_SPEC_KEYS)
    if unknown:
        raise EngineConfigError(f"{engine}: {where}: unknown field(s) {', '.join(unknown)}")
    decoding_type = raw.get("decoding_type")
    if decoding_type not in TRTLLM_DECODING_TYPES:
        raise EngineConfigError(
            f"{engine}: {where}.decoding_type must be one of {', '.join(TRTLLM_DECODING_TYPES)}, "
            f"got {decoding_type!r}"
        )
    if "max_draft_len" not in raw:
        raise EngineConfigError(f"{engine}: {where}.max_draft_len is required")
    max_k = _int(engine, f"{where}.max_draft_len", raw["max_draft_len"], minimum=1)
    if "speculative_model" in raw and "speculative_model_dir" in raw:
        raise EngineConfigError(
            f"{engine}: {where}: give speculative_model or speculative_model_dir, not both"
        )
    model = raw.get("speculative_model", raw.get("speculative_model_dir"))
    needs_model = TRTLLM_DECODING_TYPES[decoding_type]
    if needs_model and not isinstance(model, str):
        raise EngineConfigError(f"{engine}: {where}: decoding_type {decoding_type} needs speculative_model")
    if not needs_model and model is not None:
        raise EngineConfigError(
            f"{engine}: {where}: decoding_type {decoding_type} takes no speculative_model"
        )
    if decoding_type != "NGram":
        extra = sorted(key for key in raw if key in _TRTLLM_NGRAM_KEYS)
        if extra:
            raise EngineConfigError(
                f"{engine}: {where}: {', '.join(extra)} only apply to decoding_type NGram"
            )
    schedule: KSchedule = ConstantK(max_k)
    raw_schedule = raw.get("draft_len_schedule")
    if raw_schedule is not None:
        if raw.get("max_concurrency") is not None:
            raise EngineConfigError(
                f"{engine}: {where}: max_concurrency and draft_len_schedule cannot be used together"
            )
        schedule = _draft_len_schedule(engine, f"{where}.draft_len_schedule", raw_schedule, max_k)
    elif raw.get("max_concurrency") is not None:
        limit = _int(engine, f"{where}.max_concurrency", raw["max_concurrency"], minimum=1)
        schedule = UpperEdgeSchedule((limit,), (max_k,))
    return SpecConfig(method=str(decoding_type), max_k=max_k, schedule=schedule, draft_model=model)


def _draft_len_schedule(engine: str, where: str, raw: object, max_k: int) -> UpperEdgeSchedule:
    if not isinstance(raw, dict):
        raise EngineConfigError(f"{engine}: {where} must be a mapping of batch size to draft length")
    if not raw:
        raise EngineConfigError(f"{engine}: {where} must not be empty")
    entries: dict[int, int] = {}
    for key, value in raw.items():
        if isinstance(key, str) and key.strip().isdigit():
            key = int(key)
        edge = _int(engine, f"{where} key {key!r}", key)
        if edge < 1:
            raise EngineConfigError(f"{engine}: {where}: batch size keys must be >= 1, got {edge}")
        k = _int(engine, f"{where}[{edge}]", value)
        if k < 0:
            raise EngineConfigError(f"{engine}: {where}[{edge}]: draft length must be >= 0, got {k}")
        if k > max_k:
            raise EngineConfigError(f"{engine}: {where}[{edge}] = {k} exceeds max_draft_len ({max_k})")
        if edge in entries:
            raise EngineConfigError(f"{engine}: {where}: batch size {edge} given twice")
        entries[edge] = k
    edges = tuple(sorted(entries))
    if entries[edges[0]] != max_k:
        raise EngineConfigError(
            f"{engine}: {where}: the smallest batch size ({edges[0]}) must map to max_draft_len "
            f"({max_k}), got {entries[edges[0]]}"
        )
    return UpperEdgeSchedule(edges, tuple(entries[e] for e in edges))


def _trtllm_llm_args(engine: str, path: str, data: Mapping[Any, Any], allowed: set[str]) -> dict[str, Any]:
    unknown = sorted(str(key) for key in data if key not in allowed)
    if unknown:
        raise EngineConfigError(f"{engine}: {path}: unknown field(s) {', '.join(unknown)}")
    options: dict[str, Any] = {}
    for key in ("return_perf_metrics", "enable_iter_perf_stats", "disable_overlap_scheduler"):
        if key in data:
            options[key] = _bool(engine, f"{path}: {key}", data[key])
    return options


_TRTLLM_SERVE_ARGS = _Args(
    "trtllm-serve",
    [
        _Flag(("--host",)),
        _Flag(("--port",), kind=int),
        _Flag(("--tp_size", "--tensor_parallel_size"), kind=int),
        _Flag(("--pp_size", "--pipeline_parallel_size"), kind=int),
        _Flag(("--ep_size",), kind=int),
        _Flag(("--config", "--extra_llm_api_options")),
        _Flag(("--backend",)),
        _Flag(("--max_batch_size",), kind=int),
        _Flag(("--max_num_tokens",), kind=int),
        _Flag(("--max_seq_len",), kind=int),
        _Flag(("--log_level",)),
        _Flag(("--trust_remote_code",), takes_value=False),
    ],
    positional=1,
)


def parse_trtllm_serve(args: Sequence[str], files: Mapping[str, str]) -> EngineConfig:
    """``trtllm-serve <model> [--host H] [--port P] [--tp_size N] [--config YAML] ...``."""
    engine = "trtllm-serve"
    positionals, values = _TRTLLM_SERVE_ARGS.read(args)
    if not positionals:
        raise EngineConfigError(f"{engine}: missing argument MODEL")
    backend = values.get("backend", "pytorch")
    if backend not in ("pytorch", "_autodeploy"):
        raise EngineConfigError(
            f"{engine}: --backend {backend!r} is not supported (the TensorRT backend is removed)"
        )
    tp = values.get("tp_size", 1)
    if tp < 1:
        raise EngineConfigError(f"{engine}: --tp_size must be >= 1")
    options: dict[str, Any] = {"return_perf_metrics": False, "enable_iter_perf_stats": False}
    spec: SpecConfig | None = None
    config_path = values.get("config")
    if config_path is not None:
        data = _yaml_mapping(engine, _read_file(engine, files, config_path, "--config file"), config_path)
        options |= _trtllm_llm_args(engine, config_path, data, _TRTLLM_LLM_KEYS)
        if data.get("speculative_config") is not None:
            spec = parse_speculative_config(
                engine, f"{config_path}: speculative_config", data["speculative_config"]
            )
    return EngineConfig(
        backend="trtllm-serve",
        model=positionals[0],
        served_model_name=positionals[0],
        tensor_parallel=tp,
        spec=spec,
        options=options,
    )


# ------------------------------------------------------------------------- Triton


TRITON_MODEL = "tensorrt_llm"
_TRITON_ARGS = _Args(
    "tritonserver",
    [
        _Flag(("--model-repository", "--model-store")),
        _Flag(("--http-port",), kind=int),
        _Flag(("--grpc-port",), kind=int),
        _Flag(("--metrics-port",), kind=int),
        _Flag(("--disable-auto-complete-config",), takes_value=False),
        _Flag(("--backend-config",), repeatable=True),
        _Flag(("--model-control-mode",)),
        _Flag(("--load-model",), repeatable=True),
        _Flag(("--strict-readiness",)),
        _Flag(("--log-verbose",), kind=int),
        _Flag(("--exit-timeout-secs",), kind=int),
        _Flag(("--allow-metrics",)),
        _Flag(("--metrics-config",), repeatable=True),
    ],
)
_MODEL_YAML_KEYS = _TRTLLM_LLM_KEYS | {
    "model",
    "backend",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "triton_config",
}
_TRITON_CONFIG_KEYS = {"max_batch_size", "decoupled", "cancellation_check_period_ms"}
_MPIRUN_FLAGS_WITH_VALUE = {"-n", "-np", "--oversubscribe-n"}


def _triton_index(argv: Sequence[str]) -> int | None:
    for index, arg in enumerate(argv):
        if posixpath.basename(arg) == "tritonserver":
            return index
    return None


def parse_triton(argv: Sequence[str], files: Mapping[str, str], env: Mapping[str, str]) -> EngineConfig:
    """``[mpirun --allow-run-as-root -n 1] tritonserver --model-repository=R ...`` with the LLM API model."""
    engine = "tritonserver"
    start = _triton_index(argv)
    assert start is not None
    launcher = list(argv[:start])
    if launcher:
        _check_mpirun(launcher)
    _, values = _TRITON_ARGS.read(argv[start + 1 :])
    repository = values.get("model_repository")
    if not repository:
        raise EngineConfigError(f"{engine}: --model-repository is required")
    mode = values.get("model_control_mode", "none")
    if mode not in ("none", "poll", "explicit"):
        raise EngineConfigError(
            f"{engine}: --model-control-mode must be none, poll or explicit, got {mode!r}"
        )
    repository = posixpath.normpath(repository)
    models = sorted(
        {path[len(repository) + 1 :].split("/", 1)[0] for path in files if path.startswith(repository + "/")}
    )
    if mode == "explicit":
        models = [m for m in models if m in values.get("load_model", [])]
    if TRITON_MODEL not in models:
        raise EngineConfigError(f"{engine}: model '{TRITON_MODEL}' is not in the repository {repository}")
    model_dir = f"{repository}/{TRITON_MODEL}"
    pbtxt = _read_file(engine, files, f"{model_dir}/config.pbtxt", "model configuration")
    if 'backend: "python"' not in pbtxt and "backend: 'python'" not in pbtxt:
        raise EngineConfigError(
            f'{engine}: {model_dir}/config.pbtxt: the LLM API model runs on backend "python"'
        )
    _read_file(engine, files, f"{model_dir}/1/model.py", "model file")
    yaml_path = posixpath.join(f"{model_dir}/1", env.get("LLM_CONFIG_PATH", "model.yaml"))
    data = _yaml_mapping(engine, _read_file(engine, files, yaml_path, "LLM config"), yaml_path)
    options = _trtllm_llm_args(engine, yaml_path, data, _MODEL_YAML_KEYS)
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise EngineConfigError(f"{engine}: {yaml_path}: model is required")
    backend = data.get("backend", "pytorch")
    if backend != "pytorch":
        raise EngineConfigError(f"{engine}: {yaml_path}: backend {backend!r} is not supported (only pytorch)")
    tp = _int(engine, f"{yaml_path}: tensor_parallel_size", data.get("tensor_parallel_size", 1), minimum=1)
    _int(engine, f"{yaml_path}: pipeline_parallel_size", data.get("pipeline_parallel_size", 1), minimum=1)
    triton_config = data.get("triton_config") or {}
    if not isinstance(triton_config, dict):
        raise EngineConfigError(f"{engine}: {yaml_path}: triton_config must be a mapping")
    unknown = sorted(str(key) for key in triton_config if key not in _TRITON_CONFIG_KEYS)
    if unknown:
        raise EngineConfigError(
            f"{engine}: {yaml_path}: triton_config: unknown field(s) {', '.join(unknown)}"
        )
    spec = None
    if data.get("speculative_config") is not None:
        spec = parse_speculative_config(
            engine, f"{yaml_path}: speculative_config", data["speculative_config"]
        )
    return EngineConfig(
        backend="triton",
        model=model,
        served_model_name=TRITON_MODEL,
        tensor_parallel=tp,
        spec=spec,
        options=options | {"metrics_port": values.get("metrics_port", 8002)},
    )


def _check_mpirun(launcher: Sequence[str]) -> None:
    if posixpath.basename(launcher[0]) != "mpirun":
        raise EngineConfigError(f"not a serving engine command: {shlex.join(launcher)}")
    index = 1
    while index < len(launcher):
        arg = launcher[index]
        if arg in _MPIRUN_FLAGS_WITH_VALUE:
            if index + 1 >= len(launcher) or not launcher[index + 1].isdigit():
                raise EngineConfigError(f"mpirun: {arg} expects a number")
            if int(launcher[index + 1]) != 1:
                raise EngineConfigError("mpirun: the Triton server runs as one process (-n 1)")
            index += 2
        elif arg == "--allow-run-as-root":
            index += 1
        else:
            raise EngineConfigError(f"mpirun: unrecognized argument {arg}")


# ------------------------------------------------------------------------- vLLM


VLLM_METHODS = {"draft_model": True, "eagle3": True, "eagle": True, "mtp": False, "ngram": False}
"""method -> whether it loads a draft checkpoint (``model``)."""
_VLLM_SPEC_KEYS = {
    "method",
    "model",
    "num_speculative_tokens",
    "num_speculative_tokens_per_batch_size",
    "draft_tensor_parallel_size",
    "prompt_lookup_max",
    "prompt_lookup_min",
}
_VLLM_ARGS = _Args(
    "vllm serve",
    [
        _Flag(("--served-model-name",)),
        _Flag(("--host",)),
        _Flag(("--port",), kind=int),
        _Flag(("--tensor-parallel-size", "-tp"), kind=int),
        _Flag(("--speculative-config",)),
        _Flag(("--max-num-seqs",), kind=int),
        _Flag(("--max-model-len",), kind=int),
        _Flag(("--gpu-memory-utilization",), kind=float),
        _Flag(("--dtype",)),
        _Flag(("--seed",), kind=int),
    ],
    positional=1,
)


def parse_vllm(args: Sequence[str]) -> EngineConfig:
    """``vllm serve <model> [--served-model-name N] [--tensor-parallel-size N] [--speculative-config JSON]``."""
    engine = "vllm serve"
    positionals, values = _VLLM_ARGS.read(args)
    if not positionals:
        raise EngineConfigError(f"{engine}: missing model_tag")
    tp = values.get("tensor_parallel_size", 1)
    if tp < 1:
        raise EngineConfigError(f"{engine}: --tensor-parallel-size must be >= 1")
    spec = None
    if "speculative_config" in values:
        spec = _vllm_spec(engine, values["speculative_config"])
    return EngineConfig(
        backend="vllm",
        model=positionals[0],
        served_model_name=values.get("served_model_name", positionals[0]),
        tensor_parallel=tp,
        spec=spec,
        options={"max_num_seqs": values.get("max_num_seqs", 256)},
    )


def _vllm_spec(engine: str, text: str) -> SpecConfig:
    where = "--speculative-config"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise EngineConfigError(f"{engine}: {where} is not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise EngineConfigError(f"{engine}: {where} must be a JSON object")
    unknown = sorted(key for key in raw if key not in _VLLM_SPEC_KEYS)
    if unknown:
        raise EngineConfigError(f"{engine}: {where}: unknown field(s) {', '.join(unknown)}")
    method = raw.get("method")
    if method not in VLLM_METHODS:
        raise EngineConfigError(
            f"{engine}: {where}: method must be one of {', '.join(VLLM_METHODS)}, got {method!r}"
        )
    model = raw.get("model")
    if VLLM_METHODS[method] and not isinstance(model, str):
        raise EngineConfigError(f"{engine}: {where}: method {method} needs a draft model")
    if not VLLM_METHODS[method] and model is not None:
        raise EngineConfigError(f"{engine}: {where}: method {method} takes no draft model")
    if method != "ngram":
        extra = sorted(key for key in raw if key.startswith("prompt_lookup_"))
        if extra:
            raise EngineConfigError(f"{engine}: {where}: {', '.join(extra)} only apply to method ngram")
    if "num_speculative_tokens" not in raw:
        raise EngineConfigError(f"{engine}: {where}: num_speculative_tokens is required")
    max_k = _int(engine, f"{where}: num_speculative_tokens", raw["num_speculative_tokens"], minimum=1)
    schedule: KSchedule = ConstantK(max_k)
    if raw.get("num_speculative_tokens_per_batch_size") is not None:
        schedule = _vllm_ranges(
            engine,
            f"{where}: num_speculative_tokens_per_batch_size",
            raw["num_speculative_tokens_per_batch_size"],
            max_k,
        )
    return SpecConfig(method=str(method), max_k=max_k, schedule=schedule, draft_model=model)


def _vllm_ranges(engine: str, where: str, raw: object, max_k: int) -> RangeSchedule:
    if isinstance(raw, dict):
        raise EngineConfigError(f"{engine}: {where} must be a list of [start, end, K], not a dict")
    if not isinstance(raw, list) or not raw:
        raise EngineConfigError(f"{engine}: {where} must be a non-empty list of [start, end, K]")
    ranges: list[tuple[int, int, int]] = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, list) or len(entry) != 3:
            raise EngineConfigError(f"{engine}: {where}[{index}] must be [start, end, K], got {entry!r}")
        start, end, k = (_int(engine, f"{where}[{index}]", value) for value in entry)
        if start < 1 or end < start:
            raise EngineConfigError(
                f"{engine}: {where}[{index}]: need 1 <= start <= end, got [{start}, {end}]"
            )
        if k < 0:
            raise EngineConfigError(f"{engine}: {where}[{index}]: K must be >= 0, got {k}")
        if k > max_k:
            raise EngineConfigError(
                f"{engine}: {where}[{index}]: K={k} exceeds num_speculative_tokens ({max_k})"
            )
        ranges.append((start, end, k))
    ranges.sort()
    if ranges[0][0] != 1:
        raise EngineConfigError(f"{engine}: {where}: the first range must start at 1, got {ranges[0][0]}")
    for before, after in itertools.pairwise(ranges):
        if after[0] <= before[1]:
            raise EngineConfigError(
                f"{engine}: {where}: ranges [{before[0]}, {before[1]}] and [{after[0]}, {after[1]}] overlap"
            )
    return RangeSchedule(tuple(ranges))


# ------------------------------------------------------------------------- SGLang


SGLANG_ALGORITHMS = {"EAGLE": None, "NEXTN": None, "EAGLE3": True, "STANDALONE": True, "NGRAM": False}
"""algorithm -> draft path required (True), refused (False) or optional (None: EAGLE is MTP without one)."""
_SGLANG_SLOT_KEYS = {
    "candidate_steps",
    "up_hysteresis",
    "down_hysteresis",
    "ceiling_coeff",
    "ema_alpha",
    "update_interval",
    "warmup_batches",
}
_SGLANG_TOP_KEYS = (_SGLANG_SLOT_KEYS - {"candidate_steps"}) | {"strategy"}
_SGLANG_AUTO = (3, 1, 4)
"""num-steps, eagle-topk, num-draft-tokens when none is given (the engine picks; the sim uses these)."""
_SGLANG_ARGS = _Args(
    "sglang.launch_server",
    [
        _Flag(("--model-path", "--model")),
        _Flag(("--served-model-name",)),
        _Flag(("--host",)),
        _Flag(("--port",), kind=int),
        _Flag(("--tp-size", "--tp"), kind=int),
        _Flag(("--enable-metrics",), takes_value=False),
        _Flag(("--speculative-algorithm",)),
        _Flag(("--speculative-draft-model-path",)),
        _Flag(("--speculative-num-steps",), kind=int),
        _Flag(("--speculative-eagle-topk",), kind=int),
        _Flag(("--speculative-num-draft-tokens",), kind=int),
        _Flag(("--speculative-adaptive",), takes_value=False),
        _Flag(("--speculative-adaptive-config",)),
        _Flag(("--speculative-ngram-max-match-window-size",), kind=int),
        _Flag(("--speculative-ngram-min-match-window-size",), kind=int),
        _Flag(("--mem-fraction-static",), kind=float),
        _Flag(("--max-running-requests",), kind=int),
        _Flag(("--decode-log-interval",), kind=int),
        _Flag(("--trust-remote-code",), takes_value=False),
    ],
)


def parse_sglang(args: Sequence[str], files: Mapping[str, str]) -> EngineConfig:
    """``python3 -m sglang.launch_server --model-path M [--speculative-* ...]``."""
    engine = "sglang.launch_server"
    _, values = _SGLANG_ARGS.read(args)
    model = values.get("model_path")
    if not model:
        raise EngineConfigError(f"{engine}: --model-path is required")
    tp = values.get("tp_size", 1)
    if tp < 1:
        raise EngineConfigError(f"{engine}: --tp-size must be >= 1")
    spec = _sglang_spec(engine, values, files)
    return EngineConfig(
        backend="sglang",
        model=model,
        served_model_name=values.get("served_model_name", model),
        tensor_parallel=tp,
        spec=spec,
        options={"enable_metrics": bool(values.get("enable_metrics"))},
    )


def _sglang_spec(engine: str, values: Mapping[str, Any], files: Mapping[str, str]) -> SpecConfig | None:
    algorithm = values.get("speculative_algorithm")
    spec_flags = sorted(
        "--" + key.replace("_", "-")
        for key in values
        if key.startswith("speculative_") and key != "speculative_algorithm"
    )
    if algorithm is None:
        if spec_flags:
            raise EngineConfigError(f"{engine}: {', '.join(spec_flags)} need --speculative-algorithm")
        return None
    if algorithm not in SGLANG_ALGORITHMS:
        raise EngineConfigError(
            f"{engine}: --speculative-algorithm must be one of {', '.join(SGLANG_ALGORITHMS)}, got {algorithm!r}"
        )
    draft = values.get("speculative_draft_model_path")
    needs_draft = SGLANG_ALGORITHMS[algorithm]
    if needs_draft is True and draft is None:
        raise EngineConfigError(
            f"{engine}: --speculative-algorithm {algorithm} needs --speculative-draft-model-path"
        )
    if needs_draft is False and draft is not None:
        raise EngineConfigError(f"{engine}: --speculative-algorithm {algorithm} takes no draft model path")
    if algorithm != "NGRAM":
        ngram = [flag for flag in spec_flags if flag.startswith("--speculative-ngram-")]
        if ngram:
            raise EngineConfigError(f"{engine}: {', '.join(ngram)} only apply to NGRAM")
    triple = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    given = [key in values for key in triple]
    if any(given) and not all(given):
        raise EngineConfigError(
            f"{engine}: set all of --speculative-num-steps, --speculative-eagle-topk and "
            "--speculative-num-draft-tokens, or none of them"
        )
    steps, topk, draft_tokens = (values[key] for key in triple) if all(given) else _SGLANG_AUTO
    if steps < 1 or topk < 1 or draft_tokens < 1:
        raise EngineConfigError(f"{engine}: speculative steps, topk and draft tokens must be >= 1")
    if topk == 1 and draft_tokens != steps + 1:
        draft_tokens = steps + 1  # the engine sets it so (with a warning)
    schedule: KSchedule = ConstantK(steps)
    adaptive_path = values.get("speculative_adaptive_config")
    if values.get("speculative_adaptive"):
        if algorithm not in ("EAGLE", "NEXTN", "EAGLE3"):
            raise EngineConfigError(
                f"{engine}: --speculative-adaptive supports EAGLE and EAGLE3 only, not {algorithm}"
            )
        if topk != 1:
            raise EngineConfigError(f"{engine}: --speculative-adaptive needs --speculative-eagle-topk 1")
        schedule = _sglang_adaptive(engine, adaptive_path, files, steps)
    elif adaptive_path is not None:
        raise EngineConfigError(f"{engine}: --speculative-adaptive-config needs --speculative-adaptive")
    return SpecConfig(method=str(algorithm), max_k=steps, schedule=schedule, draft_model=draft)


_SGLANG_DEFAULT_SLOTS = ((1, (1, 3, 5, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))


def _sglang_adaptive(
    engine: str, path: str | None, files: Mapping[str, str], max_steps: int
) -> LowerEdgeSchedule:
    if path is None:
        defaults = [
            (edge, tuple(c for c in cands if c <= max_steps) or (0,)) for edge, cands in _SGLANG_DEFAULT_SLOTS
        ]
        return LowerEdgeSchedule(
            tuple(e for e, _ in defaults), tuple(max(c) for _, c in defaults), tuple(c for _, c in defaults)
        )
    where = f"--speculative-adaptive-config {path}"
    text = _read_file(engine, files, path, "adaptive config")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise EngineConfigError(f"{engine}: {where} is not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise EngineConfigError(f"{engine}: {where} must be a JSON object")
    if "candidate_steps" in raw:
        raise EngineConfigError(
            f"{engine}: {where}: the flat form (top-level candidate_steps) is not supported; "
            'give per-batch slots such as {"1": {"candidate_steps": [...]}}'
        )
    slots: dict[int, tuple[int, ...]] = {}
    for key, value in raw.items():
        if key.isdigit():
            slots[int(key)] = _sglang_slot(engine, f"{where}: slot {key}", value, max_steps)
        elif key not in _SGLANG_TOP_KEYS:
            raise EngineConfigError(f"{engine}: {where}: unknown field {key!r}")
    strategy = raw.get("strategy", "ema")
    if strategy not in ("ema", "throughput_aware"):
        raise EngineConfigError(
            f"{engine}: {where}: strategy must be ema or throughput_aware, got {strategy!r}"
        )
    if not slots:
        raise EngineConfigError(f"{engine}: {where}: at least one integer batch-size slot key is required")
    if 0 in slots:
        raise EngineConfigError(f"{engine}: {where}: slot keys are batch sizes >= 1")
    edges = tuple(sorted(slots))
    return LowerEdgeSchedule(edges, tuple(max(slots[e]) for e in edges), tuple(slots[e] for e in edges))


def _sglang_slot(engine: str, where: str, raw: object, max_steps: int) -> tuple[int, ...]:
    if not isinstance(raw, dict):
        raise EngineConfigError(f"{engine}: {where} must be an object")
    unknown = sorted(key for key in raw if key not in _SGLANG_SLOT_KEYS)
    if unknown:
        raise EngineConfigError(f"{engine}: {where}: unknown field(s) {', '.join(unknown)}")
    candidates = raw.get("candidate_steps")
    if not isinstance(candidates, list) or not candidates:
        raise EngineConfigError(f"{engine}: {where}: candidate_steps must be a non-empty list of integers")
    steps = tuple(_int(engine, f"{where}: candidate_steps", c, minimum=0) for c in candidates)
    too_long = [s for s in steps if s > max_steps]
    if too_long:
        raise EngineConfigError(
            f"{engine}: {where}: candidate step {too_long[0]} exceeds --speculative-num-steps ({max_steps})"
        )
    return steps
