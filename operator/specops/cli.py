"""The `specops` command: run the operator, plan drafts, benchmark, print the CRD, run the demo."""

from __future__ import annotations

import argparse
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


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "run": (_run, "run the operator against the cluster in $KUBECONFIG or in-cluster"),
    "plan": (_plan, "size drafts and draft lengths with the performance model"),
    "bench": (_bench, "run benchmarks (policy, reaction, ...)"),
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
