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
  compare_torch.py --table RESULTS.tsv              the docs/benchmarks.md table from run.sh's results

Long sequences (benchmarks/long_attention.sh; shape groups `long` and `memory`, not in `all`):
  compare_torch.py --ours BIN --shapes long --step-memory --cpu-samples 0 --max-gib 8
        as above, and the peak resident memory of one step above each process's baseline (one
        more step after the warm-up: Linux's VmHWM after writing "5" to /proc/self/clear_refs,
        less VmRSS just before the step, with the free heap handed back first; bench_attention's
        peak_memory.hpp does the same) and our attention part's GFLOP/s: the line gains
        <our peak MiB> <PyTorch peak MiB> <our attention GFLOP/s>
  compare_torch.py --ours BIN --shapes memory --memory-only --threads 1
        only the peak memory of one step, no timing: memory <shape> <threads> <ours> <PyTorch>
        (PyTorch's varies by some MiB from step to step: the median of --memory-steps steps, and
        with --step-memory of one step per round; ours is the same to 0.1 MiB every time)
  compare_torch.py --long-table RESULTS.tsv         the docs/benchmarks.md tables from long_attention.sh's results
  compare_torch.py --kernels --shapes long          the attention kernels PyTorch's step calls
  compare_torch.py --memory-check                   the peak-memory measure on a known 256 MiB tensor
  --max-gib G: a process whose resident memory passes G GiB is stopped; its side reads `over`
  --dropout P: both sides train with dropout P on the attention weights (nn.MultiheadAttention's
        dropout, bench_attention --dropout); PyTorch's step then runs its O(T^2) math path
