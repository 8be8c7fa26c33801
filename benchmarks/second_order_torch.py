#!/usr/bin/env python3
"""PyTorch (pip) side of bench_second_order: a Hessian-vector product through
nn.MultiheadAttention(batch_first=True) against one forward + backward, float32, self-attention,
need_weights=False, loss = 0.5 * sum(out**2), the input requiring grad, the HVP over the
parameters (in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias):

    g  = torch.autograd.grad(loss, params, create_graph=True)
    Hv = torch.autograd.grad(g, params, grad_outputs=v)

SDPA's fused CPU kernels (flash) have no double backward, so the HVP runs on its math path
(torch.nn.attention.sdpa_kernel(SDPBackend.MATH)); forward + backward is timed both on the
default path (fused SDPA, what a training step uses) and on the math path.

  second_order_torch.py                                     PyTorch only
  second_order_torch.py --ours build/benchmarks/bench_second_order
        interleaved with ours: for each shape and thread count, `rounds` times, one batch of our
        samples (a bench_second_order subprocess) then one batch of PyTorch's, so that load
        changes hit both sides alike; medians over all samples
  second_order_torch.py --shapes toy,medium --threads 1 --rounds 5 --samples 5
Each row is given twice: wall-clock medians and process-CPU-time medians (on a loaded machine a
long call is interrupted more often than a short one, which inflates wall-time ratios).
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
    x = torch.randn(B, T, E, requires_grad=True)
    mask = nn.Transformer.generate_square_subsequent_mask(T) if causal else None
    params = list(mha.parameters())
    v = [torch.randn_like(p) for p in params]

    def loss():
        out, _ = mha(x, x, x, need_weights=False, attn_mask=mask, is_causal=causal)
        return 0.5 * (out * out).sum()

    def step():
        mha.zero_grad()
        x.grad = None
        loss().backward()

    def step_math():
        with sdpa_kernel([SDPBackend.MATH]):
            step()

    def hvp():
        with sdpa_kernel([SDPBackend.MATH]):
            g = torch.autograd.grad(loss(), params, create_graph=True)
            return torch.autograd.grad(g, params, grad_outputs=v)

    return step, step_math, hvp


def run_ours(binary, shape, threads, n, min_time, core):
    cmd = [binary, "--tsv", "--shapes", shape, "--threads", str(threads), "--samples", str(n),
           "--min-time", str(min_time), "--core", core]
    return ours_samples(cmd, shape, (5, 6, 9, 10))  # wall fwd+bwd, wall HVP, CPU fwd+bwd, CPU HVP


def us(t):
    return f"{t * 1e6:,.0f} µs"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ours", help="path to bench_second_order, timed interleaved with PyTorch")
    p.add_argument("--core", default="fused", choices=["fused", "composed"], help="our attention core")
    p.add_argument("--shapes", default="toy,medium")
    p.add_argument("--threads", default="1")
    p.add_argument("--rounds", type=int, default=3, help="alternations of ours and PyTorch per shape")
    p.add_argument("--samples", type=int, default=5, help="samples per side per round")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per sample (at least one call)")
    args = p.parse_args()

    import torch

    print(f"# torch {torch.__version__}; float32, self-attention, need_weights=False, loss 0.5*sum(out^2); "
          f"HVP over the parameters; ours: {args.core} core; medians of interleaved samples", file=sys.stderr)
    head = ["shape", "threads", "clock"]
    if args.ours:
        head += ["ours fwd+bwd", "ours HVP", "ours HVP/fwd+bwd"]
    head += ["torch fwd+bwd", "torch fwd+bwd (math)", "torch HVP (math)", "torch HVP/fwd+bwd"]
    if args.ours:
        head += ["torch HVP / ours HVP"]
    print("\t".join(head), flush=True)
    clocks = {"wall": time.perf_counter, "CPU": time.process_time}
    for n in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(n)
        for name in args.shapes.split(","):
            step, step_math, hvp = make_bench(*SHAPES[name])
            for f in (step, step_math, hvp):
                for _ in range(3):
                    f()
            reps = {f: calibrate(f, args.min_time) for f in (step, step_math, hvp)}
            ours = {c: ([], []) for c in clocks}
            theirs = {c: ([], [], []) for c in clocks}
            for _ in range(args.rounds):
                if args.ours:
                    w_fb, w_hvp, c_fb, c_hvp = run_ours(args.ours, name, n, args.samples, args.min_time, args.core)
                    ours["wall"][0].extend(w_fb), ours["wall"][1].extend(w_hvp)
                    ours["CPU"][0].extend(c_fb), ours["CPU"][1].extend(c_hvp)
                for c, clock in clocks.items():
                    for _ in range(args.samples):
                        for lst, f in zip(theirs[c], (step, step_math, hvp)):
                            lst.append(sample(f, reps[f], clock))
            for c in clocks:
                m_fb, m_fb_math, m_th = (statistics.median(x) for x in theirs[c])
                row = [name, str(n), c]
                if args.ours:
                    o_fb, o_hvp = (statistics.median(x) for x in ours[c])
                    row += [us(o_fb), us(o_hvp), f"{o_hvp / o_fb:.2f}x"]
                row += [us(m_fb), us(m_fb_math), us(m_th), f"{m_th / m_fb:.2f}x"]
                if args.ours:
                    row += [f"{m_th / o_hvp:.2f}x"]
                print("\t".join(row), flush=True)


if __name__ == "__main__":
    main()
