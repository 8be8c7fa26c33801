"""examples/induction_heads's model trained side by side in plain PyTorch, from the same initial
weights and on the same training sequences: the first losses are compared and the steps per
second of both are measured in the same run, one thread each.

The example writes its initial weights (TransformerLens's names and shapes) and every step's
training batch (Markov chains, "data.train_tokens", (steps, batch, T)) with --save-initial, and
its per-step training losses ("train_losses") and training time in its summary. This script runs
it, then trains the same model in torch on those batches for the same steps: the 2-layer
attention-only transformer with LayerNorm before each block and at the end, learned positions, a
causal softmax attention; the next-token loss (mean over the batch and the positions); AdamW on
every parameter (lr and weight decay the example's, torch's default betas and eps, as nn::AdamW's).
Two torch forwards are timed: "tl", written out as TransformerLens's HookedTransformer computes
it (einsums per head, the mask filled with -inf), and "fused", torch's layer_norm and
scaled_dot_product_attention (the same numbers to rounding).

headgrad's time is the example's train_seconds: every step's batch drawn, forward, backward and
AdamW step (the held-out evaluations left out); torch's is the same loop with the batches
already drawn. The three are run in turn --repeats times (the machine's load changes between
them) and the medians of the speeds and of the per-round ratios are printed.

Usage: python3 benchmarks/induction_torch.py --ours build/examples/induction_heads/induction_heads
       [--steps 200] [--threads 1] [--seed 1] [--repeats 3] [--float64]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def layer_norm_tl(x, w, b, eps):
    """TransformerLens's LayerNorm: centred, divided by the root of the mean square plus eps."""
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w + b


def attention_tl(h, w, l, mask):
    a = f"blocks.{l}.attn."
    q = torch.einsum("bte,hed->bhtd", h, w[a + "W_Q"]) + w[a + "b_Q"][None, :, None]
    k = torch.einsum("bte,hed->bhtd", h, w[a + "W_K"]) + w[a + "b_K"][None, :, None]
    v = torch.einsum("bte,hed->bhtd", h, w[a + "W_V"]) + w[a + "b_V"][None, :, None]
    scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(mask, float("-inf"))
    z = torch.softmax(scores, dim=-1) @ v  # (B, H, T, d)
    return torch.einsum("bhtd,hde->bte", z, w[a + "W_O"]) + w[a + "b_O"]


def attention_fused(h, w, l):
    a = f"blocks.{l}.attn."
    H, E, d = w[a + "W_Q"].shape
    B, T, _ = h.shape

    def project(m):  # one (E, H·d) matmul per input, then split into heads
        W = w[a + "W_" + m].permute(1, 0, 2).reshape(E, H * d)
        return (h @ W + w[a + "b_" + m].reshape(H * d)).view(B, T, H, d).transpose(1, 2)

    z = F.scaled_dot_product_attention(project("Q"), project("K"), project("V"), is_causal=True)
    return z.transpose(1, 2).reshape(B, T, H * d) @ w[a + "W_O"].reshape(H * d, E) + w[a + "b_O"]


def model_loss(w, tokens, n_layers, fused, eps=1e-5):
    """The next-token loss (mean cross entropy of tokens[:, t+1] from tokens[:, :t+1])."""
    T = tokens.shape[1]
    x = w["embed.W_E"][tokens] + w["pos_embed.W_pos"][:T]  # (B, T, E)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    E = x.shape[-1]
    for l in range(n_layers):
        lw, lb = w[f"blocks.{l}.ln1.w"], w[f"blocks.{l}.ln1.b"]
        if fused:
            x = x + attention_fused(F.layer_norm(x, (E,), lw, lb, eps), w, l)
        else:
            x = x + attention_tl(layer_norm_tl(x, lw, lb, eps), w, l, mask)
    if fused:
        x = F.layer_norm(x, (E,), w["ln_final.w"], w["ln_final.b"], eps)
    else:
        x = layer_norm_tl(x, w["ln_final.w"], w["ln_final.b"], eps)
    logits = x @ w["unembed.W_U"] + w["unembed.b_U"]  # (B, T, V)
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))


def train(initial, batches, n_layers, fused, lr, wd):
    w = {k: v.clone().requires_grad_(True) for k, v in initial.items() if not k.startswith("data.")}
    opt = torch.optim.AdamW(list(w.values()), lr=lr, weight_decay=wd)
    losses = []
    start = time.perf_counter()
    for tokens in batches:
        loss = model_loss(w, tokens, n_layers, fused)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses, time.perf_counter() - start


