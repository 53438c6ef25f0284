"""LoRA's q/k/v group at the 1B step's shapes (16384 tokens, width 2048, q 2048, k and v 512, rank 16
each, scale 2), forward and backward, as the engine runs it (``model._LoRAGroup``) against the
low-rank product carried inside the base GEMMs by widening them: forward, the input held as
[x | s x A^T] ([tokens, 2048 + 48]) and each weight as [W_i | B_i in layer i's rank columns, zeros
elsewhere], so y_i = [x | s xa] [W_i | B_i]^T is one GEMM and no low-rank product is written apart;
backward, the same widened weights give [g_i W_i | g_i B_i] from the input gradient's GEMMs, so
the products g_i B_i are not GEMMs of their own. Every variant checked against fp64 first. Device
time per call from a CUDA graph of 20 calls replayed 15 times (median, IQR, min, max of the
replays / 20), inputs rotated over 3 sets (together past L2).

    python kext_micro.py OUT.json"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from types import SimpleNamespace

import torch

from sweepbench.train.model import _LoRAGroup

T, D, R, S = 16384, 2048, 16, 2.0
OUTS = (2048, 512, 512)
dev = torch.device("cuda", 0)
bf = torch.bfloat16


def graph_time(fn, calls: int = 20, replays: int = 15) -> dict:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    q = statistics.quantiles(times, n=4)
    return {"median_us": statistics.median(times), "iqr_us": q[2] - q[0], "min_us": min(times), "max_us": max(times)}


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm()).item()


def main() -> None:
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, std=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * std).to(bf)

    ws = [rnd(o, D, std=0.02) for o in OUTS]
    as_ = [rnd(R, D, std=0.02) for _ in OUTS]
    bs = [rnd(o, R, std=0.05) for o in OUTS]
    params = [t for i in range(3) for t in (ws[i], as_[i], bs[i])]
    a_all = torch.cat(as_)
    width = 3 * R
    sets = []
    for _ in range(3):
        x = rnd(T, D)
        gs = [rnd(T, o) for o in OUTS]
        sets.append((x, gs))
    # fp64 references of the first set
    x0, g0 = sets[0]
    xd = x0.double()
    ref_y = [xd @ w.double().t() + S * (xd @ a.double().t()) @ b.double().t() for w, a, b in zip(ws, as_, bs)]
    ref_dx = sum(g.double() @ w.double() + S * (g.double() @ b.double()) @ a.double() for g, w, a, b in zip(g0, ws, as_, bs))
    ref_ga = [S * (g.double() @ b.double()).t() @ xd for g, b in zip(g0, bs)]
    ref_gb = [S * g.double().t() @ (xd @ a.double().t()) for g, a in zip(g0, as_)]

    # widened weights: [W_i | B_i in i's rank columns, zeros elsewhere], K = D + pad
    def widened(pad: int):
        wext = []
        for i, (w, o) in enumerate(zip(ws, OUTS)):
            e = torch.zeros(o, D + pad, device=dev, dtype=bf)
            e[:, :D] = w
            wext.append(e)
        tails = [wext[i][:, D + i * R : D + (i + 1) * R] for i in range(3)]
        xexts = [torch.zeros(T, D + pad, device=dev, dtype=bf) for _ in sets]
        for xe, (x, _) in zip(xexts, sets):
            xe[:, :D] = x  # what the norm kernel before would write
        return wext, tails, xexts

    rows = []

    def record(name, fn, check, *, it_sets):
        try:
            errs = check(fn(it_sets[0]))
            worst = max(errs.values())
            assert worst < 2e-2, errs
            cyc = itertools.cycle(it_sets)
            t = graph_time(lambda: fn(next(cyc)))
        except Exception as exc:  # noqa: BLE001 -- reported, the others go on
            row = {"variant": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        else:
            row = {"variant": name, "errors": errs, "time": t}
        rows.append(row)
        print(json.dumps(row), flush=True)

    def check_fwd(outs):
        return {f"y{i}": rel(o, r) for i, (o, r) in enumerate(zip(outs, ref_y))}

    # forward -----------------------------------------------------------------------------------
    def f_engine(st):
        with torch.no_grad():
            return _LoRAGroup.apply(st[0], (S, S, S), *params)

    record("fwd_engine", f_engine, check_fwd, it_sets=sets)

    def f_base(st):
        return [torch.mm(st[0], w.t()) for w in ws]

    record("fwd_base_only", f_base, lambda outs: {"y0_base": 0.0}, it_sets=sets)

    for pad, copy_tail in ((48, True), (64, True), (48, False)):
        wext, tails, xexts = widened(pad)
        for t, b in zip(tails, bs):
            t.copy_(b)
        nothing = torch.empty((), device=dev, dtype=bf)

        def f_kext(xe, wext=wext, tails=tails, copy_tail=copy_tail, nothing=nothing):
            if copy_tail:  # B changes every step: copied into the widened weights, one multi-tensor kernel
                torch._foreach_copy_(tails, bs)
            torch.addmm(nothing, xe[:, :D], a_all.t(), beta=0, alpha=S, out=xe[:, D : D + width])
            return [torch.mm(xe, w.t()) for w in wext]

        record(f"fwd_kext{pad}{'' if copy_tail else '_no_tail_copy'}", f_kext, check_fwd, it_sets=xexts)

    # q, k and v as one GEMM over the widened input (outputs as column blocks of [T, 3072])
    wext, tails, xexts = widened(48)
    for t, b in zip(tails, bs):
        t.copy_(b)
    wqkv = torch.cat(wext)
    nothing = torch.empty((), device=dev, dtype=bf)

    def f_qkv(xe):
        torch.addmm(nothing, xe[:, :D], a_all.t(), beta=0, alpha=S, out=xe[:, D : D + width])
        y = torch.mm(xe, wqkv.t())
        return list(torch.split(y, list(OUTS), dim=1))

    record("fwd_kext48_one_qkv_gemm", f_qkv, check_fwd, it_sets=xexts)

    def f_base_qkv(st):
        return torch.mm(st[0], torch.cat(ws).t())

    wcat = torch.cat(ws)
    record("fwd_base_only_one_qkv_gemm", lambda st: torch.mm(st[0], wcat.t()), lambda o: {"base": 0.0}, it_sets=sets)

    # backward ----------------------------------------------------------------------------------
    xa_sets = [st[0] @ a_all.t() for st in sets]
    needs = (True, False) + (False, True, True) * 3

    def check_bwd(out):
        dx, grads = out[0], out[2:]
        errs = {"dx": rel(dx, ref_dx)}
        for i in range(3):
            errs[f"gA{i}"] = rel(grads[3 * i + 1], ref_ga[i])
            errs[f"gB{i}"] = rel(grads[3 * i + 2], ref_gb[i])
        return errs

    eng_sets = [(st[0], st[1], xa) for st, xa in zip(sets, xa_sets)]

    def b_engine(st):
        x, gs, xa = st
        ctx = SimpleNamespace(saved_tensors=(x, xa, a_all, *params), scales=(S, S, S), needs_input_grad=needs)
        return _LoRAGroup.backward(ctx, *gs)

    record("bwd_engine", b_engine, check_bwd, it_sets=eng_sets)

    def b_base(st):
        x, gs, _ = st
        dx = torch.mm(gs[2], ws[2])
        dx.addmm_(gs[1], ws[1])
        return dx.addmm_(gs[0], ws[0])

    record("bwd_base_only", b_base, lambda o: {"base": 0.0}, it_sets=eng_sets)

    for pad in (48, 64):
        wext, tails, xexts = widened(pad)
        for t, b in zip(tails, bs):
            t.copy_(b)
        for xe, xa in zip(xexts, xa_sets):
            xe[:, D : D + width] = (S * xa.float()).to(bf)  # the forward's s x A^T, as kept
        nothing = torch.empty((), device=dev, dtype=bf)
        bsets = [(xe, st[1]) for xe, st in zip(xexts, sets)]

        def b_next(st, wext=wext, nothing=nothing):
            xe, gs = st
            # [dx_base | g B] over the widened weights, the widest GEMM last
            dxe = torch.mm(gs[2], wext[2])
            dxe.addmm_(gs[1], wext[1])
            dxe.addmm_(gs[0], wext[0])
            gb_all = dxe[:, D : D + width]  # g_i B_i in i's columns (s not yet applied)
            grad_a_all = torch.addmm(nothing, gb_all.t(), xe[:, :D], beta=0, alpha=S)
            grads_b = [torch.mm(g.t(), xe[:, D + i * R : D + (i + 1) * R]) for i, g in enumerate(gs)]
            dx = dxe[:, :D].addmm_(gb_all, a_all, alpha=S)
            out = [dx, None]
            for i in range(3):
                out += [None, grad_a_all[i * R : (i + 1) * R], grads_b[i]]
            return out

        record(f"bwd_next{pad}", b_next, check_bwd, it_sets=bsets)

    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    for r in rows:
        if "time" in r:
            print(f"{r['variant']:32s} {r['time']['median_us']:9.3f} us  (IQR {r['time']['iqr_us']:.3f})")


if __name__ == "__main__":
    main()
