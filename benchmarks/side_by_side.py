#!/usr/bin/env python3
"""Two builds of headgrad timed side by side: the same benchmarks, run alternately, medians.

    python3 benchmarks/side_by_side.py BEFORE_BUILD AFTER_BUILD [--rounds N] [--threads N]

Each build directory must hold benchmarks/bench_engine and benchmarks/bench_attention (built
with `cmake --build DIR --target bench_engine bench_attention`). Each round runs bench_engine
(op, backward, core, train) and bench_attention (toy, medium, large) of one build, then of the
other, in turns, so that a slow spell of a shared machine falls on both. Prints, per
measurement, the median of each build's rounds and after/before (above 1: after is slower), and
the allocations per step of each; a time ratio is noise unless it is far from 1 on every round.
"""
import argparse
import os
import statistics
import subprocess
import sys


def run(build, threads):
    """{(bench, measurement): (value, unit)} from one run of both benchmarks of a build."""
    out = {}
    bench = os.path.join(build, "benchmarks")
    engine = [os.path.join(bench, "bench_engine"), "--tsv", "--threads", str(threads), "op", "backward", "core", "train"]
    attention = [os.path.join(bench, "bench_attention"), "--tsv", "--threads", str(threads),
                 "--shapes", "toy,medium,large", "--samples", "7"]
    for cmd in (engine, attention):
        text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        for line in text.splitlines():
            fields = line.split("\t")
            if len(fields) < 4 or line.startswith("#"):
                continue
            if fields[0] == "ours":  # bench_attention: ours, shape, threads, median seconds, GFLOP/s, ...
                out[("attention", f"{fields[1]} step, {fields[2]} thread(s)")] = (float(fields[3]) * 1e6, "µs")
                continue
            try:
                value = float(fields[-2])
            except ValueError:
                continue
            out[(fields[0], "\t".join(fields[1:-2]))] = (value, fields[-1])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    runs = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for side in order:
            runs[side].append(run(getattr(args, side), args.threads))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    keys = [k for k in runs["before"][0] if all(k in x for x in runs["before"] + runs["after"])]
    print(f"# {args.before} (before) against {args.after} (after), {args.rounds} alternating rounds, "
          f"{args.threads} thread(s); medians")
    print(f"{'measurement':70s} {'before':>12s} {'after':>12s} {'after/before':>13s}")
    for k in keys:
        b = statistics.median(x[k][0] for x in runs["before"])
        a = statistics.median(x[k][0] for x in runs["after"])
        unit = runs["before"][0][k][1]
        ratio = f"{a / b:13.3f}" if b else f"{'-':>13s}"
        name = f"{k[0]}: {k[1]}".replace("\t", " ")[:62] + f" [{unit}]"
        print(f"{name:70s} {b:12.4g} {a:12.4g} {ratio}")


if __name__ == "__main__":
    main()
