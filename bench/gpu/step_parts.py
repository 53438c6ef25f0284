"""Parts of a fused fine-tune step, timed alone on one GPU: liger-kernel's fused linear
cross-entropy at several chunk sizes (its ``chunk_mem_const``) with the output weight frozen (LoRA)
and trained (full fine-tune); a residual add followed by RMSNorm: liger's, liger's fused add + RMSNorm,
and torch's (the train engine's);
causal GQA attention through each SDPA backend as the decoder calls it. Each variant's forward +
backward is checked against a reference before it is timed (the loss and the input's gradient
against the unchunked logits in fp32; the fused norm's outputs and gradients against the unfused
pair; attention against fp32 softmax attention on the first batch row); one JSON line per variant,
all lines in OUT.json. LoRA's adapters (``--only lora``): see :func:`lora_rows`.

    python bench/gpu/step_parts.py OUT.json [--iters 20] [--only flce,add_norm,attention,lora]

Shapes: 16384 tokens (micro-batch 4 x seq 4096); hidden 2048 / vocabulary 128256 (Llama-3.2-1B) and
hidden 4096 / vocabulary 32000 (Mistral-7B)."""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

TOKENS = 16384
SHAPES = {"llama3_1b": (2048, 128256), "mistral_7b": (4096, 32000)}


def timed(fn, iters: int) -> dict[str, float]:
    """3 warm-up calls, then ``iters`` device-timed ones, through the harness's own timer and summary."""
    from sweepbench.measure.stats import summarize
    from sweepbench.measure.timing import time_iterations

    stats = summarize(time_iterations(fn, warmup=3, iters=iters, device=torch.device("cuda", 0)))
    return {f"{k}_ms": stats[f"{k}_s"] * 1e3 for k in ("median", "iqr", "min", "max")}


