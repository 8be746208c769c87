"""`specops local ...`: the local stack as commands (loaded by `specops` only when used).

- `up`: the emulated API server, Debian's Prometheus, simulated serving engines, a Job controller
  for training rounds and the operator, until Ctrl-C or SIGTERM; kubectl works against it with the
  kubeconfig it writes, and a timeline picture per resource is written when it stops.
- `load`: move the load a running `up` offers one resource's pods (its engines' schedules react).
- `demo`: the scripted scenario on a fresh stack, ending with a timeline picture.
- `reaction`: the reaction benchmark (arguments passed through).
- `soak`: the chaos soak: the stack under a seeded schedule of faults, invariants checked every tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import click
import yaml

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


@click.group(context_settings=CONTEXT_SETTINGS)
def local() -> None:
    """The local stack: an emulated Kubernetes API, Debian's Prometheus, simulated engines, the operator."""


def _require_prometheus() -> None:
    if shutil.which("prometheus") is None:
        raise click.ClickException(
            "Debian's prometheus is not installed; the local stack scrapes the simulated pods with the real "
            "one. Install it with: make prometheus (or: sudo apt-get install prometheus)"
        )


def write_examples(workdir: Path, prometheus_url: str, namespace: str) -> list[Path]:
    """The docs/examples resources pointed at the local Prometheus, with quick decisions, to apply."""
    from specops_local.stack import EXAMPLES, fast_resource

    out_dir = workdir / "examples"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for example in ("dense-70b-7b.yaml", "moe-expert-distilled.yaml"):
        if not (EXAMPLES / example).exists():
            continue
        body = fast_resource(
            example,
            prometheus_url=prometheus_url,
            namespace=namespace,
            interval="2s",
            baseline="10s",
            soak="10s",
        )
        path = out_dir / example
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        written.append(path)
    return written


DEFAULT_WORKDIR = Path(".specops-local")


def workdir_option(help_text: str) -> Any:
    """The ``--workdir`` of `up` and of the commands that reach the stack it started."""
    return click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_WORKDIR,
        show_default=True,
        help=help_text,
    )


def draw_timelines(recorder: Any, workdir: Path) -> list[Path]:
    """One timeline picture per recorded resource (PNG, with its HTML page and JSON beside it)."""
    from specops_local.timeline import render_html, render_png

    written = []
    for name, timeline in sorted(recorder.timelines.items()):
        if not timeline.samples:
            continue
        png = workdir / f"timeline-{name}.png"
        render_png(timeline, png, title="specops local up")
        render_html(timeline, png, png.with_suffix(".html"))
        png.with_suffix(".json").write_text(json.dumps(timeline.as_json(), indent=1) + "\n")
        written.append(png)
    return written


async def serve_until_stopped(workdir: Path, announce: Any) -> list[Path]:
    """Start the stack, announce where it is, record every resource's timeline, wait for
    SIGINT/SIGTERM, stop everything started; the timeline pictures written."""
    from specops_local.cluster import write_kubeconfig
    from specops_local.demo import DRAFTS, LOW
    from specops_local.recorder import TimelineRecorder
    from specops_local.stack import local_stack
    from specops_local.training import TRAIN_S
    from specops_local.upstream_crds import upstream_crd

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    training_crds = [
        upstream_crd("jobset.x-k8s.io", "JobSet"),
        upstream_crd("trainer.kubeflow.org", "TrainJob"),
    ]
    async with local_stack(
        workdir, load=LOW, drafts=dict(DRAFTS), train_s=TRAIN_S, extra_crds=training_crds
    ) as stack:
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", stack.cluster.url, stack.namespace)
        recorder = TimelineRecorder(stack)
        recording = loop.create_task(recorder.run(), name="timeline recorder")
        announce(stack, kubeconfig, write_examples(workdir, stack.prometheus.url, stack.namespace))
        # After the operator started: Kopf installs its own handlers, which would stop only the operator.
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(signum)
            click.echo("stopping the local stack...")
            recording.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recording
            with contextlib.suppress(Exception):  # a last sample: what happened since the previous one
                await recorder.sample()
            await recorder.close()
            recorder.finish()
    return draw_timelines(recorder, workdir)


