"""The ring's W=2 off-diagonal block shapes on one GPU, through the engine's own SDPA ops: is a
(long Q x short K) block slower than the (short Q x long K) one of the same FLOPs? At W=2 with the
zigzag, rank 0's second step is Q 4K x K 8K and rank 1's is Q 8K x K 4K (at 16K total); the slower
sets the ring's time. Also the same work as two batch entries of 4K x 4K (K/V repeated), and the
diagonal's causal 8K x 8K. cuDNN forward + backward (LSE returned, as the ring calls it), bf16,
32 heads of 128, CUDA events, median of 20 after 5 warm-up, each shape in the same process.

    python bench/gpu/block_shapes.py 16384 32768     # total tokens; blocks are L/4 and L/2"""
import sys

import torch

from sweepbench.attention.ops import get_backend

H, D = 32, 128
be = get_backend("cudnn")
dev = torch.device("cuda")


def t(fn, n=20):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[n // 2]


def block(b, lq, lk, causal):
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(b, H, n, D, device=dev, dtype=torch.bfloat16, generator=g) for n in (lq, lk, lk))
    dout = torch.randn_like(q)
    out, lse, aux = be.forward(q, k, v, causal, D ** -0.5)
    fwd = lambda: be.forward(q, k, v, causal, D ** -0.5)  # noqa: E731
    bwd = lambda: be.backward(dout, q, k, v, out, lse, aux, causal, D ** -0.5)  # noqa: E731
    return t(fwd), t(bwd)


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for L in map(int, sys.argv[1:]):
    a, h = L // 4, L // 2
    for name, args in [(f"rank0 step1  Q {a} x K {h}", (1, a, h, False)), (f"rank1 step1  Q {h} x K {a}", (1, h, a, False)),
                       (f"2 x (Q {a} x K {a})", (2, a, a, False)), (f"diagonal causal {h} x {h}", (1, h, h, True)),
                       (f"T1 causal {L} x {L}", (1, L, L, True))]:
        f, b = block(*args)
        print(f"L={L} {name:32s} fwd {f:7.3f} ms  bwd {b:7.3f} ms  total {f + b:7.3f} ms", flush=True)
