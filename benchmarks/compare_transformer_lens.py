"""Runs the circuits benchmark on both sides in one run and prints the ratios (TransformerLens / ours).

TransformerLens 3.9 (pip install transformer-lens==3.9.0) on the model bench_circuits builds: 2
layers, d_vocab 64, n_ctx 64, d_model 128, 4 heads, d_mlp 512, gelu, LayerNorm, batch 16, float32,
one thread. Measured: the full z patching sweep (get_act_patch_attn_head_out_all_pos and
get_act_patch_attn_head_out_by_pos, which patch hook_z, over both layers), run_with_cache of every
hook point TL has by default (and the cache's bytes; ours on the same activations), and a training step (forward, backward, AdamW).

Usage: python3 benchmarks/compare_transformer_lens.py --ours build/benchmarks/bench_circuits [--reps 5]
"""
import argparse
import json
import statistics
import subprocess
import time

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens import patching


def median_seconds(reps, f):
    f()
    times = []
    for _ in range(reps):
        a = time.perf_counter()
        f()
        times.append(time.perf_counter() - a)
    return statistics.median(times)


def theirs(reps):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, T, V = 16, 64, 64
    cfg = HookedTransformerConfig(n_layers=2, d_model=128, n_heads=4, d_head=32, d_mlp=512, d_vocab=V, n_ctx=T,
                                  act_fn="gelu", normalization_type="LN", default_prepend_bos=False)
    model = HookedTransformer(cfg)
    clean = torch.randint(0, V, (B, T))
    corrupted = torch.randint(0, V, (B, T))
    answers = clean[:, -1]

    def metric(logits):
        return logits[:, -1].gather(1, answers[:, None]).mean()

    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)

    def sweep():
        with torch.no_grad():
            patching.get_act_patch_attn_head_out_all_pos(model, corrupted, clean_cache, metric)
            patching.get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, metric)

    out = {"sweep": median_seconds(reps, sweep)}
    nbytes = [0]

    def cache():
        with torch.no_grad():
            _, c = model.run_with_cache(clean)
            nbytes[0] = sum(v.numel() * v.element_size() for v in c.values())

    out["run_with_cache"] = median_seconds(reps, cache)
    out["cache_bytes"] = nbytes[0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        loss = model(clean, return_type="loss")
        loss.backward()
        opt.step()

    out["train_step"] = median_seconds(reps, step)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    lines = subprocess.run([a.ours, "--reps", str(a.reps)], check=True, capture_output=True, text=True).stdout
    ours = {}
    for line in lines.splitlines():
        r = json.loads(line)
        ours[r["what"]] = r["seconds"]
        for extra in ("bytes", "largest_difference"):
            if extra in r:
                ours[r["what"] + "_" + extra] = r[extra]
    t = theirs(a.reps)
    print(f"torch {torch.__version__}, one thread, medians of {a.reps}")
    print(f"{'':22}{'TransformerLens':>16}{'headgrad':>12}{'ratio':>8}")
    for k in ("sweep", "run_with_cache", "train_step"):
        print(f"{k:22}{t[k]:>15.4f}s{ours[k]:>11.4f}s{t[k] / ours[k]:>7.2f}x")
    for k, what in (("sweep_all_positions", "every position's logits made"),
                    ("sweep_hooks", "study::activation_patching")):
        print(f"  sweep, {what}: {ours[k]:.4f}s, {t['sweep'] / ours[k]:.2f}x")
    print(f"  largest difference of the sweeps' metrics from activation_patching's: {ours['sweep_largest_difference']:.3g}")
    b = ours["run_with_cache_bytes"]
    print(f"{'cache bytes':22}{t['cache_bytes']:>16}{b:>12}{t['cache_bytes'] / b:>7.2f}x")
    print(f"ours, every hook point: run_with_cache {ours['run_with_cache_every_point']:.4f}s, "
          f"{ours['run_with_cache_every_point_bytes']} bytes")


if __name__ == "__main__":
    main()
