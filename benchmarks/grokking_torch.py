"""examples/grokking's model trained side by side in plain PyTorch, from the same initial weights
and on the same training pairs: the first losses are compared and the steps per second of both
are measured in the same run, one thread each.

The example writes its initial weights (TransformerLens's names and shapes) and its training rows
with --save-initial, and its per-step training losses in its summary's curve with
--eval-interval 1. This script runs it, then trains the same model in torch for the same steps:
full-batch AdamW on the weights (the biases stay 0), the loss in float64 at the "=" position.
Two torch forwards are timed: "full", every position through the whole block as
TransformerLens's HookedTransformer computes it, and "last", the last block computing only the
last position (what headgrad's TransformerLM::forward_last does; the same numbers).

Usage: python3 benchmarks/grokking_torch.py --ours build/examples/grokking/grokking [--p 113]
       [--train-fraction 0.3] [--steps 100] [--threads 1]
       python3 benchmarks/grokking_torch.py --ours build/examples/grokking/grokking --steps 25000 --test-curve 500
           torch alone (the "last" forward) from the example's initial weights and training pairs,
           the whole run, printing step, test loss, test accuracy and train loss every 500 steps
           (the test pairs are the others), to set beside the example's own --summary curve.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file


def model_forward(w, tokens, p, n_heads, last_only):
    """Logits (N, p) at the last position of the 1-layer, LayerNorm-free, ReLU transformer."""
    x = w["embed.W_E"][tokens] + w["pos_embed.W_pos"][: tokens.shape[1]]  # (N, T, E)
    q_src = x[:, -1:] if last_only else x
    q = torch.einsum("nte,hed->nhtd", q_src, w["blocks.0.attn.W_Q"]) + w["blocks.0.attn.b_Q"][None, :, None]
    k = torch.einsum("nte,hed->nhtd", x, w["blocks.0.attn.W_K"]) + w["blocks.0.attn.b_K"][None, :, None]
    v = torch.einsum("nte,hed->nhtd", x, w["blocks.0.attn.W_V"]) + w["blocks.0.attn.b_V"][None, :, None]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if not last_only:
        T = tokens.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        scores = scores.masked_fill(mask, float("-inf"))
    z = torch.softmax(scores, dim=-1) @ v  # (N, H, T', d)
    attn_out = torch.einsum("nhtd,hde->nte", z, w["blocks.0.attn.W_O"]) + w["blocks.0.attn.b_O"]
    resid = (x[:, -1:] if last_only else x) + attn_out
    hidden = torch.relu(resid @ w["blocks.0.mlp.W_in"] + w["blocks.0.mlp.b_in"])
    resid = resid + hidden @ w["blocks.0.mlp.W_out"] + w["blocks.0.mlp.b_out"]
    logits = resid @ w["unembed.W_U"] + w["unembed.b_U"]
    return logits[:, -1]


def train(initial, tokens, labels, p, n_heads, steps, last_only, lr, wd, betas):
    w = {k: v.clone() for k, v in initial.items() if not k.startswith("data.")}
    trained = []
    for k, v in w.items():
        if k.split(".")[-1].startswith("W_"):  # the weights; the biases (b_*) stay 0
            v.requires_grad_(True)
            trained.append(v)
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=wd, betas=betas)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        logits = model_forward(w, tokens, p, n_heads, last_only).to(torch.float64)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses, time.perf_counter() - start


def test_curve(initial, p, n_heads, steps, every, lr, wd, betas):
    """Trains torch alone from `initial` and prints the test curve every `every` steps."""
    rows = initial["data.train_indices"].long()
    held = torch.ones(p * p, dtype=torch.bool)
    held[rows] = False
    test_rows = torch.arange(p * p)[held]

    def pairs(r):
        return torch.stack([r // p, r % p, torch.full_like(r, p)], dim=1), (r // p + r % p) % p

    (tokens, labels), (test_tokens, test_labels) = pairs(rows), pairs(test_rows)
    w = {k: v.clone() for k, v in initial.items() if not k.startswith("data.")}
    trained = [v.requires_grad_(True) for k, v in w.items() if k.split(".")[-1].startswith("W_")]
    opt = torch.optim.AdamW(trained, lr=lr, weight_decay=wd, betas=betas)
    print("step\ttest_loss\ttest_accuracy\ttrain_loss", flush=True)
    train_loss = float("nan")
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            with torch.no_grad():
                logits = model_forward(w, test_tokens, p, n_heads, True).to(torch.float64)
                loss = torch.nn.functional.cross_entropy(logits, test_labels).item()
                acc = (logits.argmax(1) == test_labels).double().mean().item()
            print(f"{step}\t{loss:.4g}\t{acc:.4f}\t{train_loss:.3g}", flush=True)
        if step == steps:
            break
        loss = torch.nn.functional.cross_entropy(model_forward(w, tokens, p, n_heads, True).to(torch.float64), labels)
        train_loss = loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", required=True)
    ap.add_argument("--p", type=int, default=113)
    ap.add_argument("--train-fraction", type=float, default=0.3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--float64", action="store_true", help="both sides in float64: the losses agree to rounding")
    ap.add_argument("--test-curve", type=int, default=0, metavar="N",
                    help="torch alone for --steps steps, the test curve every N steps (see above)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as d:
        weights, summary = os.path.join(d, "initial.safetensors"), os.path.join(d, "summary.json")
        ours_steps = 1 if a.test_curve else a.steps  # the curve needs only the initial weights
        cmd = [a.ours, "--p", str(a.p), "--train-fraction", str(a.train_fraction), "--steps", str(ours_steps),
               "--eval-interval", "1", "--snapshot-interval", str(ours_steps), "--seed", str(a.seed), "--threads",
               str(a.threads), "--save-initial", weights, "--summary", summary, "--quiet"]
        if a.float64:
            cmd.append("--float64")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        initial = load_file(weights)
        with open(summary) as f:
            s = json.load(f)
    p = a.p
    cfg = s["config"]
    if a.test_curve:
        return test_curve(initial, p, cfg["n_heads"], a.steps, a.test_curve, cfg["lr"], cfg["weight_decay"],
                          tuple(cfg["betas"]))
    rows = initial["data.train_indices"].long()
    tokens = torch.stack([rows // p, rows % p, torch.full_like(rows, p)], dim=1)
    labels = (rows // p + rows % p) % p
    ours_losses = [c["train_loss"] for c in s["curve"]][: a.steps]
    ours_sps = a.steps / s["train_seconds"]
    args = (p, cfg["n_heads"], a.steps)
    opt = dict(lr=cfg["lr"], wd=cfg["weight_decay"], betas=tuple(cfg["betas"]))
    full_losses, full_s = train(initial, tokens, labels, *args, last_only=False, **opt)
    last_losses, last_s = train(initial, tokens, labels, *args, last_only=True, **opt)
    print(f"grokking p = {p}, {len(rows)} training pairs, {a.steps} full-batch steps, {a.threads} thread(s), "
          f"{'float64' if a.float64 else 'float32'}; "
          f"torch {torch.__version__}")
    worst = max(abs(x - y) for x, y in zip(ours_losses, full_losses))
    worst_last = max(abs(x - y) for x, y in zip(ours_losses, last_losses))
    first = min(10, a.steps)
    print("first losses  headgrad: " + " ".join(f"{x:.4f}" for x in ours_losses[:first]))
    print("              torch:    " + " ".join(f"{x:.4f}" for x in full_losses[:first]))
    agree = all(abs(x - y) < 5e-5 for x, y in zip(ours_losses[:first], full_losses[:first]))
    print(f"the first {first} losses agree to 4 decimals (within 5e-5): {'yes' if agree else 'NO'}; largest difference over "
          f"{a.steps} steps: {worst:.2e} (torch full), {worst_last:.2e} (torch last)")
    print(f"steps/s  headgrad {ours_sps:.2f}; torch full {a.steps / full_s:.2f}, last {a.steps / last_s:.2f}")
    print(f"headgrad / torch: {ours_sps * full_s / a.steps:.2f}x (full), {ours_sps * last_s / a.steps:.2f}x (last)")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
