"""What the per-step rank agreement of the preemption check costs: one all-reduce of one number per training batch
(`StopTogether`, in every fit, via the strategy's `reduce(flag, "max")`), with 1 and with 2 processes (gloo, the CPU
backend; NCCL on GPUs is faster still). With 1 process the strategy answers without a collective.

    python -m benchmarks.rank_agreement --calls 2000
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import emit, machine


def agree(world_size: int, rank: int, calls: int, port: int, results: "mp.Queue") -> None:  # pyright: ignore[reportInvalidTypeForm]
    if world_size > 1:
        os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    flag = torch.tensor(0, dtype=torch.int)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            if world_size > 1:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # what the strategy's reduce(flag, "max") runs
            else:
                bool(flag)
        times.append((time.perf_counter() - start) / calls)
    if rank == 0:
        results.put(min(times))
    if world_size > 1:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    emit(benchmark="rank_agreement", **machine(), calls=args.calls)
    ctx = mp.get_context("spawn")
    for world_size in (1, 2, 1, 2, 1, 2):
        results = ctx.Queue()
        procs = [
            ctx.Process(target=agree, args=(world_size, r, args.calls, args.port, results))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        seconds = results.get()
        for p in procs:
            p.join()
        emit(processes=world_size, us_per_step=round(seconds * 1e6, 1))


if __name__ == "__main__":
    main()
