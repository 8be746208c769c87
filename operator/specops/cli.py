"""The `specops` command: run the operator, plan drafts, set canary gates, benchmark, print the CRD, and
drive the local stack (`specops local ...`, added by the specops-local distribution when installed)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
from typing import Any

import click

from specops.operations import (
    CANARY_ANNOTATIONS,
    CANARY_GATE_HELP,
    CANARY_OPERATIONS,
    current_namespace,
    set_canary_gate,
)
from specops.plan import plan_command
from specops.plugins import COMMANDS, LOCAL_STACK_MISSING, provider, registered

__all__ = ["CANARY_ANNOTATIONS", "main", "set_canary_gate"]

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def version() -> str:
    try:
        return importlib.metadata.version("specops")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover (running from a source tree)
        return "unknown"


class PluginGroup(click.Group):
    """The top-level group: its own commands, then those other distributions register under
    `specops.commands` (loaded only when named or listed). `local` stays reachable without the local
    stack, to say how to install it."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *registered(COMMANDS), "local"})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        point = registered(COMMANDS).get(cmd_name)
        if point is None:
            return local_missing if cmd_name == "local" else None
        try:
            loaded: click.Command = point.load()
        except ImportError as error:
            raise click.ClickException(
                f"cannot load `specops {cmd_name}` from {provider(point)}: {error}"
            ) from None
        return loaded


