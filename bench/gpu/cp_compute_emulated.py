"""One rank's compute schedule of a W-rank context-parallel impl, on ONE GPU: the impl runs as rank RANK_EMU of
W with LocalComm (local copies where bytes would cross ranks), so where only one GPU is lent the compute side
of a W-rank step (kernels, merges, casts, launches) is measured; communication and its overlap are not.
Timed with CUDA events (median of 10 after 3 warm-up), against T1 = the whole sequence on cuDNN; writes a
torch.profiler trace per impl (summarise with bench/gpu/trace_top.py).

    python bench/gpu/cp_compute_emulated.py SEQ OUT_DIR ring,ulysses      # env: W (2), KVH (32), RANK_EMU (0),
                                                                          # NO_TRACE (1: no profiled step),
                                                                          # FUSED_MERGE (1: the LSE merge compiled)
FUSED_MERGE=1 swaps the engine's LSE merge (``accum.merge_``: a Triton kernel on CUDA since b968306, two eager
passes before) for the same fp32 math compiled by torch.compile (one kernel reads both outputs and
writes ``out``), as measured in docs/results/ring_views_h100 and merge_kernel_h100. The engine does not use it:
torch.compile cost each process 4-12 s.

The forward output is not verified here: LocalComm results are wrong by design (see attention/comm.py);
the verified numbers come from the sweep (benchmark=attention)."""
import os, sys, time, torch
from torch.profiler import profile, ProfilerActivity
from sweepbench.attention.api import cp_attention
from sweepbench.attention.comm import LocalComm
from sweepbench.attention.placement import shard_sequence
from sweepbench.attention.registry import get_impl
from sweepbench.attention.scaling import make_inputs, Shape
from sweepbench.attention.ops import sdpa_attention
if os.environ.get("FUSED_MERGE"):
    from sweepbench.attention import accum
    def one_pass(out, lse, block_out, block_lse):
        w = torch.sigmoid(block_lse - lse).unsqueeze(-1)
        out.copy_(block_out.float() * w + out.float() * (1 - w))
        lse.copy_(torch.logaddexp(lse, block_lse))
    accum.merge_ = torch.compile(one_pass, dynamic=True, fullgraph=True)
seq, out_dir, impls = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
W, kvh, rank = int(os.environ.get("W", "2")), int(os.environ.get("KVH", "32")), int(os.environ.get("RANK_EMU", "0"))
dev = torch.device("cuda")
inp = make_inputs(Shape(1, 32, kvh, seq, 128), dtype=torch.bfloat16, device=dev, seed=0)
def timeit(step, n=10):
    for _ in range(3): step()
    torch.cuda.synchronize(); s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); step(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts) // 2]
q, k, v = [x.detach().clone().requires_grad_() for x in inp[:3]]
def t1():
    for x in (q, k, v): x.grad = None
    sdpa_attention(q, k, v, backend="cudnn", causal=True, scale=128 ** -0.5).backward(inp[3])
for be in ("cudnn",) if os.environ.get("NO_FLASH_T1") else ("cudnn", "flash"):
    def t1b(be=be):
        for x in (q, k, v): x.grad = None
        sdpa_attention(q, k, v, backend=be, causal=True, scale=128 ** -0.5).backward(inp[3])
    print(f"T1 {be} seq={seq} kvh={kvh}: {timeit(t1b):.2f} ms", flush=True)
t1ms = timeit(t1)
comm = LocalComm.__new__(LocalComm); comm.group, comm.rank, comm.size = None, rank, W
for impl in impls:
    spec = get_impl(impl)
    mine = [shard_sequence(x, dim=2, rank=rank, world_size=W, placement=spec.placement) for x in inp]
    leaves = [x.detach().clone().requires_grad_() for x in mine[:3]]
    def step():
        for x in leaves: x.grad = None
        cp_attention(*leaves, impl=impl, causal=True, sdpa_backend="cudnn", comm=comm).backward(mine[3])
    tic = time.perf_counter(); step(); torch.cuda.synchronize()  # first call: cuDNN plans, compiled merges
    first = time.perf_counter() - tic
    ms = timeit(step)
    print(f"{impl} W={W} rank{rank} seq={seq} kvh={kvh}: first step {first:.2f} s", flush=True)
    print(f"{impl} W={W} rank{rank} seq={seq} kvh={kvh}: compute-only {ms:.2f} ms; ideal T1/W {t1ms / W:.2f} ms; "
          f"compute efficiency {t1ms / W / ms:.3f}", flush=True)
    if os.environ.get("NO_TRACE"):
        continue
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(); torch.cuda.synchronize()
    prof.export_chrome_trace(f"{out_dir}/{impl}_{seq}_kv{kvh}.pt.trace.json.gz")
