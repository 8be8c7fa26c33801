#!/usr/bin/env python3
"""PyTorch (pip) side of bench_per_example: per-example gradients of the same toy model with
torch.func's vmap(grad), float32, on the CPU:

    grads = vmap(grad(loss_of_one_example), in_dims=(None, 0, 0))(params, tokens, targets)

The toy model (bench_per_example.cpp): Embedding(16, 64) -> pre-LayerNorm transformer block
(4 heads, causal, d_ff 256, exact GELU) -> LayerNorm -> Linear(64, 16); each example's loss its
mean next-token cross entropy over T = 32 positions; batch 64. Attention is written with
matmul and softmax (vmap runs it batched). Also timed: 64 separate backwards of one example each.

  per_example_torch.py                       1 thread, 7 samples
  per_example_torch.py --threads 1 --samples 9 --batch 64
Prints one line per method: <method> <batch> <threads> <median s>.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

V, T, E, H, FF = 16, 32, 64, 4, 256


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(E)
        self.W_Q, self.W_K, self.W_V, self.W_O = (nn.Linear(E, E) for _ in range(4))
        self.ln_2 = nn.LayerNorm(E)
        self.fc_1 = nn.Linear(E, FF)
        self.fc_2 = nn.Linear(FF, E)

    def forward(self, x):  # (..., T, E)
        h = self.ln_1(x)
        def heads(t):  # (..., T, E) -> (..., H, T, d_k)
            return t.unflatten(-1, (H, E // H)).transpose(-3, -2)
        q, k, v = heads(self.W_Q(h)), heads(self.W_K(h)), heads(self.W_V(h))
        scores = q @ k.transpose(-2, -1) / math.sqrt(E // H)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        pattern = scores.masked_fill(mask, float("-inf")).softmax(-1)
        z = (pattern @ v).transpose(-3, -2).flatten(-2)  # (..., T, E)
        x = x + self.W_O(z)
        return x + self.fc_2(F.gelu(self.fc_1(self.ln_2(x))))


class ToyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, E)
        self.block = Block()
        self.ln_final = nn.LayerNorm(E)
        self.unembed = nn.Linear(E, V)

    def forward(self, tokens):
        return self.unembed(self.ln_final(self.block(self.embed(tokens))))


def median_seconds(f, samples):
    f()  # warm-up
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = ToyLM()
    params = {k: v.detach() for k, v in model.named_parameters()}
    tokens = torch.randint(0, V, (a.batch, T))
    targets = torch.randint(0, V, (a.batch, T))

    def loss_one(p, x, y):  # one example: x, y (T)
        logits = functional_call(model, p, (x.unsqueeze(0),))[0]  # (T, V)
        return F.cross_entropy(logits, y)

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))
    got = per_example(params, tokens, targets)
    # Check once against a plain backward of example 0 alone.
    model.zero_grad()
    F.cross_entropy(model(tokens[:1])[0], targets[0]).backward()
    worst = max((got[k][0] - p.grad).abs().max().item() for k, p in model.named_parameters())
    print(f"# torch {torch.__version__}, {sum(p.numel() for p in params.values())} parameters, "
          f"vmap(grad) example 0 against its own backward: worst |diff| {worst:.2e}")

    def alone():
        for b in range(a.batch):
            model.zero_grad()
            F.cross_entropy(model(tokens[b:b + 1])[0], targets[b]).backward()

    for name, f in (("torch-vmap-grad", lambda: per_example(params, tokens, targets)), ("torch-alone", alone)):
        print(f"{name}\t{a.batch}\t{a.threads}\t{median_seconds(f, a.samples):.6f}", flush=True)


if __name__ == "__main__":
    main()