@local.command(context_settings=CONTEXT_SETTINGS)
@workdir_option(
    "kubeconfig, Prometheus data, logs, ready-to-apply examples and the timeline pictures go here"
)
def up(workdir: Path) -> None:
    """Start the local stack and keep it up until Ctrl-C or SIGTERM.

    Writes WORKDIR/kubeconfig for kubectl (and kubectl specops), prints it with the Prometheus URL.
    Training Jobs (and JobSets, TrainJobs) of a retraining round run to completion with a trained
    draft. When it stops, it draws WORKDIR/timeline-NAME.png for each resource it served.
    """
    from specops_local.stack import API_SERVER_LOG, STACK_LOG, log_to_file

    _require_prometheus()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)

    def announce(stack: Any, kubeconfig: Path, examples: list[Path]) -> None:
        click.echo(f"kubeconfig: {kubeconfig}")
        click.echo(f"API server: {stack.cluster.url}")
        click.echo(f"Prometheus: {stack.prometheus.url}")
        click.echo(f"operator log: {workdir / 'operator.log'}")
        click.echo(f"API server log: {workdir / API_SERVER_LOG}")
        click.echo(f"engines log: {workdir / STACK_LOG}")
        click.echo("")
        click.echo(f"  export KUBECONFIG={kubeconfig}")
        for path in examples:
            click.echo(f"  kubectl apply -f {path}")
        click.echo("  kubectl get sdep")
        click.echo("  kubectl specops get llama-70b-chat --watch")
        workdir_option = "" if workdir == DEFAULT_WORKDIR.resolve() else f" --workdir {workdir}"
        click.echo(f"  specops local load llama-70b-chat --batch 300{workdir_option}   # past break-even")
        click.echo("")
        click.echo("Up. Ctrl-C (or SIGTERM) stops everything.", nl=True)
        sys.stdout.flush()

    pictures: list[Path] = []
    with log_to_file(workdir / "operator.log"), contextlib.suppress(KeyboardInterrupt):
        pictures = asyncio.run(serve_until_stopped(workdir, announce))
    for picture in pictures:
        click.echo(f"timeline: {picture}")
    click.echo("stopped.")