"""
import argparse
import ctypes
import gc
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from timing import calibrate

SHAPES = [  # name, B, T, E, H, causal, group (as bench_common.hpp; `all` is the short group)
    ("seed", 1, 2, 4, 2, False, "short"),
    ("tiny", 1, 8, 32, 4, False, "short"),
    ("toy", 8, 32, 64, 4, False, "short"),
    ("medium", 16, 128, 128, 4, False, "short"),
    ("large", 8, 256, 384, 6, False, "short"),
    ("medium-causal", 16, 128, 128, 4, True, "short"),
    ("large-causal", 8, 256, 384, 6, True, "short"),
    ("long-1k", 2, 1024, 256, 4, False, "long"),
    ("long-4k-causal", 1, 4096, 256, 4, True, "long"),
    ("long-8k-causal", 1, 8192, 256, 4, True, "long"),
    ("long-16k-causal", 1, 16384, 128, 2, True, "long"),
    ("mem-1k", 1, 1024, 256, 4, True, "memory"),
    ("mem-2k", 1, 2048, 256, 4, True, "memory"),
    ("mem-4k", 1, 4096, 256, 4, True, "memory"),
    ("mem-8k", 1, 8192, 256, 4, True, "memory"),
    ("mem-16k", 1, 16384, 256, 4, True, "memory"),
]


def selected(shapes):
    """The SHAPES rows that a --shapes list names, by name or group (`all` = the short group)."""
    wanted = set(shapes.split(","))
    unknown = wanted - {s[0] for s in SHAPES} - {s[6] for s in SHAPES} - {"all"}
    if unknown:
        raise SystemExit(f"compare_torch.py: unknown shapes {sorted(unknown)}")
    return [s for s in SHAPES if s[0] in wanted or s[6] in wanted or (s[6] == "short" and "all" in wanted)]


def attention_core_flops(B, T, E, causal):
    """Same count as bench_common.hpp: Q K^T and P V forward and their four backward products,
    12 B T^2 E; causal: the T (T + 1) / 2 pairs at or below the diagonal."""
    return 12.0 * B * (T * (T + 1) / 2 if causal else T * T) * E


# ---- peak memory of one step (Linux /proc), as benchmarks/peak_memory.hpp ----
def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def release_free_heap():
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_mib_above_baseline(f):
    """MiB by which f() raised the resident memory at its peak above VmRSS just before it."""
    release_free_heap()
    try:
        with open("/proc/self/clear_refs", "w") as c:
            c.write("5")
    except OSError:
        return float("nan")
    base = status_mib("VmRSS")
    f()
    return status_mib("VmHWM") - base


_limit = {}


def resident_limit(max_gib, message):
    """A daemon thread that ends the process (exit code 3) when its resident memory passes
    max_gib GiB, printing message first; PyTorch's kernels release the GIL, so it runs during a
    step. max_gib <= 0: nothing."""
    if max_gib <= 0:
        return
    page = os.sysconf("SC_PAGE_SIZE")

    def watch():
        while True:
            with open("/proc/self/statm") as f:
                if int(f.read().split()[1]) * page > max_gib * 2**30:
                    print(_limit["message"], flush=True)
                    os._exit(3)
            time.sleep(0.01)

    # One watcher per process: later calls only change the message.
    _limit["message"] = message
    if not _limit.get("started"):
        _limit["started"] = True
        threading.Thread(target=watch, daemon=True).start()


def flops(B, T, E):
    """Same count as bench_common.hpp: 3 * (8 B T E^2 + 4 B T^2 E), dense."""
    return 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E)


def make_step(B, T, E, H, causal, dropout=0.0):
    import torch
    from torch import nn

    torch.manual_seed(42)
    mha = nn.MultiheadAttention(E, H, dropout=dropout, batch_first=True)  # training mode
    x = torch.randn(B, T, E, requires_grad=True)
    mask = nn.Transformer.generate_square_subsequent_mask(T) if causal else None

    def step():
        mha.zero_grad()
        x.grad = None
        out, _ = mha(x, x, x, need_weights=False, attn_mask=mask, is_causal=causal)
        out.sum().backward()

    return step


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


def ours_command(args, shape, threads, *extra):
    cmd = [args.ours, "--tsv", "--shapes", shape, "--threads", str(threads), *extra]
    if args.dropout > 0:
        cmd += ["--dropout", str(args.dropout)]
    if args.max_gib > 0:
        cmd += ["--max-gib", str(args.max_gib)]
    return cmd


def run_ours(args, shape, threads):
    """Our samples, median CPU seconds, peak MiB and attention GFLOP/s (NaN when not asked for);
    None when the process passed --max-gib."""
    extra = ["--samples", str(args.samples), "--min-time", str(args.min_time)]
    if args.cpu_samples is not None:
        extra += ["--cpu-samples", str(args.cpu_samples)]
    if args.step_memory:
        extra += ["--memory", "--attention-flops"]
    cmd = ours_command(args, shape, threads, *extra)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 3 and proc.stdout.startswith("over"):
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    for line in proc.stdout.splitlines():
        f = line.split("\t")
        if f[0] == "ours" and f[1] == shape:
            nums = [float(v) for v in f[6:9]] + [float("nan")] * 3
            return [float(v) for v in f[5].split(",")], nums[0], nums[1], nums[2]
    raise RuntimeError(f"no result from {' '.join(cmd)}:\n{proc.stdout}")


def median_or_nan(v):
    return statistics.median(v) if v else float("nan")


def compare(args):
    import torch

    threads = [int(t) for t in args.threads.split(",")]
    print(f"# torch {torch.__version__}, nn.MultiheadAttention(batch_first=True, dropout={args.dropout}), "
          "need_weights=False", file=sys.stderr)
    for n in threads:
        torch.set_num_threads(n)
        for name, B, T, E, H, causal, group in selected(args.shapes):
            resident_limit(args.max_gib, f"over\t{name}\t{n}\t{args.max_gib}")
            step = make_step(B, T, E, H, causal, args.dropout)
            for _ in range(3 if group == "short" else 1):
                step()
            t0 = time.perf_counter()
            mem = peak_mib_above_baseline(step) if args.step_memory else float("nan")
            t_memory_step = time.perf_counter() - t0
            # A long shape's step takes seconds: one call a sample, as bench_attention does.
            one_call = group != "short" and args.step_memory and t_memory_step >= args.min_time
            reps = 1 if one_call else calibrate(step, args.min_time)
            n_cpu = max(1, args.samples // 2) if args.cpu_samples is None else args.cpu_samples
            theirs, ours, ours_cpu, theirs_cpu, ours_mem, ours_attn = [], [], [], [], [], []
            theirs_mem = [mem]
            over = False
            for r in range(args.rounds):
                if args.step_memory and r > 0:  # PyTorch's figure varies by some MiB from step to step
                    theirs_mem.append(peak_mib_above_baseline(step))
                if args.ours and not over:
                    r = run_ours(args, name, n)
                    if r is None:
                        over = True
                    else:
                        ours += r[0]
                        ours_cpu.append(r[1])
                        ours_mem.append(r[2])
                        ours_attn.append(r[3])
                theirs += samples(step, reps, args.samples)
                if n_cpu > 0:
                    theirs_cpu += samples(step, reps, n_cpu, clock=time.process_time)
            del step
            t, tc = statistics.median(theirs), median_or_nan(theirs_cpu)
            if over:
                line = f"pytorch\t{name}\t{n}\tover\t{t:.9g}\t\t\t{tc:.9g}"
            elif args.ours:
                o, oc = statistics.median(ours), median_or_nan(ours_cpu)
                line = f"pytorch\t{name}\t{n}\t{o:.9g}\t{t:.9g}\t{t / o:.4g}\t{oc:.9g}\t{tc:.9g}"
            else:
                line = f"pytorch\t{name}\t{n}\t\t{t:.9g}\t\t\t{tc:.9g}"
            if args.step_memory:
                om = "over" if over else f"{median_or_nan(ours_mem):.1f}"
                line += f"\t{om}\t{statistics.median(theirs_mem):.1f}\t{median_or_nan(ours_attn):.4g}"
            print(line, flush=True)


def memory_only(args):
    """Peak memory of one step, ours (a subprocess) and PyTorch's, no timing."""
    import torch

    for n in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(n)
        for name, B, T, E, H, causal, _ in selected(args.shapes):
            ours = "nan"
            if args.ours:
                proc = subprocess.run(ours_command(args, name, n, "--memory-only"), capture_output=True, text=True)
                if proc.returncode == 3 and proc.stdout.startswith("over"):
                    ours = "over"
                elif proc.returncode != 0:
                    raise RuntimeError(f"bench_attention {name} failed:\n{proc.stdout}{proc.stderr}")
                else:
                    ours = proc.stdout.split("\t")[3].strip()
            resident_limit(args.max_gib, f"memory\t{name}\t{n}\t{ours}\tover")
            step = make_step(B, T, E, H, causal, args.dropout)
            step()
            # PyTorch's figure varies by some MiB from step to step (ours does not): a median.
            mem = statistics.median(peak_mib_above_baseline(step) for _ in range(args.memory_steps))
            del step
            print(f"memory\t{name}\t{n}\t{ours}\t{mem:.1f}", flush=True)


