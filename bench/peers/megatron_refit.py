"""megatron-core's refit timed without sweepbench: the standalone twin of ``benchmark.impl=megatron``.

Two cases on 2 ranks, llama3_8b's shape by default (32 layers, hidden 4096, 32 heads, 8 KV heads,
FFN 14336, vocab 128256, bf16, max sequence 8192), GPTModel with megatron's local layer spec
(no Transformer Engine), refit by ``megatron.core.resharding.refit.swap_model_weights`` with the
``nccl`` copy service (gloo on CPU):
  - tp2->tp1 collocated: the training model tp2 on ranks 0,1; the inference model tp1 on each
    rank (dp2), as sweepbench's ``experiment=tp2-tp1`` lays it out;
  - tp1->tp1 non-collocated: training on rank 0, inference on rank 1 (``mode=non_collocated``).

Timed region, exactly the harness's (sweepbench.measure.timing._time_cuda): per iteration, the
inference weights are poisoned with NaN (untimed), then ``torch.cuda.synchronize(); barrier;``
start event, ``swap_model_weights(...)``, end event, ``end.synchronize()``; the iteration's time
is the slowest rank's event time (all_reduce MAX), after 2 warm-up iterations (poison, swap,
check, untimed), 10 timed. The host wall clock of the same region (barrier exit to
``end.synchronize()`` return, slowest rank) is kept as a second column. After every iteration
each inference parameter is checked to hold its training value (each parameter is filled with
one constant of its own, exact in bf16), so a swap that moved nothing fails. On CPU (gloo,
``--device cpu``) the events are replaced by the host clock, as the harness does.

    torchrun --nproc-per-node 2 bench/peers/megatron_refit.py --out megatron_twin.csv            # 2 GPUs
    torchrun --nproc-per-node 2 bench/peers/megatron_refit.py --device cpu --tiny --out t.csv    # CPU check
    torchrun --nproc-per-node 1 bench/peers/megatron_refit.py --cases "tp1->tp1 collocated" --out t.csv  # 1 GPU

megatron-core 0.16.1's GlooCopyService makes a CUDA stream in its constructor, so on a CPU-only
torch a subclass without the stream is used (as sweepbench's peer does)."""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
import types
import zlib
from importlib.metadata import version

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.resharding.copy_services.gloo_copy_service import GlooCopyService
from megatron.core.resharding.refit import swap_model_weights
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig

LLAMA3_8B = dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                 vocab_size=128256, seq_len=8192, dtype=torch.bfloat16)
TINY = dict(num_layers=4, hidden_size=64, num_heads=8, num_kv_heads=8, ffn_hidden_size=256, vocab_size=512,
            seq_len=128, dtype=torch.float32)
# name -> (training tp, its ranks, inference tp, its ranks)
CASES = {"tp2->tp1 collocated": (2, [0, 1], 1, [0, 1]), "tp1->tp1 non-collocated": (1, [0], 1, [1]),
         "tp1->tp1 collocated": (1, [0], 1, [0])}  # the one-GPU case (--nproc-per-node 1)
_GROUPS: dict[tuple[int, ...], object] = {}


def group(ranks: list[int]) -> object:
    """One communicator per rank set (every rank calls this in the same order)."""
    key = tuple(sorted(ranks))
    if key == tuple(range(dist.get_world_size())):
        return dist.group.WORLD
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(key))
    return _GROUPS[key]


def pg_collection(tp: int, ranks: list[int]) -> ProcessGroupCollection | None:
    """megatron's groups for a tp x dp layout on ``ranks`` (tp fastest); None off the layout."""
    me = dist.get_rank()
    tp_sets = [ranks[i:i + tp] for i in range(0, len(ranks), tp)]
    dp_sets = [ranks[t::tp] for t in range(tp)]
    single = [[r] for r in ranks]
    spans = {"tp": tp_sets, "cp": single, "pp": single, "ep": single, "dp": dp_sets, "tp_cp": tp_sets,
             "mp": tp_sets, "tp_ep": tp_sets, "tp_ep_pp": tp_sets, "dp_cp": dp_sets, "tp_dp_cp": [ranks],
             "expt_tp": tp_sets, "expt_dp": dp_sets, "embd": single, "pos_embd": single}
    pgs = ProcessGroupCollection()
    for name, sets in spans.items():
        mine = None
        for s in sets:
            g = group(s)
            mine = g if me in s else mine
        setattr(pgs, name, mine)
    return pgs if me in ranks else None


def keep(weight: torch.Tensor) -> None:
    """An init_method that leaves the weight alone (the harness fills the weights itself)."""


