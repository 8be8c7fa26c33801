#!/usr/bin/env python3
"""PyTorch (pip) side of bench_jacobian: the full Jacobian of a transformer's feed-forward
residual block, (64 -> 64), with respect to its input x, float32 and float64:

    block(x) = x + F.linear(F.gelu(F.linear(x, W1, b1)), W2, b2)    x [64], W1 [256, 64], W2 [64, 256]
    torch.func.jacrev(block)(x)      vmap of a vjp over the 64 unit cotangents (batched: one pass)
    torch.func.jacfwd(block)(x)      vmap of a jvp over the 64 unit tangents (dual numbers, batched)

against ours, ag::jacobian(block, {x}, {.mode = Reverse}) and {.mode = Forward} (64 backwards, or
64 jvps, one per row or column). Both sides use the same x and weights: bench_jacobian --save
writes them (drawn in float64 from seed 42, rounded to float32 for the float32 row) with our
Jacobians, and this script loads them and prints the largest difference between our Jacobians
and PyTorch's (float64 agrees to about 1e-12 or better).

  jacobian_torch.py --ours build/benchmarks/bench_jacobian
        interleaved with ours: for each dtype and thread count, `rounds` times, one batch of our
        samples (a bench_jacobian subprocess) then one batch of PyTorch's, so that load changes
        hit both sides alike; medians over all samples (wall clock)
  jacobian_torch.py --ours build/benchmarks/bench_jacobian --rounds 5 --samples 5 --gelu tanh
  jacobian_torch.py --data FILE      PyTorch only, on a file bench_jacobian --save wrote
  jacobian_torch.py                  PyTorch only, on weights of its own (no comparison)
The table is tab-separated: our time, PyTorch's, and PyTorch's over ours (above 1: ours is faster).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from timing import calibrate, ours_samples, sample

D, H = 64, 256  # bench_jacobian.cpp's kDim, kHidden


def load(path):
    """The tensors bench_jacobian --save wrote (raw little-endian float64), all float64."""
    import torch

    with open(path, "rb") as f:
        flat = torch.frombuffer(bytearray(f.read()), dtype=torch.float64)
    sizes = {"x": [D], "W1": [H, D], "b1": [H], "W2": [D, H], "b2": [D],
             "J64_rev": [D, D], "J64_fwd": [D, D], "J32_rev": [D, D], "J32_fwd": [D, D]}
    need = sum(torch.Size(s).numel() for s in sizes.values())
    if flat.numel() != need:
        raise RuntimeError(f"{path}: {flat.numel()} float64 values, expected {need}")
    out, at = {}, 0
    for name, shape in sizes.items():
        n = torch.Size(shape).numel()
        out[name] = flat[at:at + n].reshape(shape).clone()
        at += n
    return out


def own_data():
    import torch

    g = torch.Generator().manual_seed(42)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    return {"x": r(D), "W1": r(H, D) / D ** 0.5, "b1": 0.1 * r(H), "W2": r(D, H) / H ** 0.5, "b2": 0.1 * r(D)}


def make_bench(data, dtype, gelu):
    import torch
    import torch.nn.functional as F

    x, W1, b1, W2, b2 = (data[k].to(dtype) for k in ("x", "W1", "b1", "W2", "b2"))

    def block(v):
        return v + F.linear(F.gelu(F.linear(v, W1, b1), approximate=gelu), W2, b2)

    jacrev, jacfwd = torch.func.jacrev(block), torch.func.jacfwd(block)
    return (lambda: jacrev(x)), (lambda: jacfwd(x))


def run_ours(binary, dtype, threads, n, min_time, gelu):
    cmd = [binary, "--tsv", "--dtypes", dtype, "--threads", str(threads), "--samples", str(n),
           "--min-time", str(min_time), "--gelu", gelu]
    return ours_samples(cmd, dtype, (5, 6))


def us(t):
    return f"{t * 1e6:,.1f} µs"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ours", help="path to bench_jacobian, timed interleaved with PyTorch")
    p.add_argument("--data", help="a file bench_jacobian --save wrote (default: --ours writes one)")
    p.add_argument("--dtypes", default="float32,float64")
    p.add_argument("--threads", default="1")
    p.add_argument("--gelu", default="none", choices=["none", "tanh"])
    p.add_argument("--rounds", type=int, default=3, help="alternations of ours and PyTorch per dtype")
    p.add_argument("--samples", type=int, default=5, help="samples per side per round")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per sample (at least one call)")
    args = p.parse_args()

    import torch

    if args.data:
        data = load(args.data)
    elif args.ours:
        fd, path = tempfile.mkstemp(suffix=".f64")
        os.close(fd)
        try:
            subprocess.run([args.ours, "--save", path, "--gelu", args.gelu], check=True)
            data = load(path)
        finally:
            os.unlink(path)
    else:
        data = own_data()

    print(f"# torch {torch.__version__}; y = x + W2·gelu(W1·x + b1) + b2, x [{D}], hidden {H}, gelu {args.gelu} (none: exact, erf; tanh: the approximation); "
          f"Jacobian with respect to x; wall-clock medians of interleaved samples", file=sys.stderr)
    if "J64_rev" in data:  # agreement, at one thread
        torch.set_num_threads(1)
        for name, dtype, tag in (("float32", torch.float32, "J32"), ("float64", torch.float64, "J64")):
            rev, fwd = make_bench(data, dtype, args.gelu)
            ref = rev().double()
            diffs = [(f"ours {m} - torch jacrev", (data[f"{tag}_{m}"] - ref).abs().max().item()) for m in ("rev", "fwd")]
            diffs.append(("torch jacfwd - torch jacrev", (fwd().double() - ref).abs().max().item()))
            print(f"# {name}: max |J| {ref.abs().max().item():.3g}; max abs difference: "
                  + ", ".join(f"{k} {v:.3g}" for k, v in diffs), file=sys.stderr)

    head = ["dtype", "threads"]
    if args.ours:
        head += ["ours jacrev", "torch jacrev", "torch/ours", "ours jacfwd", "torch jacfwd", "torch/ours"]
    else:
        head += ["torch jacrev", "torch jacfwd"]
    print("\t".join(head), flush=True)
    for n in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(n)
        for name in args.dtypes.split(","):
            fns = make_bench(data, {"float32": torch.float32, "float64": torch.float64}[name], args.gelu)
            for f in fns:
                for _ in range(3):
                    f()
            reps = [calibrate(f, args.min_time) for f in fns]
            ours, theirs = ([], []), ([], [])
            for _ in range(args.rounds):
                if args.ours:
                    o_rev, o_fwd = run_ours(args.ours, name, n, args.samples, args.min_time, args.gelu)
                    ours[0].extend(o_rev), ours[1].extend(o_fwd)
                for _ in range(args.samples):  # alternating, as bench_jacobian
                    for lst, f, r in zip(theirs, fns, reps):
                        lst.append(sample(f, r))
            t_rev, t_fwd = (statistics.median(x) for x in theirs)
            row = [name, str(n)]
            if args.ours:
                o_rev, o_fwd = (statistics.median(x) for x in ours)
                row += [us(o_rev), us(t_rev), f"{t_rev / o_rev:.2f}x", us(o_fwd), us(t_fwd), f"{t_fwd / o_fwd:.2f}x"]
            else:
                row += [us(t_rev), us(t_fwd)]
            print("\t".join(row), flush=True)


if __name__ == "__main__":
    main()
