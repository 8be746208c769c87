"""The `specops` command: run the operator, plan drafts, benchmark, print the CRD, run the demo."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specops run", description="Run the operator (Kopf).")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    parser.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument(
        "--peering", action="store_true", help="use Kopf peering (several replicas); default: standalone"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    import logging

    import kopf

    import specops.handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        standalone=not args.peering,
        liveness_endpoint=args.liveness,
    )
    return 0


def _crd(argv: list[str]) -> int:
    from specops.api.crd import main

    return main(argv)


def _plan(argv: list[str]) -> int:
    from specops.plan import main

    return main(argv)


def _bench(argv: list[str]) -> int:
    from specops.bench import main

    return main(argv)


def _profile(argv: list[str]) -> int:
    from specops.profiling import main

    return main(argv)


CANARY_ANNOTATIONS: dict[str, dict[str, str | None]] = {
    "pause": {"specops.dev/canary-paused": "true"},
    "resume": {"specops.dev/canary-paused": None},
    "promote": {"specops.dev/canary-action": "promote", "specops.dev/canary-paused": None},
    "abort": {"specops.dev/canary-action": "abort", "specops.dev/canary-paused": None},
}


def _canary(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="specops canary",
        description="Manual canary gates: pause and resume judgement, promote now, or abort (roll back). "
        "They set the documented annotations; the operator acts at its next tick.",
    )
    parser.add_argument("action", choices=sorted(CANARY_ANNOTATIONS))
    parser.add_argument("name", help="SpeculativeDeployment name")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--kubeconfig", default=None, help="defaults to $KUBECONFIG, then ~/.kube/config")
    args = parser.parse_args(argv)
    return asyncio.run(set_canary_gate(args.action, args.name, args.namespace, args.kubeconfig))


async def set_canary_gate(action: str, name: str, namespace: str, kubeconfig: str | None = None) -> int:
    from specops.adapters.kube import KubeApiError, KubeClient, load_connection_settings
    from specops.api.models import API_VERSION, KIND

    kube = KubeClient(load_connection_settings(kubeconfig))
    try:
        body = await kube.get(API_VERSION, KIND, namespace, name)
        if body is None:
            print(f"error: speculativedeployment {namespace}/{name} not found", file=sys.stderr)
            return 1
        if not (body.get("status") or {}).get("canary") and action != "resume":
            print(f"error: {namespace}/{name} has no canary in progress", file=sys.stderr)
            return 1
        patch = {"metadata": {"annotations": CANARY_ANNOTATIONS[action]}}
        await kube.patch(API_VERSION, KIND, namespace, name, patch)
    except KubeApiError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        await kube.close()
    print(f"speculativedeployment {namespace}/{name}: canary {action} requested")
    return 0


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "run": (_run, "run the operator against the cluster in $KUBECONFIG or in-cluster"),
    "plan": (_plan, "size drafts and draft lengths with the performance model"),
    "bench": (_bench, "run benchmarks (policy, reaction, ...)"),
    "profile": (
        lambda argv: __import__("specops.profiling").profiling.main(argv),
        "measure a live engine's speedup curve",
    ),
    "canary": (_canary, "manual canary gates: pause | resume | promote | abort NAME"),
    "crd": (_crd, "print the CRD generated from the API models (or write it to FILE)"),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print("usage: specops COMMAND [ARGS]\n\ncommands:")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:<8} {help_text}")
        return 0 if args and args[0] in ("-h", "--help") else 2
    command, _ = COMMANDS[args[0]]
    return command(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
