"""LoRA backward's A and B gradients on a side stream, against all on one stream: 16 layers of
(q/k/v group backward, a frozen MLP-sized GEMM, o group backward, another), 1B shapes."""
import json
import sys

import torch

torch.manual_seed(0)
dev, bf = "cuda", torch.bfloat16
T, d, r, F_ = 16384, 2048, 16, 8192
s = 2.0
side = torch.cuda.Stream()


def group(outs):
    W = [torch.randn(o, d, device=dev, dtype=bf) * 0.02 for o in outs]
    A = [torch.randn(r, d, device=dev, dtype=bf) * 0.02 for o in outs]
    B = [torch.randn(o, r, device=dev, dtype=bf) * 0.02 for o in outs]
    x = torch.randn(T, d, device=dev, dtype=bf)
    a_all = torch.cat(A)
    xa_all = x @ a_all.t()
    g = [torch.randn(T, o, device=dev, dtype=bf) for o in outs]
    return dict(W=W, A=A, B=B, x=x, a_all=a_all, xa_all=xa_all, g=g)


def bwd(G, mode):
    x, xa_all, a_all, W, B, g = G["x"], G["xa_all"], G["a_all"], G["W"], G["B"], G["g"]
    n = len(W)
    gxa_all = torch.empty_like(xa_all)
    for i in range(n):
        torch.addmm(x.new_empty(()), g[i], B[i], beta=0, alpha=s, out=gxa_all[:, i * r:(i + 1) * r])
    if mode == "one":
        gb = [torch.addmm(x.new_empty(()), g[i].t(), xa_all[:, i * r:(i + 1) * r], beta=0, alpha=s) for i in range(n)]
        ga = gxa_all.t() @ x
    else:
        gb = [torch.empty_like(b) for b in B]
        ga = torch.empty(a_all.shape, device=dev, dtype=bf)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(n):
                torch.addmm(x.new_empty(()), g[i].t(), xa_all[:, i * r:(i + 1) * r], beta=0, alpha=s, out=gb[i])
            torch.mm(gxa_all.t(), x, out=ga)
    dx = torch.mm(gxa_all, a_all)
    order = sorted(range(n), key=lambda i: W[i].shape[0])
    for i in order:
        dx.addmm_(g[i], W[i])
    if mode == "wait":
        torch.cuda.current_stream().wait_stream(side)
    return dx, ga, gb


qkv, o = group([2048, 512, 512]), group([2048])
h = torch.randn(T, F_, device=dev, dtype=bf)
wmlp = torch.randn(F_, d, device=dev, dtype=bf) * 0.02


def step(mode):
    for _ in range(16):
        bwd(o, mode)
        h @ wmlp  # stand-in for the MLP/attention backward between the groups (a big GEMM)
        bwd(qkv, mode)
        h @ wmlp
    if mode == "defer":
        torch.cuda.current_stream().wait_stream(side)


def check():
    ref = bwd(qkv, "one")
    for m in ("wait", "defer"):
        got = bwd(qkv, m)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip([ref[0], ref[1], *ref[2]], [got[0], got[1], *got[2]]))
        print(m, "max abs diff against one stream:", diff)
        assert diff == 0.0, m


def t(mode, n):
    for _ in range(3):
        step(mode)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        step(mode)
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / n


def alone():
    """the side work alone (what the overlap could hide), and the main work alone"""
    out = {}
    for name, fn in (("ab_grads", lambda G: ([torch.addmm(G["x"].new_empty(()), G["g"][i].t(), G["xa_all"][:, i*r:(i+1)*r], beta=0, alpha=s) for i in range(len(G["W"]))], G["xa_all"].t() @ G["x"])),):
        def run():
            for _ in range(16):
                fn(o); fn(qkv)
        for _ in range(3): run()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(20): run()
        e1.record(); e1.synchronize()
        out[name] = e0.elapsed_time(e1) / 20
    return out


check()
res = {m: [] for m in ("one", "wait", "defer")}
for rnd in range(5):
    for m in (("one", "wait", "defer") if rnd % 2 == 0 else ("defer", "wait", "one")):
        res[m].append(t(m, 20))
res["alone_ms_per_16_layers"] = alone()
for k, v in res.items():
    print(k, v)
json.dump(res, open(sys.argv[1], "w"), indent=1)