def build(shape: dict, tp: int, ranks: list[int], device: torch.device) -> torch.nn.Module:
    pgs = pg_collection(tp, ranks)
    config = TransformerConfig(
        num_layers=shape["num_layers"], hidden_size=shape["hidden_size"], num_attention_heads=shape["num_heads"],
        num_query_groups=shape["num_kv_heads"], ffn_hidden_size=shape["ffn_hidden_size"],
        kv_channels=shape["hidden_size"] // shape["num_heads"], tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=1, expert_model_parallel_size=1, context_parallel_size=1,
        params_dtype=shape["dtype"], pipeline_dtype=shape["dtype"], normalization="RMSNorm",
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=device.type != "cuda", perform_initialization=True,
        init_method=keep, output_layer_init_method=keep, embedding_init_method=keep)
    if pgs is None:  # a rank that holds no part of this model (non-collocated)
        absent = torch.nn.Module()
        # every model-parallel group absent: megatron-core 0.19 reads tp, pp and ep for its plan's key
        absent.config = config
        absent.pg_collection = types.SimpleNamespace(tp=None, pp=None, ep=None, dp=dist.group.WORLD)
        return absent
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=shape["vocab_size"], max_sequence_length=shape["seq_len"], pre_process=True,
                     post_process=True, share_embeddings_and_output_weights=False,
                     position_embedding_type="rope", pg_collection=pgs)
    return model.to(device)


def value_of(name: str) -> float:
    return (zlib.crc32(name.encode()) % 255 + 1) / 256  # exact in bf16


class HostGlooCopyService(GlooCopyService):
    """GlooCopyService without the CUDA stream its constructor makes (CPU-only torch)."""

    def __init__(self) -> None:  # noqa: D107
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.gloo_pg = dist.new_group(backend="gloo")
        self.send_ops, self.recv_ops, self._copy_stream = [], [], None


def time_case(shape: dict, case: tuple, *, device: torch.device, service: object, warmup: int,
              iters: int) -> tuple[list[float], list[float]]:
    src_tp, src_ranks, dst_tp, dst_ranks = case
    src, dst = build(shape, src_tp, src_ranks, device), build(shape, dst_tp, dst_ranks, device)
    with torch.no_grad():
        for name, p in src.named_parameters():
            p.fill_(value_of(name))

    def poison() -> None:
        with torch.no_grad():
            for p in dst.parameters():
                p.fill_(float("nan"))

    def check() -> None:
        for name, p in dst.named_parameters():
            if not bool((p == value_of(name)).all()):
                raise AssertionError(f"rank {dist.get_rank()}: {name} does not hold its training value")

    step = lambda: swap_model_weights(src, dst, refit_method=service)  # noqa: E731
    for _ in range(warmup):
        poison(), step(), check()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    times, walls = [], []
    for _ in range(iters):
        poison()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
        dist.barrier()
        tic = time.perf_counter()
        if cuda:
            start.record()
        step()
        if cuda:
            end.record()
            end.synchronize()
        walls.append(time.perf_counter() - tic)
        times.append(start.elapsed_time(end) / 1e3 if cuda else walls[-1])
        check()
    t = torch.tensor([times, walls], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank, iteration by iteration
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    return t[0].tolist(), t[1].tolist()


def iqr(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="CSV, one row per case (written by rank 0)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny fp32 shape (CPU check)")
    parser.add_argument("--num-layers", type=int, help="override the shape's layer count")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--cases", default="tp2->tp1 collocated,tp1->tp1 non-collocated",
                        help=f"comma-separated, of: {', '.join(CASES)}")
    args = parser.parse_args()
    cases = args.cases.split(",")
    if unknown := [c for c in cases if c not in CASES]:
        parser.error(f"unknown case(s) {unknown}; valid: {', '.join(CASES)}")
    shape = dict(TINY if args.tiny else LLAMA3_8B)
    if args.num_layers:
        shape["num_layers"] = args.num_layers
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    need = 1 + max(r for c in cases for r in CASES[c][1] + CASES[c][3])
    assert dist.get_world_size() == need, f"run with torchrun --nproc-per-node {need} for {cases}"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda:  # megatron's GPU init path forks the tracker's states: seed it once (no value is drawn)
        model_parallel_cuda_manual_seed(1234, tp_rank=0, ep_rank=0, etp_rank=0)
    service = "nccl" if cuda else HostGlooCopyService()
    rows = []
    try:
        for name in cases:
            case = CASES[name]
            times, walls = time_case(shape, case, device=device, service=service, warmup=args.warmup,
                                     iters=args.iters)
            row = {"case": name, "num_layers": shape["num_layers"], "hidden_size": shape["hidden_size"],
                   "dtype": str(shape["dtype"]).removeprefix("torch."), "device": args.device,
                   "megatron_core": version("megatron-core"), "torch": torch.__version__,
                   "warmup": args.warmup, "iters": args.iters, "median_s": statistics.median(times),
                   "iqr_s": iqr(times), "min_s": min(times), "max_s": max(times),
                   "median_wall_s": statistics.median(walls), "iqr_wall_s": iqr(walls),
                   "times_s": ";".join(f"{x:.6g}" for x in times), "wall_times_s": ";".join(f"{x:.6g}" for x in walls)}
            rows.append(row)
            if dist.get_rank() == 0:
                print(f"{name}: median {row['median_s'] * 1e3:.2f} ms (IQR {row['iqr_s'] * 1e3:.2f} ms; "
                      f"host wall {row['median_wall_s'] * 1e3:.2f} ms), slowest rank, {args.iters} timed "
                      f"after {args.warmup} warm-up", flush=True)
        if dist.get_rank() == 0:
            tmp = f"{args.out}.tmp"
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            os.replace(tmp, args.out)
        dist.barrier()  # no rank tears its pairs down while a peer is still in the last collective
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
