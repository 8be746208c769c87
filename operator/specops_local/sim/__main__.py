"""Run simulated pods for a local demo: `python -m specops_local.sim --pods 2 --batch 16 --alpha 0.8`.

With `--serving-profile NAME|FILE` the pods serve a profile's step times (a builtin name
from specops.profiles or a profile JSON file) instead of the roofline.

Prints one line per pod with its Triton HTTP and metrics addresses, then serves
until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from specops import profiles
from specops.domain import perf
from specops_local.sim.load import LoadPoint, from_csv
from specops_local.sim.pod import SimPod


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specops_local.sim", description=__doc__)
    parser.add_argument("--pods", type=int, default=1)
    parser.add_argument("--name-prefix", default="sim")
    parser.add_argument("--gpu", choices=sorted(perf.GPUS), default="H100")
    parser.add_argument("--target-params", type=float, default=70e9)
    parser.add_argument("--draft-params", type=float, default=1e9)
    parser.add_argument("--tensor-parallel", type=int, default=4)
    parser.add_argument("--efficiency", type=float, default=0.5, help="fraction of peak the kernels reach")
    parser.add_argument("--max-draft-len", type=int, default=8)
    parser.add_argument("--draft-length", type=int, default=4, help="initial BLS default num_draft_tokens")
    parser.add_argument("--batch", type=float, default=16.0)
    parser.add_argument(
        "--alpha", type=float, default=None, help="per-token acceptance (default: the profile's, else 0.8)"
    )
    parser.add_argument("--context-tokens", type=float, default=0.0)
    parser.add_argument("--trace", help="CSV load trace (t_seconds,batch,alpha[,context_tokens]); loops")
    parser.add_argument("--profile", choices=("triton", "vllm"), default="triton", help="metric names")
    parser.add_argument(
        "--serving-profile",
        metavar="NAME|FILE",
        help="serve this serving profile's step times (builtin: " + ", ".join(profiles.list_builtin()) + ")",
    )
    parser.add_argument("--noise-sigma", type=float, default=0.05)
    parser.add_argument("--batch-noise", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--realtime-generate",
        action="store_true",
        help="generate takes the engine's wall time at the batch in flight (for specops profile)",
    )
    return parser


async def _serve(args: argparse.Namespace) -> None:
    setup = perf.ModelSetup(
        gpu=perf.GPUS[args.gpu],
        target_params=args.target_params,
        draft_params=args.draft_params,
        tensor_parallel=args.tensor_parallel,
        efficiency=args.efficiency,
    )
    serving_profile = profiles.resolve(args.serving_profile) if args.serving_profile else None
    alpha = args.alpha
    if alpha is None:
        alpha = serving_profile.alpha if serving_profile and serving_profile.alpha is not None else 0.8
    load = LoadPoint(batch=args.batch, alpha=alpha, context_tokens=args.context_tokens)
    pods = [
        SimPod(
            f"{args.name_prefix}-{index}",
            setup,
            max_draft_len=args.max_draft_len,
            draft_length=args.draft_length,
            load=load,
            noise_sigma=args.noise_sigma,
            batch_noise=args.batch_noise,
            seed=args.seed + index,
            profile=args.profile,
            serving_profile=serving_profile,
            realtime_generate=args.realtime_generate,
        )
        for index in range(args.pods)
    ]
    if args.trace:
        schedule = from_csv(args.trace, loop=True)
        for pod in pods:
            pod.set_schedule(schedule)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        for pod in pods:
            await pod.start()
            print(f"{pod.name} http={pod.url} metrics={pod.metrics_url}", flush=True)
        await stopping.wait()
    finally:
        for pod in pods:
            await pod.stop()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
