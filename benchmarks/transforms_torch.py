#!/usr/bin/env python3
"""PyTorch (pip) side of bench_transforms: a Jacobian-vector product through
nn.MultiheadAttention(batch_first=True) against a plain forward, float32, self-attention,
need_weights=False, the tangent on the input x:

    out, Jv = torch.func.jvp(lambda x: mha(x, x, x, need_weights=False)[0], (x,), (v,))

PyTorch's forward mode is its own (dual numbers, one pass), where ours is the double-vjp
construction. SDPA's fused CPU kernel (flash) has no forward-mode derivative, so the jvp runs on
its math path (torch.nn.attention.sdpa_kernel(SDPBackend.MATH)); the plain forward (under
torch.no_grad()) is timed both on the default path (fused SDPA) and on the math path.

  transforms_torch.py                                     PyTorch only
  transforms_torch.py --ours build/benchmarks/bench_transforms
        interleaved with ours: for each shape and thread count, `rounds` times, one batch of our
        samples (a bench_transforms subprocess) then one batch of PyTorch's, so that load
        changes hit both sides alike; medians over all samples
  transforms_torch.py --shapes toy,medium --threads 1 --rounds 5 --samples 5
Each row is given twice: wall-clock medians and process-CPU-time medians.
"""
import argparse
import statistics
import sys
import time
from timing import calibrate, ours_samples, sample

SHAPES = {  # name: B, T, E, H, causal (benchmarks/bench_common.hpp)
    "seed": (1, 2, 4, 2, False),
    "tiny": (1, 8, 32, 4, False),
    "toy": (8, 32, 64, 4, False),
    "medium": (16, 128, 128, 4, False),
    "large": (8, 256, 384, 6, False),
    "medium-causal": (16, 128, 128, 4, True),
    "large-causal": (8, 256, 384, 6, True),
}


def make_bench(B, T, E, H, causal):
    import torch
    from torch import nn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(42)
    mha = nn.MultiheadAttention(E, H, batch_first=True)
    x = torch.randn(B, T, E)
    v = torch.randn(B, T, E)
    mask = nn.Transformer.generate_square_subsequent_mask(T) if causal else None

    def attention(a):
        return mha(a, a, a, need_weights=False, attn_mask=mask, is_causal=causal)[0]

    def forward():
        with torch.no_grad():
            attention(x)

    def forward_math():
        with sdpa_kernel([SDPBackend.MATH]):
            forward()

    def jvp():
        with sdpa_kernel([SDPBackend.MATH]):
            return torch.func.jvp(attention, (x,), (v,))

    return forward, forward_math, jvp


def run_ours(binary, shape, threads, n, min_time):
    cmd = [binary, "--tsv", "--shapes", shape, "--threads", str(threads), "--samples", str(n),
           "--min-time", str(min_time)]
    return ours_samples(cmd, shape, (5, 6, 9, 10))


def us(t):
    return f"{t * 1e6:,.0f} µs"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ours", help="path to bench_transforms, timed interleaved with PyTorch")
    p.add_argument("--shapes", default="toy,medium")
    p.add_argument("--threads", default="1")
    p.add_argument("--rounds", type=int, default=3, help="alternations of ours and PyTorch per shape")
    p.add_argument("--samples", type=int, default=5, help="samples per side per round")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per sample (at least one call)")
    args = p.parse_args()

    import torch

    print(f"# torch {torch.__version__}; float32, self-attention, need_weights=False; jvp with respect to the "
          f"input; medians of interleaved samples", file=sys.stderr)
    head = ["shape", "threads", "clock"]
    if args.ours:
        head += ["ours forward", "ours jvp", "ours jvp/forward"]
    head += ["torch forward", "torch forward (math)", "torch jvp (math)", "torch jvp/forward", "torch jvp/forward (math)"]
    if args.ours:
        head += ["ours jvp / torch jvp"]
    print("\t".join(head), flush=True)
    clocks = {"wall": time.perf_counter, "CPU": time.process_time}
    for n in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(n)
        for name in args.shapes.split(","):
            fns = make_bench(*SHAPES[name])
            for f in fns:
                for _ in range(3):
                    f()
            reps = {f: calibrate(f, args.min_time) for f in fns}
            ours = {c: ([], []) for c in clocks}
            theirs = {c: ([], [], []) for c in clocks}
            for _ in range(args.rounds):
                if args.ours:
                    w_f, w_j, c_f, c_j = run_ours(args.ours, name, n, args.samples, args.min_time)
                    ours["wall"][0].extend(w_f), ours["wall"][1].extend(w_j)
                    ours["CPU"][0].extend(c_f), ours["CPU"][1].extend(c_j)
                for c, clock in clocks.items():
                    for _ in range(args.samples):
                        for lst, f in zip(theirs[c], fns):
                            lst.append(sample(f, reps[f], clock))
            for c in clocks:
                t_f, t_fm, t_j = (statistics.median(x) for x in theirs[c])
                row = [name, str(n), c]
                if args.ours:
                    o_f, o_j = (statistics.median(x) for x in ours[c])
                    row += [us(o_f), us(o_j), f"{o_j / o_f:.2f}x"]
                row += [us(t_f), us(t_fm), us(t_j), f"{t_j / t_f:.2f}x", f"{t_j / t_fm:.2f}x"]
                if args.ours:
                    row += [f"{o_j / t_j:.2f}x"]
                print("\t".join(row), flush=True)


if __name__ == "__main__":
    main()