def run_ours(a, directory, save):
    """The example's summary (and, with save, its initial weights and batches) for the run."""
    weights, summary = os.path.join(directory, "initial.safetensors"), os.path.join(directory, "summary.json")
    cmd = [a.ours, "--steps", str(a.steps), "--eval-interval", str(a.steps), "--test-sequences", "16",
           "--seed", str(a.seed), "--threads", str(a.threads), "--summary", summary, "--quiet"]
    if save:
        cmd += ["--save-initial", weights]
    if a.float64:
        cmd.append("--float64")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(summary) as f:
        return json.load(f), (load_file(weights) if save else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", required=True, help="the induction_heads program")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of headgrad, torch tl, torch fused in turn; the speeds are their medians")
    ap.add_argument("--float64", action="store_true", help="both sides in float64: the losses agree to rounding")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rounds = []  # per round: steps/s of headgrad, torch tl, torch fused
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.repeats):
            s, saved = run_ours(a, d, save=r == 0)
            if r == 0:
                initial = saved
                batches = initial["data.train_tokens"].long()
                dtype = torch.float64 if a.float64 else torch.float32
                if any(v.dtype != dtype for k, v in initial.items() if not k.startswith("data.")):
                    sys.exit(f"the example's weights are not {dtype}")
                cfg = s["config"]
                n_layers = sum(1 for k in initial if k.endswith(".attn.W_Q"))
                ours_losses = s["train_losses"][: a.steps]
                opt = dict(lr=cfg["lr"], wd=cfg["weight_decay"])
            elif s["train_losses"][: a.steps] != ours_losses:
                sys.exit("the example's losses differ between runs")
            tl_losses, tl_s = train(initial, batches, n_layers, fused=False, **opt)
            fused_losses, fused_s = train(initial, batches, n_layers, fused=True, **opt)
            rounds.append((a.steps / s["train_seconds"], a.steps / tl_s, a.steps / fused_s))
    B, T = batches.shape[1], batches.shape[2]
    print(f"induction_heads: {n_layers} attention-only layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, "
          f"vocab {cfg['vocab']}; {a.steps} steps of {B} x {T} tokens, {a.threads} thread(s), "
          f"{'float64' if a.float64 else 'float32'}; torch {torch.__version__}")
    first = min(10, a.steps)
    digits = 12 if a.float64 else 4
    tolerance = 1e-11 if a.float64 else 5e-5
    print("first losses  headgrad:    " + " ".join(f"{x:.{digits}f}" for x in ours_losses[:first]))
    print("              torch tl:    " + " ".join(f"{x:.{digits}f}" for x in tl_losses[:first]))
    print("              torch fused: " + " ".join(f"{x:.{digits}f}" for x in fused_losses[:first]))
    agree = all(abs(x - y) < tolerance for x, y in zip(ours_losses[:first], tl_losses[:first]))
    worst_first = max(abs(x - y) for x, y in zip(ours_losses[:first], tl_losses[:first]))
    worst = max(abs(x - y) for x, y in zip(ours_losses, tl_losses))
    worst_fused = max(abs(x - y) for x, y in zip(ours_losses, fused_losses))
    print(f"the first {first} losses agree within {tolerance:g}: {'yes' if agree else 'NO'} (largest difference "
          f"{worst_first:.2e}); largest difference over {a.steps} steps: {worst:.2e} (torch tl), "
          f"{worst_fused:.2e} (torch fused); last loss headgrad {ours_losses[-1]:.6f}, torch {tl_losses[-1]:.6f}")
    for i, (ours, tl, fused) in enumerate(rounds):
        print(f"round {i + 1}: steps/s headgrad {ours:.1f}, torch tl {tl:.1f}, fused {fused:.1f}; "
              f"headgrad / torch {ours / tl:.2f}x (tl), {ours / fused:.2f}x (fused)")
    med = lambda xs: statistics.median(xs)
    print(f"median of {len(rounds)}: steps/s headgrad {med([r[0] for r in rounds]):.1f}, torch tl "
          f"{med([r[1] for r in rounds]):.1f}, fused {med([r[2] for r in rounds]):.1f}; headgrad / torch "
          f"{med([r[0] / r[1] for r in rounds]):.2f}x (tl), {med([r[0] / r[2] for r in rounds]):.2f}x (fused)")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
