"""`kubectl specops`: watch and steer SpeculativeDeployments the way `kubectl argo rollouts` does.

Installed as the `kubectl-specops` console script, so kubectl finds it on PATH. It talks to the
cluster of the kubeconfig ($KUBECONFIG, else ~/.kube/config) and uses its current namespace
unless `-n` says otherwise.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import click
import yaml
from rich.live import Live

from specops.api.units import format_duration, parse_duration
from specops.cli import (
    CONTEXT_SETTINGS,
    context_option,
    gate_command,
    kubeconfig_option,
    namespace_option,
    version,
)
from specops.cli_output import console, write_json
from specops.operations import CANARY_OPERATIONS, Cluster, OperationError, current_namespace
from specops.plan import plan_command
from specops.views import IN_PROGRESS, condition_level, health, list_table, resource_view, summary


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(version(), "--version", prog_name="kubectl-specops", message="%(prog)s %(version)s")
def main() -> None:
    """Watch and steer SpeculativeDeployments (kubectl specops COMMAND)."""


def fail(error: OperationError) -> None:
    click.echo(f"error: {error}", err=True)
    sys.exit(1)


async def _snapshot(
    kubeconfig: str | None, context: str | None, namespace: str, name: str
) -> tuple[dict[str, Any], list[Any], list[dict[str, Any]]]:
    async with Cluster(kubeconfig, context) as cluster:
        body = await cluster.get(namespace, name)
        events = await cluster.events(namespace, name)
        children = await cluster.children(namespace, name)
    return body, events, children


OUTPUTS = click.Choice(["json", "yaml", "wide"])


def emit(records: Any, output: str | None) -> bool:
    """`-o json|yaml`: the summary records on stdout; False when the output is for people."""
    if output == "json":
        click.echo(json.dumps(records, indent=2))
        return True
    if output == "yaml":
        click.echo(yaml.safe_dump(records, sort_keys=False), nl=False)
        return True
    return False


def record(body: dict[str, Any]) -> dict[str, Any]:
    """summary() plus the health headline."""
    info = summary(body)
    info["health"], info["healthReason"] = health(info)
    return info


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@namespace_option
@kubeconfig_option
@context_option
@click.option("-w", "--watch", is_flag=True, help="keep the view live until Ctrl-C (watches, no polling)")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=1.0,
    show_default=True,
    help="seconds between redraws of a live view (ages move on)",
)
@click.option("--all", "all_conditions", is_flag=True, help="every condition, not only the abnormal ones")
@click.option(
    "-o", "--output", type=OUTPUTS, help="json|yaml: the summary record; wide: the row with every column"
)
@click.option("--json", "json_path", metavar="PATH", help="write the summary as JSON to PATH ('-' = stdout)")
def get(
    name: str,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    watch: bool,
    interval: float,
    all_conditions: bool,
    output: str | None,
    json_path: str | None,
) -> None:
    """Show one SpeculativeDeployment: a health headline, speculation, alpha, batch vs break-even,
    p99 vs SLO, canary, retraining, the last decisions, abnormal conditions and recent Events."""
    if watch and (json_path is not None or output is not None):
        raise click.UsageError("--watch shows the live view: leave out --json and -o")
    namespace = namespace or current_namespace(kubeconfig, context)
    out = console(stderr=json_path == "-")
    if watch:
        try:
            asyncio.run(_watch(kubeconfig, context, namespace, name, interval, all_conditions, out))
        except KeyboardInterrupt:
            return
        except OperationError as error:
            fail(error)
        return
    try:
        body, events, children = asyncio.run(_snapshot(kubeconfig, context, namespace, name))
    except OperationError as error:
        fail(error)
    if emit(record(body), output):
        return
    if output == "wide":
        out.print(list_table([body], wide=True))
    else:
        out.print(resource_view(body, events, all_conditions=all_conditions, children=children))
    write_json(summary(body), json_path)


async def _watch(
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    name: str,
    interval: float,
    all_conditions: bool,
    out: Any,
) -> None:
    """The view again at every change of the resource or its Events (two watches, no polling; the
    serving objects are read again at each change)."""
    async with Cluster(kubeconfig, context) as cluster:
        updates = cluster.follow(namespace, name)
        body, events = await anext(updates)
        children = await cluster.children(namespace, name)

        def view(body: dict[str, Any], events: list[Any], children: list[dict[str, Any]]) -> Any:
            return resource_view(body, events, all_conditions=all_conditions, children=children)

        if not out.is_terminal:
            # Not a terminal: print the view again whenever it changes (like kubectl get -w).
            out.print(view(body, events, children))
            out.print()
            out.file.flush()
            async for body, events in updates:
                children = await cluster.children(namespace, name)
                out.print(view(body, events, children))
                out.print()
                out.file.flush()
            return
        with Live(view(body, events, children), console=out) as live:
            next_update = asyncio.ensure_future(anext(updates))
            try:
                while True:
                    done, _ = await asyncio.wait({next_update}, timeout=interval)
                    if done:
                        body, events = next_update.result()
                        children = await cluster.children(namespace, name)
                        next_update = asyncio.ensure_future(anext(updates))
                    live.update(view(body, events, children))
            finally:
                next_update.cancel()
                await updates.aclose()


@main.command("list", context_settings=CONTEXT_SETTINGS)
@namespace_option
@kubeconfig_option
@context_option
@click.option("-A", "--all-namespaces", is_flag=True, help="every namespace (adds a NAMESPACE column)")
@click.option(
    "-o", "--output", type=OUTPUTS, help="wide: every printer column; json|yaml: the summary records"
)
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
    if emit([record(b) for b in bodies], output):
        return
    out = console(stderr=json_path == "-")
    if bodies:
        out.print(list_table(bodies, wide=output == "wide", namespaces=all_namespaces))
    else:
        out.print("No resources found.")
    write_json([summary(b) for b in bodies], json_path)


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@namespace_option
@kubeconfig_option
@context_option
@click.option(
    "--timeout",
    default="0",
    show_default=True,
    metavar="DURATION",
    help="give up after this long (e.g. 30s, 10m; 0: wait for as long as it takes)",
)
@click.option(
    "-w", "--watch/--no-watch", default=True, show_default=True, help="wait; --no-watch answers now"
)
def status(
    name: str,
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
    timeout: str,
    watch: bool,
) -> None:
    """Wait until the resource is healthy and idle (exit 0); exit 1 at once on a rollback or a degraded
    state with nothing in progress, or when --timeout passes first (for CI, like kubectl argo
    rollouts status)."""
    try:
        limit = parse_duration(timeout) if timeout not in ("0", "") else None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--timeout") from None
    namespace = namespace or current_namespace(kubeconfig, context)
    try:
        code, line = asyncio.run(_status(kubeconfig, context, namespace, name, limit, watch))
    except OperationError as error:
        fail(error)
    if line:
        click.echo(line, err=code != 0)
    sys.exit(code)


async def _status(
    kubeconfig: str | None, context: str | None, namespace: str, name: str, limit: float | None, watch: bool
) -> tuple[int, str]:
    shown = None

    async def verdict() -> tuple[int, str]:
        nonlocal shown
        async with Cluster(kubeconfig, context) as cluster:
            async for body, _ in cluster.follow(namespace, name):
                word, why, done = settled(body)
                line = f"{word}: {why}"
                if done is not None:
                    return done, "" if line == shown else line
                if not watch:
                    return 1, f"{line} (not settled yet)"
                if line != shown:
                    click.echo(line)
                    shown = line
        return 1, "the watch ended"  # pragma: no cover (follow only ends by raising)

    try:
        return await asyncio.wait_for(verdict(), limit)
    except TimeoutError:
        return 1, f"timed out after {format_duration(limit or 0)}: {shown or 'nothing seen'}"


def settled(body: dict[str, Any]) -> tuple[str, str, int | None]:
    """The health word, why, and the exit status once settled (None: keep waiting)."""
    info = summary(body)
    word, why = health(info)
    status_block = body.get("status") or {}
    generation = body["metadata"].get("generation")
    observed = status_block.get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        return "Progressing", f"the operator has not seen generation {generation} yet", None
    if word == "RolledBack":
        return word, why, 1
    if word == "Degraded":
        moving = any(
            condition_level(c["type"], c["status"], c["reason"]) == IN_PROGRESS for c in info["conditions"]
        )
        return (word, why, None) if moving else (word, why, 1)
    if (
        word in ("Healthy", "Warning")
        and info["canary"] is None
        and not (info["retraining"] or {}).get("active")
    ):
        return word, why, 0
    return word, why, None


main.add_command(plan_command)
for _action in CANARY_OPERATIONS:
    main.add_command(gate_command(_action))


if __name__ == "__main__":
    main()