@local.command(context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@click.option(
    "--batch",
    type=click.FloatRange(min=0),
    required=True,
    help="requests each of the resource's simulated pods serves at once",
)
@click.option("-n", "--namespace", help="the resource's namespace (default: the kubeconfig's)")
@workdir_option("the directory `specops local up` was started with (its kubeconfig is there)")
def load(name: str, batch: float, namespace: str | None, workdir: Path) -> None:
    """Move the load a running `specops local up` offers NAME's pods to BATCH requests each.

    Sets the resource's local.specops.dev/batch annotation (kubectl annotate does the same); the
    stack follows it within a second, and the engines' schedules pick the K for the new batch.
    """
    from specops_local.stack import LOAD_ANNOTATION

    kubeconfig = workdir.resolve() / "kubeconfig"
    if not kubeconfig.is_file():
        raise click.ClickException(f"no local stack in {workdir}: start one with specops local up")
    if namespace is None:
        config = yaml.safe_load(kubeconfig.read_text()) or {}
        current = config.get("current-context")
        context: dict[str, Any] = next(
            (c["context"] for c in config.get("contexts") or [] if c.get("name") == current), {}
        )
        namespace = str(context.get("namespace") or "default")
    previous = asyncio.run(_annotate_load(kubeconfig, namespace, name, f"{batch:g}"))
    click.echo(f"{namespace}/{name}: {LOAD_ANNOTATION}={batch:g} (was {previous or 'the stack default'})")


async def _annotate_load(kubeconfig: Path, namespace: str, name: str, batch: str) -> str | None:
    """Set the load annotation; the value it replaces. One-line errors for what a person can fix."""
    import httpx

    from specops.adapters.kube import KubeClient, load_connection_settings
    from specops.api.models import API_VERSION, KIND
    from specops.ports import KubeApiError
    from specops_local.stack import LOAD_ANNOTATION

    kube = KubeClient(load_connection_settings(str(kubeconfig)))
    try:
        body = await kube.get(API_VERSION, KIND, namespace, name)
        if body is None:
            raise click.ClickException(f'speculativedeployment "{name}" not found in namespace {namespace}')
        await kube.patch(
            API_VERSION, KIND, namespace, name, {"metadata": {"annotations": {LOAD_ANNOTATION: batch}}}
        )
    except httpx.TransportError as error:
        raise click.ClickException(
            f"the local stack of {kubeconfig.parent} is not running: start it with specops local up"
        ) from error
    except KubeApiError as error:
        raise click.ClickException(str(error)) from error
    finally:
        await kube.close()
    return ((body.get("metadata") or {}).get("annotations") or {}).get(LOAD_ANNOTATION)


@local.command(context_settings=CONTEXT_SETTINGS)
@click.option("--fast", is_flag=True, help="shorter phases and holds (about 80 s instead of 100 s)")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="keep Prometheus data, operator.log and the timeline here (default: a temporary directory)",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("specops-demo.png"),
    show_default=True,
    help="the timeline picture (PNG; an HTML page is written beside it)",
)
@click.option("--live/--no-live", default=None, help="the live view (default: when stdout is a terminal)")
@click.option(
    "--backend",
    type=click.Choice(["triton", "trtllm-serve", "vllm", "sglang"]),
    default="triton",
    show_default=True,
    help="the serving engine the examples run on (simulated from the args and config files specops renders)",
)
def demo(fast: bool, workdir: Path | None, out: Path, live: bool | None, backend: str) -> None:
    """Run the scripted scenario: revision rollouts, load past break-even and back, a canary, a retraining round."""
    from specops_local.demo import run_demo

    try:
        result = asyncio.run(run_demo(fast=fast, workdir=workdir, picture=out, live=live, backend=backend))
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("Stopped.")
        sys.exit(130)
    sys.exit(result.exit_code)


@local.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
    short_help="the reaction benchmark (--help for its options)",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def reaction(args: tuple[str, ...]) -> None:
    """Seconds from load passing break-even until every engine drafts K=0, on the local stack."""
    from specops_local.reaction import main

    sys.exit(main(list(args)))


@local.command(context_settings=CONTEXT_SETTINGS)
@click.option("--seconds", type=float, default=3600.0, show_default=True, help="how long faults are injected")
@click.option("--seed", type=int, default=1, show_default=True, help="seed of the fault schedule")
@click.option(
    "--resources", type=click.IntRange(1, 4), default=3, show_default=True, help="SpeculativeDeployments"
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write the report as JSON here",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="keep Prometheus data and operator.log here (default: a temporary directory)",
)
def soak(seconds: float, seed: int, resources: int, json_out: Path | None, workdir: Path | None) -> None:
    """The chaos soak: API 5xx bursts and 429 storms, watch cuts, Prometheus down, engines exporting
    NaN, faulty pods, operator restarts, new drafts, reverts, deletions and retraining on the local
    stack, with the invariants checked every 2 s.

    Exit status 0 when faults were injected, invariants checked, and none was violated.
    """
    import json

    from specops_local.soak import SoakSettings, exit_code, run_soak, summary

    _require_prometheus()
    settings = SoakSettings(seconds=seconds, seed=seed, resources=resources)
    try:
        report = asyncio.run(run_soak(settings, workdir.resolve() if workdir else None))
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("Stopped.")
        sys.exit(130)
    click.echo(summary(report))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        click.echo(f"report: {json_out}")
    sys.exit(exit_code(report))