def flce_rows(iters: int) -> list[dict]:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy as flce

    from sweepbench.train.fused import chunk_mem_const

    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for model, (hidden, vocab) in SHAPES.items():
        h = (torch.randn(TOKENS, hidden, device="cuda", generator=g) * 0.5).bfloat16().requires_grad_()
        w = (torch.randn(vocab, hidden, device="cuda", generator=g) * hidden**-0.5).bfloat16()
        y = torch.randint(0, vocab, (TOKENS,), device="cuda", generator=g)
        ref_loss = F.cross_entropy(h.float() @ w.float().t(), y)
        (ref_grad,) = torch.autograd.grad(ref_loss, h)
        ours = chunk_mem_const(TOKENS, hidden, vocab)
        for trained in (False, True):
            w.requires_grad_(trained)
            for const in sorted({1, 2, 4, 8, 16, ours}):
                h.grad = w.grad = None
                loss = flce(h, w, y, chunk_mem_const=const)
                loss.backward()
                loss_err = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
                grad_err = ((h.grad.float() - ref_grad).norm() / ref_grad.norm()).item()
                assert loss_err < 5e-3 and grad_err < 3e-2, (model, const, loss_err, grad_err)

                def step(const=const):
                    h.grad = w.grad = None
                    flce(h, w, y, chunk_mem_const=const).backward()

                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                r = timed(step, iters)
                rows.append({"part": "fused_linear_cross_entropy", "model": model, "weight_trained": trained,
                             "chunk_mem_const": const, "ours": const == ours, "loss_rel_err": loss_err,
                             "grad_rel_err": grad_err, "peak_extra_gib": (torch.cuda.max_memory_allocated() - base) / 2**30,
                             **r})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def add_norm_rows(iters: int) -> list[dict]:
    """The residual add and the RMSNorm that reads its sum, forward and backward: liger's norm after a
    torch add (unfused), liger's fused kernel (fused), torch's add and fused RMSNorm (torch, the train
    engine's unfused model) and the engine's own kernels (kernel: fused=liger's blocks); the weight
    trained (a full fine-tune) or frozen (LoRA)."""
    from liger_kernel.transformers.functional import liger_fused_add_rms_norm
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    from sweepbench.train.add_norm_kernel import AddRMSNorm

    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    for model, (hidden, _) in SHAPES.items():
        x = torch.randn(4, 4096, hidden, device="cuda", generator=g).bfloat16().requires_grad_()
        a = torch.randn(4, 4096, hidden, device="cuda", generator=g).bfloat16().requires_grad_()
        dn = torch.randn(4, 4096, hidden, device="cuda", generator=g).bfloat16()
        dh = torch.randn(4, 4096, hidden, device="cuda", generator=g).bfloat16()
        norm = LigerRMSNorm(hidden, eps=1e-5).cuda().bfloat16()
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5, generator=g)

        def unfused():
            h = x + a
            return norm(h), h

        def fused():
            return liger_fused_add_rms_norm(a, x, norm.weight, norm.variance_epsilon, in_place=False)

        def plain():
            h = x + a
            return F.rms_norm(h, (hidden,), norm.weight, norm.variance_epsilon), h

        def kernel():
            return AddRMSNorm.apply(x, a, norm.weight, norm.variance_epsilon)

        variants = (("unfused", unfused), ("fused", fused), ("torch", plain), ("kernel", kernel))
        for trained in (True, False):
            norm.weight.requires_grad_(trained)
            wrt = (x, a, norm.weight) if trained else (x, a)
            grads = {}
            for name, fn in variants:
                n, h = fn()
                # liger's norms write the input's gradient over the incoming one: each gets a copy
                grads[name] = [n, h, *torch.autograd.grad((n, h), wrt, (dn.clone(), dh.clone()))]
            errs = {name: max(((u.float() - f.float()).norm() / u.float().norm()).item()
                              for u, f in zip(grads["unfused"], grads[name])) for name, _ in variants}
            assert max(errs.values()) < 1e-2, errs
            for name, fn in variants:
                def step(fn=fn):
                    n, h = fn()
                    torch.autograd.backward((n, h), (dn.clone(), dh.clone()))

                rows.append({"part": "add_rms_norm", "model": model, "variant": name,
                             "weight": "trained" if trained else "frozen", "max_rel_err": errs[name],
                             **timed(step, iters)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def attention_rows(iters: int) -> list[dict]:
    """q [B, H, S, D], k/v [B, KV, S, D] as the decoder hands them to SDPA (llama3_1b: 32 heads, 8 kv
    heads, head dim 64), causal, each backend alone; and cuDNN with k/v expanded to every head."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, heads, kv, s, d = 4, 32, 8, 4096, 64
    g = torch.Generator(device="cuda").manual_seed(2)
    # made [B, S, H, D] and seen through transpose(1, 2), as the decoder's projections are
    q, k, v, do = (
        torch.randn(b, s, n, d, device="cuda", generator=g).bfloat16().transpose(1, 2) for n in (heads, kv, kv, heads)
    )
    for t in (q, k, v):
        t.requires_grad_()
    ref = []
    qf, kf, vf = (t[:1].float().detach().requires_grad_() for t in (q, k, v))
    kr, vr = (t.repeat_interleave(heads // kv, dim=1) for t in (kf, vf))
    sc = (qf @ kr.transpose(-1, -2)) * d**-0.5
    sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    out = torch.softmax(sc, dim=-1) @ vr
    ref = [out.detach(), *torch.autograd.grad(out, (qf, kf, vf), do[:1].float())]
    del sc, out
    variants = {
        "cudnn": (SDPBackend.CUDNN_ATTENTION, False),
        "flash": (SDPBackend.FLASH_ATTENTION, False),
        "efficient": (SDPBackend.EFFICIENT_ATTENTION, False),
        "cudnn_expanded_kv": (SDPBackend.CUDNN_ATTENTION, True),
    }
    rows = []
    for name, (backend, expand) in variants.items():

        def fwd_bwd(backend=backend, expand=expand):
            kk, vv = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v)) if expand else (k, v)
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=not expand)
            return o, torch.autograd.grad(o, (q, k, v), do)

        try:
            o, grads = fwd_bwd()
        except RuntimeError as e:
            rows.append({"part": "attention", "variant": name, "error": str(e)[:300]})
            print(json.dumps(rows[-1]), flush=True)
            continue
        errs = [((x[:1].float() - r).norm() / r.norm()).item() for x, r in zip((o, *grads), ref)]
        assert max(errs) < 2e-2, (name, errs)
        fl = 4 * b * heads * s * s * d / 2  # causal forward FLOPs; the backward is 2.5x
        r = timed(fwd_bwd, iters)
        rows.append({"part": "attention", "variant": name, "max_rel_err": max(errs), **r,
                     "tflops": 3.5 * fl / (r["median_ms"] * 1e-3) / 1e12})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def lora_rows(iters: int) -> list[dict]:
    """One layer's LoRA adapters as the train engine runs them (rank 16 on wq, wk and wv, which read
    one input as a group, and on wo; llama3_1b: hidden 2048, k/v 512, 16384 tokens; frozen bf16
    bases), forward and backward through whichever sweepbench is imported (an A/B of two trees:
    PYTHONPATH), checked against the textbook formula in fp32. Timed per call from an idle GPU, so
    the host's launches count: a comparison of two codes, not the layer's share of a step."""
    from sweepbench.train.model import LoRALinear, lora_group

    hidden, kv, rank = 2048, 512, 16
    g = torch.Generator(device="cuda").manual_seed(3)
    layers = [LoRALinear(hidden, out, rank=rank, alpha=32.0).cuda() for out in (hidden, kv, kv, hidden)]
    with torch.no_grad():
        for m in layers:
            m.weight.normal_(0, hidden**-0.5, generator=g)
            m.lora_a.normal_(0, hidden**-0.5, generator=g)
            m.lora_b.normal_(0, 0.05, generator=g)
    for m in layers:
        m.bfloat16()
    x, o_in = (torch.randn(4, 4096, hidden, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(2))
    grads = [torch.randn(4, 4096, m.weight.shape[0], device="cuda", generator=g).bfloat16() for m in layers]
    params = [p for m in layers for p in (m.lora_a, m.lora_b)]

    def step():
        for t in (x, o_in, *params):
            t.grad = None
        outs = [*lora_group(x, layers[:3]), layers[3](o_in)]
        torch.autograd.backward(outs, grads)
        return outs

    def textbook():
        xs = [t.detach().float().requires_grad_() for t in (x, o_in)]
        ps = [p.detach().float().requires_grad_() for p in params]
        outs = [F.linear(t, m.weight.float()) + F.linear(F.linear(t, a), b) * m.scale
                for m, a, b, t in zip(layers, ps[::2], ps[1::2], (xs[0], xs[0], xs[0], xs[1]))]
        torch.autograd.backward(outs, [t.float() for t in grads])
        return outs, [t.grad for t in xs] + [p.grad for p in ps]

    outs = step()
    got = [o.detach() for o in outs] + [x.grad, o_in.grad] + [p.grad for p in params]
    ref_outs, ref_grads = textbook()
    errs = [((a.float() - r).norm() / r.norm()).item() for a, r in zip(got, [*ref_outs, *ref_grads])]
    assert max(errs) < 2e-2, errs
    rows = [{"part": "lora_layer", "variant": "engine", "max_rel_err": max(errs), **timed(step, iters)}]
    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--only", default="flce,add_norm,attention")
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    dist.init_process_group("nccl", rank=0, world_size=1)  # the harness's timer reduces over ranks
    torch.cuda.set_device(0)
    parts = {"flce": flce_rows, "add_norm": add_norm_rows, "attention": attention_rows, "lora": lora_rows}
    rows = [row for name in args.only.split(",") for row in parts[name](args.iters)]
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
