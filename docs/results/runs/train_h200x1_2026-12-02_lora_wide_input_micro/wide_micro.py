import torch, json, sys
torch.manual_seed(0)
dev = "cuda"; bf = torch.bfloat16
T, d, r = 16384, 2048, 16
outs = [2048, 512, 512]
R = r * len(outs)
W = [torch.randn(o, d, device=dev, dtype=bf) * 0.02 for o in outs]
A = [torch.randn(r, d, device=dev, dtype=bf) * 0.02 for o in outs]
B = [torch.randn(o, r, device=dev, dtype=bf) * 0.02 for o in outs]
s = 2.0
buf = torch.randn(T, d + R, device=dev, dtype=bf)
x = buf[:, :d].contiguous()
xw = buf[:, :d]
A_all = torch.cat(A)

def current():
    xa_all = x @ A_all.t()
    ys = []
    for i in range(3):
        xa = xa_all[:, i*r:(i+1)*r]
        y = x.new_empty(T, outs[i])
        torch.mm(xa, B[i].t(), out=y)
        ys.append(torch.addmm(y, x, W[i].t(), beta=s, out=y))
    return ys

def wide():
    torch.mm(xw, A_all.t(), out=buf[:, d:])
    ys = []
    for i in range(3):
        wext = W[i].new_zeros(outs[i], d + R)
        wext[:, :d] = W[i]
        wext[:, d + i*r: d + (i+1)*r] = B[i] * s
        ys.append(buf @ wext.t())
    return ys

def wide_cat():
    torch.mm(xw, A_all.t(), out=buf[:, d:])
    ys = []
    z = [torch.zeros(o, R, device=dev, dtype=bf) for o in outs]
    for i in range(3):
        tail = z[i]; tail[:, i*r:(i+1)*r] = B[i] * s
        ys.append(buf @ torch.cat([W[i], tail], 1).t())
    return ys

def plain():
    return [x @ W[i].t() for i in range(3)]

# check
c, w = current(), wide()
for a, b in zip(c, w):
    print("maxdiff", (a.float() - b.float()).abs().max().item(), a.float().abs().max().item())
def t(fn, n=100):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n): fn()
    e1.record(); e1.synchronize()
    return e0.elapsed_time(e1) / n * 1e3
res = {k: [] for k in ("plain", "current", "wide", "wide_cat")}
for rnd in range(5):
    for k, fn in (("plain", plain), ("current", current), ("wide", wide), ("wide_cat", wide_cat)):
        res[k].append(t(fn))
for k, v in res.items():
    print(k, "us per qkv forward:", sorted(v))
json.dump(res, open(sys.argv[1], "w"), indent=1)
