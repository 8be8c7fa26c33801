#!/usr/bin/env python3
"""PyTorch (pip) side of headgrad's speed comparison (benchmarks/run.sh).

One training step of multi-head self-attention: forward + backward of
nn.MultiheadAttention(batch_first=True), float32, need_weights=False, loss = output.sum(),
the input requiring grad — the same step as benchmarks/bench_attention.cpp, at the same shapes,
at 1 and 2 threads (torch.set_num_threads). With need_weights=False PyTorch trains through its
fused scaled_dot_product_attention; the causal shapes pass is_causal=True (with the causal mask,
which PyTorch then drops in favour of the flag).

  compare_torch.py                                  PyTorch medians only
  compare_torch.py --ours build/benchmarks/bench_attention
        interleaved with ours: for each shape and thread count, `rounds` times, one batch of our
        samples (a bench_attention subprocess) then one batch of PyTorch's, so that load changes
        hit both sides alike; medians over all samples, and the ratio PyTorch / ours
  compare_torch.py --micro                          PyTorch's cost of a small op and of backward()
  compare_torch.py --memory                         peak RSS of one large-shape step (run alone)
  compare_torch.py --table RESULTS.tsv              the README table from run.sh's results
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

SHAPES = [  # name, B, T, E, H, causal
    ("seed", 1, 2, 4, 2, False),
    ("tiny", 1, 8, 32, 4, False),
    ("toy", 8, 32, 64, 4, False),
    ("medium", 16, 128, 128, 4, False),
    ("large", 8, 256, 384, 6, False),
    ("medium-causal", 16, 128, 128, 4, True),
    ("large-causal", 8, 256, 384, 6, True),
]


def flops(B, T, E):
    """Same count as bench_common.hpp: 3 * (8 B T E^2 + 4 B T^2 E), dense."""
    return 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E)


def make_step(B, T, E, H, causal):
    import torch
    from torch import nn

    torch.manual_seed(42)
    mha = nn.MultiheadAttention(E, H, batch_first=True)
    x = torch.randn(B, T, E, requires_grad=True)
    mask = nn.Transformer.generate_square_subsequent_mask(T) if causal else None

    def step():
        mha.zero_grad()
        x.grad = None
        out, _ = mha(x, x, x, need_weights=False, attn_mask=mask, is_causal=causal)
        out.sum().backward()

    return step


def calibrate(f, min_time):
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        t = time.perf_counter() - t0
        if t >= min_time or reps >= 1 << 24:
            return max(1, int(round(min_time / (t / reps)))) if t > 0 else reps
        reps *= 8 if t < min_time / 16 else 2


def samples(f, reps, n, clock=time.perf_counter):
    """n samples of reps calls, each call timed alone; a sample is the median call time (on a
    loaded machine an interrupted call is an outlier the median drops). Same as bench_common.hpp.
    clock=time.process_time measures process CPU seconds (steadier than wall time on a loaded
    machine)."""
    out = []
    for _ in range(n):
        t = []
        for _ in range(reps):
            t0 = clock()
            f()
            t.append(clock() - t0)
        out.append(statistics.median(t))
    return out


def run_ours(binary, shape, threads, n, min_time):
    cmd = [binary, "--tsv", "--shapes", shape, "--threads", str(threads), "--samples", str(n),
           "--min-time", str(min_time)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split("\t")
        if f[0] == "ours" and f[1] == shape:
            return [float(v) for v in f[5].split(",")], float(f[6]) if len(f) > 6 else float("nan")
    raise RuntimeError(f"no result from {' '.join(cmd)}:\n{out}")


def compare(args):
    import torch

    wanted = None if args.shapes == "all" else set(args.shapes.split(","))
    threads = [int(t) for t in args.threads.split(",")]
    print(f"# torch {torch.__version__}, nn.MultiheadAttention(batch_first=True), need_weights=False",
          file=sys.stderr)
    for n in threads:
        torch.set_num_threads(n)
        for name, B, T, E, H, causal in SHAPES:
            if wanted and name not in wanted:
                continue
            step = make_step(B, T, E, H, causal)
            for _ in range(3):
                step()
            reps = calibrate(step, args.min_time)
            theirs, ours, ours_cpu, theirs_cpu = [], [], [], []
            for _ in range(args.rounds):
                if args.ours:
                    o, c = run_ours(args.ours, name, n, args.samples, args.min_time)
                    ours += o
                    ours_cpu.append(c)
                theirs += samples(step, reps, args.samples)
                theirs_cpu += samples(step, reps, max(1, args.samples // 2), clock=time.process_time)
            t, tc = statistics.median(theirs), statistics.median(theirs_cpu)
            if args.ours:
                o, oc = statistics.median(ours), statistics.median(ours_cpu)
                print(f"pytorch\t{name}\t{n}\t{o:.9g}\t{t:.9g}\t{t / o:.4g}\t{oc:.9g}\t{tc:.9g}", flush=True)
            else:
                print(f"pytorch\t{name}\t{n}\t\t{t:.9g}\t\t\t{tc:.9g}", flush=True)


def micro(args):
    import torch

    torch.set_num_threads(1)
    a = torch.randn(4, requires_grad=True)
    b = torch.randn(4)
    keep = [None]

    def op():
        keep[0] = a * b

    def op_nograd():
        with torch.no_grad():
            keep[0] = a * b

    a2 = torch.randn(4, requires_grad=True)
    b2 = torch.randn(4, requires_grad=True)

    def build():
        keep[0] = (a2 * b2 + a2).sum()

    def build_backward():
        (a2 * b2 + a2).sum().backward()

    def group(f, inner):
        def g():
            for _ in range(inner):
                f()
        return g

    res = {}
    for key, f, inner in [("op", op, 50), ("op_nograd", op_nograd, 50), ("build", build, 10),
                          ("build_backward", build_backward, 10)]:
        g = group(f, inner)
        for _ in range(10):
            g()
        reps = calibrate(g, 0.02)
        res[key] = statistics.median(samples(g, reps, 15)) / inner
    print(f"torch\top a*b [4], graph recorded\t{res['op'] * 1e6:.4g}\tµs")
    print(f"torch\top a*b [4], no_grad\t{res['op_nograd'] * 1e6:.4g}\tµs")
    print(f"torch\ttiny graph sum(a*b + a): build (3 ops)\t{res['build'] * 1e6:.4g}\tµs")
    print(f"torch\ttiny graph: backward() alone\t{(res['build_backward'] - res['build']) * 1e6:.4g}\tµs")


def memory(args):
    import torch

    torch.set_num_threads(1)
    step = make_step(8, 256, 384, 6, False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    step()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"torch\tlarge fwd+bwd: peak RSS of the process\t{after:.1f}\tMiB")
    print(f"torch\tlarge fwd+bwd: peak RSS above module + input\t{after - before:.1f}\tMiB")


def table(args):
    """Markdown table from run.sh's results file (lines from bench_attention, bench_torch_cpp and
    this script, tab-separated)."""
    rows = {}
    peak = None
    for line in open(args.table):
        f = line.rstrip("\n").split("\t")
        if f[0] == "peak":
            peak = float(f[1])
        elif f[0] in ("pytorch", "libtorch"):
            r = rows.setdefault((f[1], int(f[2])), {})
            r[f[0] + "_ours"] = float(f[3])
            r[f[0]] = float(f[4])
            if f[0] == "pytorch" and len(f) >= 8:
                r["ours_cpu"], r["pytorch_cpu"] = float(f[6]), float(f[7])
    order = {s[0]: i for i, s in enumerate(SHAPES)}
    dims = {s[0]: s[1:4] for s in SHAPES}
    have_lt = any("libtorch" in r for r in rows.values())
    head = "| shape (B, T, E, H) | threads | headgrad | PyTorch (pip) | PyTorch / headgrad |"
    sep = "| --- | ---: | ---: | ---: | ---: |"
    if have_lt:
        head += " libtorch (C++) | libtorch / headgrad |"
        sep += " ---: | ---: |"
    head += " vs the faster | CPU-time ratio (PyTorch) | headgrad GFLOP/s | % of FP32 peak |"
    sep += " ---: | ---: | ---: | ---: |"
    print(head)
    print(sep)

    def us(t):
        return f"{t * 1e6:,.0f} µs" if t >= 1e-4 else f"{t * 1e6:.1f} µs"

    for (name, n) in sorted(rows, key=lambda k: (k[1], order.get(k[0], 99))):
        r = rows[(name, n)]
        B, T, E = dims[name]
        H = [s for s in SHAPES if s[0] == name][0][4]
        ours = r.get("pytorch_ours", r.get("libtorch_ours"))
        cells = [f"{name} ({B}, {T}, {E}, {H})", str(n), us(ours)]
        ratios = []
        for side in ["pytorch", "libtorch"] if have_lt else ["pytorch"]:
            if side in r:  # their time over ours, each measured interleaved with the other
                ratio = r[side] / r[side + "_ours"]
                ratios.append(ratio)
                cells += [us(r[side]), f"{ratio:.2f}×"]
            else:
                cells += ["–", "–"]
        cells.append(f"**{min(ratios):.2f}×**" if ratios else "–")
        cells.append(f"{r['pytorch_cpu'] / r['ours_cpu']:.2f}×" if "ours_cpu" in r else "–")
        gflops = flops(B, T, E) / ours / 1e9
        cells.append(f"{gflops:.1f}")
        # against CPU time (FLOPs per CPU-second of the process), robust to other processes' load
        cells.append(f"{100 * flops(B, T, E) / r['ours_cpu'] / 1e9 / peak:.0f} %" if peak and "ours_cpu" in r else "–")
        print("| " + " | ".join(cells) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ours", help="path to bench_attention, timed interleaved with PyTorch")
    p.add_argument("--shapes", default="all")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3, help="alternations of ours and PyTorch per shape")
    p.add_argument("--samples", type=int, default=5, help="samples per side per round")
    p.add_argument("--min-time", type=float, default=0.03, help="seconds per sample (at least one step)")
    p.add_argument("--micro", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--table", metavar="RESULTS")
    args = p.parse_args()
    if args.table:
        table(args)
    elif args.micro:
        micro(args)
    elif args.memory:
        memory(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
