"""The `specops` command: run the operator, plan drafts, set canary gates, benchmark, print the CRD, and
drive the local stack (`specops local ...`, from the optional `specops[local]` package)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import sys
from typing import Any

import click

from specops.operations import (
    CANARY_ANNOTATIONS,
    CANARY_GATE_HELP,
    current_namespace,
    set_canary_gate,
)
from specops.plan import plan_command

__all__ = ["CANARY_ANNOTATIONS", "main", "set_canary_gate"]

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
LOCAL_MISSING = (
    "the local stack is not installed: install the extra with  pip install 'specops[local]'  "
    "(in a clone: make install)"
)


def version() -> str:
    try:
        return importlib.metadata.version("specops")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover (running from a source tree)
        return "unknown"


@click.group(context_settings=CONTEXT_SETTINGS)
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
    from specops.adapters.leader import LeaseElector, default_namespace, follower_health, lead

    kube = KubeClient(load_connection_settings())
    elector = LeaseElector(kube, namespace=lease_namespace or default_namespace(), name=lease_name)
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


for _action in CANARY_ANNOTATIONS:
    canary.add_command(gate_command(_action))


# ---------------------------------------------------------------- bench (a pass-through)


def bench_help() -> str:
    from specops.bench import BENCHMARKS

    names = ", ".join(sorted(BENCHMARKS))
    return (
        "Run a benchmark: specops bench NAME [ARGS] (NAME --help for its options), or "
        "specops bench all --out DIR for every one.\n\n"
        f"Benchmarks: {names}. Each prints a table and writes --json PATH. The reaction benchmark runs "
        "the whole local stack: specops local reaction."
    )


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


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    short_help="measure a live engine's speedup curve into a serving profile",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def profile(args: tuple[str, ...]) -> None:
    """specops profile --url HOST:PORT [...] --out FILE (specops profile --help lists the options)."""
    from specops.profiling import main as profile_main

    sys.exit(profile_main(list(args)))


# ---------------------------------------------------------------- local (the optional package)


class LocalStackGroup(click.Group):
    """`specops local ...`: commands of the specops_local package, loaded only when used."""

    def _local(self) -> click.Group | None:
        try:
            # A name, not an import statement: the operator package never depends on specops_local.
            module = importlib.import_module("specops_local.cli")
        except ModuleNotFoundError as error:
            if error.name and error.name.split(".")[0] in ("specops_local", "kmock", "matplotlib", "celpy"):
                return None
            raise
        group: click.Group = module.local
        return group

    def list_commands(self, ctx: click.Context) -> list[str]:
        local = self._local()
        return local.list_commands(ctx) if local is not None else []

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        local = self._local()
        if local is None:
            raise click.ClickException(LOCAL_MISSING)
        return local.get_command(ctx, cmd_name)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_help(ctx, formatter)
        if self._local() is None:
            formatter.write_paragraph()
            formatter.write_text(LOCAL_MISSING)


@main.group(cls=LocalStackGroup, context_settings=CONTEXT_SETTINGS)
def local() -> None:
    """The local stack: an emulated Kubernetes API, Debian's Prometheus, simulated pods, the operator."""


if __name__ == "__main__":
    main()