@click.group(cls=PluginGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(version(), "--version", prog_name="specops", message="%(prog)s %(version)s")
def main() -> None:
    """specops: LLM serving with speculative decoding as a self-tuning Kubernetes service."""


# ---------------------------------------------------------------- run


@main.command(context_settings=CONTEXT_SETTINGS)
@click.option(
    "-n", "--namespace", "namespaces", multiple=True, metavar="NS", help="watch this namespace (repeatable)"
)
@click.option("-A", "--all-namespaces", is_flag=True, help="watch every namespace (the default)")
@click.option("--liveness", metavar="URL", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
@click.option(
    "--leader-election",
    is_flag=True,
    help="run as one of several replicas: act only while holding a coordination.k8s.io Lease",
)
@click.option(
    "--lease-name", default="specops-operator", show_default=True, help="the Lease of --leader-election"
)
@click.option(
    "--lease-namespace",
    metavar="NS",
    help="namespace of the Lease (default: $POD_NAMESPACE, else the service account's namespace)",
)
@click.option("--peering", is_flag=True, hidden=True, help="refused: use --leader-election")
@click.option(
    "--metrics-port",
    type=int,
    default=8081,
    show_default=True,
    help="serve the operator's Prometheus metrics on /metrics at this port (0: off)",
)
@click.option(
    "--metrics-address", default="0.0.0.0", show_default=True, help="address the metrics server binds"
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="default: info",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="same as --log-level debug")
def run(**options: Any) -> None:
    """Run the operator (Kopf) against the cluster in $KUBECONFIG, or in-cluster."""
    if options["namespaces"] and options["all_namespaces"]:
        raise click.UsageError("-n/--namespace and -A/--all-namespaces are mutually exclusive")
    if options.pop("peering"):
        raise click.UsageError(PEERING_REFUSED)
    run_operator(**options)


PEERING_REFUSED = (
    "--peering (Kopf peering) is not supported: with it, replicas of equal priority all pause, and "
    "without the KopfPeering CRDs every replica acts. Run several replicas with --leader-election "
    "(one Lease, one acting leader); docs/install.md explains it."
)


def run_operator(
    *,
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    liveness: str | None,
    leader_election: bool = False,
    lease_name: str = "specops-operator",
    lease_namespace: str | None = None,
    metrics_port: int,
    metrics_address: str,
    log_level: str | None,
    log_format: str,
    verbose: bool,
) -> None:
    import kopf

    import specops.handlers  # noqa: F401  (registers the handlers)
    from specops.adapters import gc_tuning, operator_metrics

    configure_logging("debug" if verbose else (log_level or "info"), log_format)
    gc_tuning.configure()
    if metrics_port:
        operator_metrics.serve(metrics_port, metrics_address)
    if not leader_election:
        kopf.run(
            clusterwide=not namespaces, namespaces=namespaces, standalone=True, liveness_endpoint=liveness
        )
        return
    from specops.adapters.leader import LeadershipLost

    try:
        asyncio.run(run_elected(namespaces, liveness, lease_name, lease_namespace))
    except LeadershipLost as lost:
        # Exit so that the pod restarts as a follower: nothing of this leader's state survives.
        click.echo(f"specops: leadership lost ({lost}); exiting", err=True)
        sys.exit(1)


async def run_elected(
    namespaces: tuple[str, ...], liveness: str | None, lease_name: str, lease_namespace: str | None
) -> None:
    """Follow until the Lease is ours, then run Kopf (standalone) for as long as it stays ours."""
    import kopf

    from specops.adapters.kube import KubeClient, load_connection_settings
    from specops.adapters.leader import LeaseElector, LeaseTimings, default_namespace, follower_health, lead
    from specops.services.config import OperatorConfig

    config = OperatorConfig.from_env()  # SPECOPS_LEASE_* (the chart's leaderElection values)
    timings = LeaseTimings(config.lease_duration_s, config.renew_deadline_s, config.retry_period_s)
    kube = KubeClient(load_connection_settings())
    elector = LeaseElector(
        kube, namespace=lease_namespace or default_namespace(), name=lease_name, timings=timings
    )
    try:
        async with follower_health(liveness):
            await elector.acquire()

        async def operate(stop_flag: asyncio.Event) -> None:
            # Not Kopf's stop_flag: Kopf would wait 5 s for that flag's waiter after a SIGTERM.
            # On a lost Lease the operator is cancelled instead, which Kopf handles at once.
            stepping_down = asyncio.ensure_future(stop_flag.wait())
            operator = asyncio.ensure_future(
                kopf.operator(
                    clusterwide=not namespaces,
                    namespaces=namespaces,
                    standalone=True,
                    liveness_endpoint=liveness,
                )
            )
            try:
                await asyncio.wait({stepping_down, operator}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stepping_down.cancel()
                operator.cancel()
            await operator

        await lead(elector, operate)
    finally:
        await kube.close()


QUIET_LOGGERS = ("httpx", "httpcore", "aiohttp.access")
"""Request-level loggers: one INFO line per HTTP call would drown the operator's own lines."""


def configure_logging(level: str, log_format: str) -> None:
    """Kopf's formatter (text or one JSON object per line) at ``level``; request lines only at debug."""
    import logging

    import kopf

    from specops.adapters import log_redaction

    log_redaction.install()
    debug = level == "debug"
    kopf.configure(
        debug=debug, log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL
    )
    logging.getLogger().setLevel(level.upper())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.WARNING)


# ---------------------------------------------------------------- plan, crd


main.add_command(plan_command)


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("file", required=False, type=click.Path(dir_okay=False, writable=True))
def crd(file: str | None) -> None:
    """Print the CRD generated from the API models, or write it to FILE."""
    from pathlib import Path

    from specops.api.crd import render_yaml

    text = render_yaml()
    if file is None or file == "-":
        sys.stdout.write(text)
        return
    path = Path(file)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as error:
        raise click.ClickException(f"cannot write {file}: {error.strerror or error}") from None
    click.echo(f"wrote {path}")


# ---------------------------------------------------------------- canary gates


@main.group(context_settings=CONTEXT_SETTINGS)
def canary() -> None:
    """Manual canary gates. They set the documented annotations; the operator acts at its next tick."""


def namespace_option(function: Any) -> Any:
    return click.option(
        "-n",
        "--namespace",
        metavar="NS",
        help="namespace (default: the kubeconfig context's namespace, else default)",
    )(function)


def kubeconfig_option(function: Any) -> Any:
    return click.option("--kubeconfig", metavar="PATH", help="defaults to $KUBECONFIG, then ~/.kube/config")(
        function
    )


def context_option(function: Any) -> Any:
    return click.option(
        "--context", metavar="NAME", help="the kubeconfig context (default: its current one)"
    )(function)


def gate_command(action: str) -> click.Command:
    @click.command(
        action, help=CANARY_GATE_HELP[action].capitalize() + ".", context_settings=CONTEXT_SETTINGS
    )
    @click.argument("name")
    @namespace_option
    @kubeconfig_option
    @context_option
    def command(name: str, namespace: str | None, kubeconfig: str | None, context: str | None) -> None:
        namespace = namespace or current_namespace(kubeconfig, context)
        code = asyncio.run(set_canary_gate(action, name, namespace, kubeconfig, context))
        if code:
            sys.exit(code)

    return command


for _action in CANARY_OPERATIONS:
    canary.add_command(gate_command(_action))


# ---------------------------------------------------------------- bench (a pass-through)


def bench_help() -> str:
    from specops.bench import BENCHMARKS
    from specops.plugins import local_stack_installed

    names = ", ".join(BENCHMARKS)
    text = (
        "Run a benchmark: specops bench NAME [ARGS] (NAME --help for its options), or "
        "specops bench all --out DIR for every one.\n\n"
        f"Benchmarks: {names}. Each prints a table and writes --json PATH. The reaction benchmark runs "
        "the whole local stack: specops local reaction."
    )
    if not local_stack_installed():
        text += (
            f"\n\nThe local stack adds the benchmarks that run an emulated cluster; {LOCAL_STACK_MISSING}."
        )
    return text


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    short_help="run benchmarks (specops bench --help lists them)",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def bench(ctx: click.Context, args: tuple[str, ...]) -> None:
    """Run benchmarks; arguments go to `specops.bench` unchanged."""
    if not args or args[0] in ("-h", "--help"):
        click.echo(ctx.get_usage() + "\n\n" + bench_help())
        ctx.exit(0 if args else 2)
    from specops.bench import main as bench_main

    sys.exit(bench_main(list(args)))


# ---------------------------------------------------------------- profile


class OneLineErrors(click.Command):
    """A command whose usage mistakes are one line (no usage block), naming what replaced an old option."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as error:
            raise UsageLine(usage_line(error, info_name or self.name or "")) from None


class UsageLine(click.ClickException):
    exit_code = 2


def usage_line(error: click.UsageError, command: str) -> str:
    from specops.profiling import OLD_OPTIONS

    if isinstance(error, click.NoSuchOption) and error.option_name in OLD_OPTIONS:
        return f"there is no option {error.option_name}: {OLD_OPTIONS[error.option_name]}"
    message = " ".join(error.format_message().split()).rstrip(".")
    return f"{message} (see specops {command} --help)"


PROFILE_HELP = """Measure a serving profile from live engines, one revision per draft length.

\b
Start one engine per draft length to measure (a speculating engine drafts what it was started
with), then name each with that length:
  specops profile --backend vllm --engine 0=http://plain:8000 \\
      --engine 2=http://spec-k2:8000 --engine 4=http://spec-k4:8000 --out profile.json

For each engine and batch N, N greedy requests are held in flight through the engine's own
completions (OpenAI) or generate (Triton) endpoint; after a warm-up, one window of --duration
is measured between two scrapes of the engine's metrics: its own per-token latency (else the
client's) and, for K engines, tokens per round from its speculation counters. The profile
(docs/profiles.md) gets plain_ms from engine 0, round_ms[K] from each K engine and, from a k0
engine, k0_ms; a summary table follows. Engines must be otherwise idle."""


class ProfileBar:
    """A rich progress bar on stderr, one step per engine and batch, with a line per result."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True, soft_wrap=True, markup=False, highlight=False),
            transient=True,
        )
        self.task: Any = None

    def start(self, total: int) -> None:
        self.bar.start()
        self.task = self.bar.add_task("measuring", total=total)

    def begin(self, label: str, batch: int) -> None:
        self.bar.update(self.task, description=f"engine {label}, batch {batch}")

    def cell(self, cell: Any) -> None:
        e = "" if cell.tokens_per_step is None else f", {cell.tokens_per_step:.2f} tokens per round"
        self.bar.console.print(
            f"engine {cell.label} batch {cell.batch}: {cell.per_token_s * 1e3:.2f} ms per token "
            f"({cell.timing}){e}"
        )
        self.bar.advance(self.task)

    def warn(self, text: str) -> None:
        self.bar.console.print(f"warning: {text}")

    def stop(self) -> None:
        self.bar.stop()


@main.command(
    cls=OneLineErrors,
    context_settings=CONTEXT_SETTINGS,
    help=PROFILE_HELP,
    short_help="measure a serving profile from live engines, one revision per draft length",
)
@click.option(
    "-e",
    "--engine",
    "engines",
    multiple=True,
    required=True,
    metavar="K=URL",
    help="an engine and the draft length it was started with (repeatable): 0 = plain (no speculation), "
    "K >= 1 = a constant schedule drafting K, k0 = speculating with a schedule that gives K=0 at every "
    "batch swept (gives k0_ms). Needs 0 and at least one K.",
)
@click.option(
    "--backend",
    type=click.Choice(["triton", "trtllm-serve", "vllm", "sglang"]),
    default="triton",
    show_default=True,
    help="the engines' backend: its API, health endpoint and metric names",
)
@click.option(
    "--model",
    metavar="NAME",
    help="served model name sent in OpenAI requests (default: the first one the engine lists on "
    "/v1/models; Triton: not used)",
)
@click.option(
    "--batches",
    metavar="N,N,...",
    default="1,2,4,8,16,32",
    show_default=True,
    help="batches to sweep: requests held in flight, comma-separated",
)
@click.option(
    "--duration",
    metavar="DURATION",
    default="30s",
    show_default=True,
    help="measured window per engine and batch, e.g. 30s",
)
@click.option("--warmup", metavar="DURATION", help="load before each window (default: a tenth of --duration)")
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 1_000_000),
    default=128,
    show_default=True,
    help="tokens per request (OpenAI engines are asked to ignore the end token)",
)
@click.option(
    "--metrics",
    "metrics",
    multiple=True,
    metavar="K=URL",
    help="metrics endpoint of engine K (repeatable; default: the engine's host with the backend's "
    "metrics port and path, e.g. :8002/metrics for Triton, /prometheus/metrics for trtllm-serve)",
)
@click.option(
    "--no-metrics",
    is_flag=True,
    help="read no metrics: time requests at the client and take acceptance from --alpha",
)
@click.option(
    "--client-timing",
    is_flag=True,
    help="time requests at the client even where the engines export their latency "
    "(acceptance still from their counters)",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0.0, 1.0, max_open=True),
    help="per-token acceptance where the engines do not measure it (default: measured)",
)
@click.option(
    "--prompt",
    metavar="TEXT",
    default=None,
    help="prompt of every request, numbered per request (default: a fixed one-paragraph question)",
)
@click.option(
    "--timeout", metavar="DURATION", default="5m", show_default=True, help="longest wait for one request"
)
@click.option("--name", default="measured", show_default=True, help="the profile's name")
@click.option(
    "-o",
    "--out",
    default="profile.json",
    show_default=True,
    metavar="FILE",
    help="where to write the profile JSON ('-': stdout, the summary then goes to stderr)",
)
def profile(**options: Any) -> None:
    from specops.profiling import ProfilingError

    try:
        measure_profile(**options)
    except ProfilingError as error:
        raise click.ClickException(str(error)) from None


