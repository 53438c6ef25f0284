"""The bare baseline for bench/harness_overhead.py: one collective job under plain torchrun.

It runs exactly the benchmark code a sweepbench job runs, with no Hydra, no records, no wandb:
    torchrun --standalone --nproc-per-node 2 bench/bare_collective.py '{"benchmark": {...}}'"""

import json
import os
import sys

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from sweepbench.benchmarks.collective import CollectiveBenchmark, CollectiveConfig
from sweepbench.core import RankContext


def main() -> None:
    overrides = json.loads(sys.argv[1])
    cfg = OmegaConf.create({"benchmark": OmegaConf.merge(OmegaConf.structured(CollectiveConfig),
                                                          overrides["benchmark"])})
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    ctx = RankContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"),
                      backend="gloo", cfg=cfg)
    result = CollectiveBenchmark(ctx).run()
    assert result.verified
    if rank == 0:
        print(json.dumps(result.summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