def memory_check(args):
    """The peak-memory measure against a tensor of known size (256 MiB, every page written)."""
    import torch

    mib = peak_mib_above_baseline(lambda: torch.ones(64 << 20, dtype=torch.float32))
    print(f"peak memory of a 256 MiB torch tensor, measured: {mib:.1f} MiB")


def kernels(args):
    """The attention-related ATen ops one training step calls, per shape (one thread)."""
    import torch
    from torch.profiler import profile

    torch.set_num_threads(1)
    for name, B, T, E, H, causal, _ in selected(args.shapes):
        step = make_step(B, T, E, H, causal)
        step()
        with profile() as prof:
            step()
        ops = sorted({e.name for e in prof.events()
                      if any(k in e.name for k in ("attention", "softmax", "bmm", "baddbmm"))})
        print(f"{name}\t{', '.join(ops)}", flush=True)


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


def long_table(args):
    """Markdown tables from long_attention.sh's results: the long shapes' times, peak memory and
    attention GFLOP/s, and the memory series."""
    peak, rows, mem, over = None, [], [], []
    for line in open(args.long_table):
        f = line.rstrip("\n").split("\t")
        if f[0] == "peak":
            peak = float(f[1])
        elif f[0] == "pytorch" and len(f) >= 11:
            rows.append(f)
        elif f[0] == "memory":
            mem.append(f)
        elif f[0] == "over":  # PyTorch's process passed --max-gib during the timed step
            over.append(f)
    dims = {s[0]: s[1:6] for s in SHAPES}
    order = {s[0]: i for i, s in enumerate(SHAPES)}

    def ms(v):
        return "over the limit" if v == "over" else f"{float(v) * 1e3:,.0f} ms"

    def mib(v):
        return "over the limit" if v == "over" else f"{float(v):,.0f} MiB"

    print("| shape (B, T, E, H) | threads | headgrad | PyTorch (pip) | PyTorch / headgrad | headgrad peak |"
          " PyTorch peak | headgrad attention GFLOP/s | % of FP32 peak |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for f in sorted(rows, key=lambda f: (int(f[2]), order.get(f[1], 99))):
        B, T, E, H, causal = dims[f[1]]
        n = int(f[2])
        ratio = f"{float(f[5]):.2f}×" if f[5] else "–"
        attn = float(f[10])
        pct = f"{100 * attn / (n * peak):.0f} %" if peak and attn == attn else "–"
        print(f"| ({B}, {T}, {E}, {H}){' causal' if causal else ''} | {n} | {ms(f[3])} | {ms(f[4])} | {ratio} |"
              f" {mib(f[8])} | {mib(f[9])} | {attn:.1f} | {pct} |")
    for f in over:
        B, T, E, H, causal = dims[f[1]]
        print(f"| ({B}, {T}, {E}, {H}){' causal' if causal else ''} | {f[2]} | – | over {f[3]} GiB | – | – | – | – | – |")
    if mem:
        print()
        print("| T | (B, E, H) | headgrad peak | PyTorch peak | threads |")
        print("| ---: | --- | ---: | ---: | ---: |")
        for f in sorted(mem, key=lambda f: (int(f[2]), order.get(f[1], 99))):
            B, T, E, H, causal = dims[f[1]]
            print(f"| {T:,} | ({B}, {E}, {H}){' causal' if causal else ''} | {mib(f[3])} | {mib(f[4])} | {f[2]} |")


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
    p.add_argument("--step-memory", action="store_true",
                   help="also the peak memory of one step (both sides) and our attention GFLOP/s")
    p.add_argument("--memory-only", action="store_true", help="only the peak memory of one step")
    p.add_argument("--memory-steps", type=int, default=3,
                   help="--memory-only: PyTorch's figure is the median of this many steps (default 3)")
    p.add_argument("--cpu-samples", type=int, default=None,
                   help="CPU-time samples per side per round (default samples // 2 here, bench_attention's own)")
    p.add_argument("--max-gib", type=float, default=0.0, help="stop a side whose resident memory passes G GiB")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout probability on the attention weights, both sides (default 0; PyTorch then "
                        "leaves its flash kernel for the math path)")
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--memory-check", action="store_true", help="measure a known 256 MiB tensor")
    p.add_argument("--long-table", metavar="RESULTS")
    args = p.parse_args()
    if args.table:
        table(args)
    elif args.long_table:
        long_table(args)
    elif args.memory_check:
        memory_check(args)
    elif args.kernels:
        kernels(args)
    elif args.memory_only:
        memory_only(args)
    elif args.micro:
        micro(args)
    elif args.memory:
        memory(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
