"""Run simulated engines for a local demo or `specops profile`.

    python -m specops_local.sim [--pods N] [--serving-profile NAME|FILE] [--restart-s S]
        [--file /etc/specops/engine/config.yaml=./config.yaml ...] -- trtllm-serve /models/target --config ...

Everything after ``--`` is the container's command and args, read as the real engine reads
them; ``--file MOUNTED=LOCAL`` puts a local file at the path the engine reads. Prints one line
per engine with its API and metrics URLs once it is ready, then serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from specops import profiles
from specops_local.sim.engines import EngineConfigError, SimEngine, launch
from specops_local.sim.load import LoadPoint, from_csv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specops_local.sim", description=__doc__)
    parser.add_argument("--pods", type=int, default=1)
    parser.add_argument("--name-prefix", default="sim")
    parser.add_argument("--file", action="append", default=[], metavar="MOUNTED=LOCAL")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--batch", type=float, default=16.0)
    parser.add_argument(
        "--alpha", type=float, default=None, help="acceptance (default: the profile's, else 0.8)"
    )
    parser.add_argument("--lossy", action="store_true", help="the draft's outputs diverge from the target's")
    parser.add_argument(
        "--restart-s", type=float, default=None, help="seconds to ready (default: the profile's)"
    )
    parser.add_argument("--trace", help="CSV load trace (t_seconds,batch,alpha[,context_tokens]); loops")
    parser.add_argument(
        "--serving-profile",
        metavar="NAME|FILE",
        help="serve this profile's step times (builtin: " + ", ".join(profiles.list_builtin()) + ")",
    )
    parser.add_argument("--noise-sigma", type=float, default=0.05)
    parser.add_argument("--batch-noise", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--realtime-generate",
        action="store_true",
        help="generate takes the engine's wall time at the batch in flight (for specops profile)",
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    return parser


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--{what} takes NAME=VALUE, got {item!r}")
        out[key] = value
    return out


async def _serve(args: argparse.Namespace, files: dict[str, str]) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    serving_profile = profiles.resolve(args.serving_profile) if args.serving_profile else None
    alpha = args.alpha
    if alpha is None:
        alpha = serving_profile.alpha if serving_profile and serving_profile.alpha is not None else 0.8
    engines: list[SimEngine] = []
    try:
        for index in range(args.pods):
            engines.append(
                launch(
                    f"{args.name_prefix}-{index}",
                    argv,
                    files=files,
                    env=_pairs(args.env, "env"),
                    serving_profile=serving_profile,
                    load=LoadPoint(batch=args.batch, alpha=alpha),
                    lossless=not args.lossy,
                    restart_s=args.restart_s,
                    noise_sigma=args.noise_sigma,
                    batch_noise=args.batch_noise,
                    seed=args.seed + index,
                    realtime_generate=args.realtime_generate,
                )
            )
    except EngineConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.trace:
        schedule = from_csv(args.trace, loop=True)
        for engine in engines:
            engine.set_schedule(schedule)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        for engine in engines:
            await engine.start()
        for engine in engines:
            await engine.wait_ready()
            print(
                f"{engine.name} {engine.backend} http={engine.url} metrics={engine.metrics_url}", flush=True
            )
        await stopping.wait()
    finally:
        for engine in engines:
            await engine.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    files = {mounted: Path(local).read_text() for mounted, local in _pairs(args.file, "file").items()}
    return asyncio.run(_serve(args, files))


if __name__ == "__main__":
    sys.exit(main())
