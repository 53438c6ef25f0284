import torch, json, sys
torch.manual_seed(0)
dev = "cuda"; bf = torch.bfloat16
T, d, r = 16384, 2048, 16
outs = [2048, 512, 512]
R = r * len(outs)
W = [torch.randn(o, d, device=dev, dtype=bf) * 0.02 for o in outs]
A = [torch.randn(r, d, device=dev, dtype=bf) * 0.02 for o in outs]
B = [torch.randn(o, r, device=dev, dtype=bf) * 0.02 for o in outs]
s = 1.0
x = torch.randn(T, d, device=dev, dtype=bf)
A_all = torch.cat(A)
bufs = {st: torch.zeros(T, st, device=dev, dtype=bf) for st in (d + R, d + 64)}
for b in bufs.values(): b[:, :d] = x

def current():
    xa_all = x @ A_all.t()
    ys = []
    for i in range(3):
        xa = xa_all[:, i*r:(i+1)*r]
        y = x.new_empty(T, outs[i])
        torch.mm(xa, B[i].t(), out=y)
        ys.append(torch.addmm(y, x, W[i].t(), beta=s, out=y))
    return ys

def make_wide(st):
    buf = bufs[st]
    xw, tail, xk = buf[:, :d], buf[:, d:d + R], buf[:, :d + R]
    def wide():
        torch.mm(xw, A_all.t(), out=tail)
        ys = []
        for i in range(3):
            wext = torch.cat([W[i], torch.nn.functional.pad(B[i], (i*r, R - (i+1)*r))], 1)
            ys.append(xk @ wext.t())
        return ys
    return wide

def plain():
    return [x @ W[i].t() for i in range(3)]

fns = {"plain": plain, "current": current, "wide2096": make_wide(d + R), "wide2112": make_wide(d + 64)}
c = current()
for k in ("wide2096", "wide2112"):
    w = fns[k]()
    print(k, "maxdiff", [(a.float() - b.float()).abs().max().item() for a, b in zip(c, w)])
def t(fn, n):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n): fn()
    e1.record(); e1.synchronize()
    return e0.elapsed_time(e1) / n * 1e3
res = {k: [] for k in fns}
for rnd in range(6):
    for k, fn in fns.items():
        res[k].append(t(fn, 100 if rnd < 3 else 1000))
for k, v in res.items():
    print(k, "us per qkv forward (3 rounds x100, 3 x1000):", v)
json.dump(res, open(sys.argv[1], "w"), indent=1)
