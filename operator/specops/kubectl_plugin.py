"""`kubectl specops`: watch and steer SpeculativeDeployments the way `kubectl argo rollouts` does.

Installed as the `kubectl-specops` console script, so kubectl finds it on PATH. It talks to the
cluster of the kubeconfig ($KUBECONFIG, else ~/.kube/config) and uses its current namespace
unless `-n` says otherwise.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import click
from rich.live import Live

from specops.cli import (
    CONTEXT_SETTINGS,
    context_option,
    gate_command,
    kubeconfig_option,
    namespace_option,
    version,
)
from specops.cli_output import console, write_json
from specops.operations import CANARY_ANNOTATIONS, Cluster, OperationError, current_namespace
from specops.plan import plan_command
from specops.views import list_table, resource_view, summary


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(version(), "--version", prog_name="kubectl-specops", message="%(prog)s %(version)s")
def main() -> None:
    """Watch and steer SpeculativeDeployments (kubectl specops COMMAND)."""


def fail(error: OperationError) -> None:
    click.echo(f"error: {error}", err=True)
    sys.exit(1)


async def _snapshot(
    kubeconfig: str | None, context: str | None, namespace: str, name: str
) -> tuple[dict[str, Any], list[Any]]:
    async with Cluster(kubeconfig, context) as cluster:
        body = await cluster.get(namespace, name)
        events = await cluster.events(namespace, name)
    return body, events


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@namespace_option
@kubeconfig_option
@context_option
@click.option("-w", "--watch", is_flag=True, help="keep the view live until Ctrl-C")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=1.0,
    show_default=True,
    help="seconds between updates",
)
@click.option("--json", "json_path", metavar="PATH", help="write the summary as JSON to PATH ('-' = stdout)")
def get(
    name: str,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    watch: bool,
    interval: float,
    json_path: str | None,
) -> None:
    """Show one SpeculativeDeployment: speculation, alpha, batch vs break-even, p99 vs SLO, canary,
    retraining, the last decisions and recent Events."""
    namespace = namespace or current_namespace(kubeconfig, context)
    out = console(stderr=json_path == "-")
    try:
        body, events = asyncio.run(_snapshot(kubeconfig, context, namespace, name))
    except OperationError as error:
        fail(error)
    if not watch:
        out.print(resource_view(body, events))
        write_json(summary(body), json_path)
        return
    if json_path is not None:
        raise click.UsageError("--json and --watch do not go together")
    try:
        if out.is_terminal:
            with Live(resource_view(body, events), console=out, refresh_per_second=4) as live:
                while True:
                    time.sleep(interval)
                    body, events = asyncio.run(_snapshot(kubeconfig, context, namespace, name))
                    live.update(resource_view(body, events))
        else:
            # Not a terminal: print the view again whenever what it shows changes (like kubectl get -w).
            shown = None
            while True:
                key = (body["metadata"].get("resourceVersion"), len(events))
                if key != shown:
                    out.print(resource_view(body, events))
                    out.print()
                    out.file.flush()
                    shown = key
                time.sleep(interval)
                body, events = asyncio.run(_snapshot(kubeconfig, context, namespace, name))
    except KeyboardInterrupt:
        return
    except OperationError as error:
        fail(error)


@main.command("list", context_settings=CONTEXT_SETTINGS)
@namespace_option
@kubeconfig_option
@context_option
@click.option("-A", "--all-namespaces", is_flag=True, help="every namespace")
@click.option("-o", "--output", type=click.Choice(["wide"]), help="wide: every printer column")
@click.option(
    "--json", "json_path", metavar="PATH", help="write the summaries as JSON to PATH ('-' = stdout)"
)
def list_command(
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    all_namespaces: bool,
    output: str | None,
    json_path: str | None,
) -> None:
    """List SpeculativeDeployments with the CRD's printer columns (kubectl get sdep)."""

    async def fetch() -> list[dict[str, Any]]:
        async with Cluster(kubeconfig, context) as cluster:
            return await cluster.list_all(
                None if all_namespaces else namespace or current_namespace(kubeconfig, context)
            )

    try:
        bodies = asyncio.run(fetch())
    except OperationError as error:
        fail(error)
    out = console(stderr=json_path == "-")
    if bodies:
        out.print(list_table(bodies, wide=output == "wide"))
    else:
        out.print("No resources found.")
    write_json([summary(b) for b in bodies], json_path)


main.add_command(plan_command)
for _action in CANARY_ANNOTATIONS:
    main.add_command(gate_command(_action))


if __name__ == "__main__":
    main()
