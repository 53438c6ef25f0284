"""Which attentions of a fused LoRA model run the widened forward: after one training step on the
GPU, every block's q/k/v but the first hold widened weights, and the step's loss matches the same
model without the fused kernels."""
import sys

import torch
from omegaconf import OmegaConf

from sweepbench.parallel.specs import ModelShape
from sweepbench.train import fused
from sweepbench.train.init import init_weights
from sweepbench.train.model import Transformer

cfg = OmegaConf.to_container(OmegaConf.load(sys.argv[1]))
cfg.pop("defaults", None)
shape = ModelShape.from_config({**cfg, "seq_len": 1024})
dev = torch.device("cuda", 0)


def build(fuse: bool) -> Transformer:
    with torch.device("meta"):
        m = Transformer(shape, lora_rank=16)
    for name, p in m.named_parameters():
        p.requires_grad_(name.endswith(("lora_a", "lora_b")))
    init_weights(m, seed=0, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("lora_b"):
                p.normal_(std=0.02)  # B nonzero, so that the low-rank product counts
    if fuse:
        fused.apply(m, "liger")
    return m


g = torch.Generator(device=dev).manual_seed(0)
x = torch.randint(0, shape.vocab_size, (2, 1024), device=dev, generator=g)
y = torch.randint(0, shape.vocab_size, (2, 1024), device=dev, generator=g)
losses = []
for fuse in (False, True):
    m = build(fuse)
    loss = m(x, y) if fuse else torch.nn.functional.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())
    loss.backward()
    losses.append(loss.item())
    if fuse:
        wides = [[getattr(l.attention, p).wide is not None for p in ("wq", "wk", "wv")] for l in m.layers.values()]
        print("widened per layer:", wides)
        assert not any(wides[0]) and all(all(w) for w in wides[1:]), wides
print("losses unfused, fused:", losses, abs(losses[0] - losses[1]) / abs(losses[0]))