def measure_profile(
    *,
    engines: tuple[str, ...],
    backend: str,
    model: str | None,
    batches: str,
    duration: str,
    warmup: str | None,
    max_tokens: int,
    metrics: tuple[str, ...],
    no_metrics: bool,
    client_timing: bool,
    alpha: float | None,
    prompt: str | None,
    timeout: str,
    name: str,
    out: str,
) -> None:
    import json
    from pathlib import Path

    from specops.api.units import parse_duration
    from specops.domain.profile import ServingProfile
    from specops.profiling import PROMPT, ProfilingError, Settings, parse_batches, parse_engines, run, summary

    def seconds(option: str, text: str, minimum: float) -> float:
        try:
            value = parse_duration(text)
        except ValueError as error:
            raise ProfilingError(f"{option}: {error}") from None
        if value < minimum:
            raise ProfilingError(f"{option} {text!r}: must be at least {minimum:g} s")
        return value

    if not name.strip():
        raise ProfilingError("--name must not be empty")
    window = seconds("--duration", duration, 0.05)
    settings = Settings(
        backend=backend,
        engines=parse_engines(engines, metrics),
        batches=parse_batches(batches),
        duration_s=window,
        warmup_s=window / 10 if warmup is None else seconds("--warmup", warmup, 0.0),
        max_tokens=max_tokens,
        model=model,
        prompt=prompt or PROMPT,
        alpha=alpha,
        use_metrics=not no_metrics,
        client_timing=client_timing,
        timeout_s=seconds("--timeout", timeout, 0.1),
        name=name,
    )
    bar = ProfileBar()
    try:
        measured = asyncio.run(run(settings, bar))
    finally:
        bar.stop()
    text = json.dumps(measured, indent=1) + "\n"
    if out == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(out).write_text(text)
        except OSError as error:
            raise ProfilingError(f"cannot write {out}: {error.strerror or error}") from None
    table = summary(ServingProfile.from_dict(measured), "--alpha" if alpha is not None else "measured")
    click.echo(table, err=out == "-")
    if out != "-":
        click.echo(f"wrote {out}")


# ---------------------------------------------------------------- local (its own distribution)


@click.command(
    "local",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
    short_help="the local stack (not installed: pip install -e ./local in a clone)",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def local_missing(args: tuple[str, ...]) -> None:
    """Stands in for `specops local` while the local stack is not installed."""
    raise click.ClickException(LOCAL_STACK_MISSING)


if __name__ == "__main__":
    main()
