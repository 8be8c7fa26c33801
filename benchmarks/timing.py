"""Timing helpers the PyTorch-side benchmark scripts share, as bench_common.hpp's calibrate and
sample do for ours: how many calls make one sample last `min_time` seconds, the median of calls
timed one by one, and our benchmark's samples read from its --tsv lines."""
import statistics
import subprocess
import time


def calibrate(f, min_time):
    """The number of calls of f that take about min_time seconds (at least one)."""
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        t = time.perf_counter() - t0
        if t >= min_time or reps >= 1 << 24:
            return max(1, int(round(min_time / (t / reps)))) if t > 0 else reps
        reps *= 8 if t < min_time / 16 else 2


def sample(f, reps, clock=time.perf_counter):
    """The median time of `reps` calls, each timed alone; clock=time.process_time gives process
    CPU seconds (steadier on a loaded machine)."""
    t = []
    for _ in range(reps):
        t0 = clock()
        f()
        t.append(clock() - t0)
    return statistics.median(t)


def ours_samples(cmd, key, columns):
    """Runs one of our benchmarks (cmd, with --tsv) and returns, from its line "ours<TAB>key<TAB>...",
    the comma-separated samples of each of `columns` (field indices) as lists of floats."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split("\t")
        if f[0] == "ours" and f[1] == key:
            return [[float(s) for s in f[i].split(",")] for i in columns]
    raise RuntimeError(f"no result from {' '.join(cmd)}:\n{out}")
