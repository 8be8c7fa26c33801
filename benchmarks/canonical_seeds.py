"""Runs the canonical experiments over several seeds and prints one line per seed with the goals.

  python3 benchmarks/canonical_seeds.py --induction build/examples/induction_heads/induction_heads \
      --grokking build/examples/grokking/grokking [--seeds 1-7] [--grokking-args "--quick"]

Induction (examples/induction_heads, default settings): the previous-token and induction scores,
K-composition against its baseline, the three path ablations and the phase change. Grokking
(examples/grokking, --quick unless --grokking-args says otherwise): the steps at which it memorises and
groks, the test-loss peak, the final test loss and the key frequencies. Each run writes its summary to a
temporary directory; nothing but the table is kept. Only the standard library is used.
"""
import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path


def seeds_of(text):
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def run(binary, args, summary):
    cmd = [binary, *args, "--summary", str(summary), "--quiet"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(summary.read_text())


def induction_line(seed, s):
    ab = s["path_ablation"]
    goals_met = all(g["met"] for g in s["goals"])
    return (f"{seed:>4} {prev_score(s):>8.3f}"
            f" {ind_score(s):>8.3f} {s['k_composition']:>7.3f} {s['k_composition_baseline']:>7.3f}"
            f" {ab['keys']['relative_change'] * 100:>+7.1f}% {ab['queries']['relative_change'] * 100:>+7.1f}%"
            f" {ab['values']['relative_change'] * 100:>+7.1f}% {s['phase_change_step']:>6} {s['train_seconds']:>6.1f}"
            f"  {'yes' if goals_met else 'NO'}")


def head(s, layer_head, field):
    for h in s["heads"]:
        if [h["layer"], h["head"]] == list(layer_head):
            return h[field]
    raise KeyError(layer_head)


def prev_score(s):
    return head(s, s["previous_token_head"], "previous_token_score")


def ind_score(s):
    return head(s, s["induction_head"], "induction_score")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--induction")
    ap.add_argument("--grokking")
    ap.add_argument("--seeds", default="1-5")
    ap.add_argument("--grokking-args", default="--quick")
    a = ap.parse_args()
    if not a.induction and not a.grokking:
        sys.exit("give --induction and/or --grokking")
    seeds = seeds_of(a.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        if a.induction:
            print("induction_heads: goals prev >= 0.5, induction >= 0.7, K-comp >= 1.3x baseline, "
                  "keys cut >= 30 %, queries and values cut < 10 %")
            print(f"{'seed':>4} {'prev':>8} {'induct':>8} {'K-comp':>7} {'base':>7} {'keys':>8} {'queries':>8}"
                  f" {'values':>8} {'phase':>6} {'train s':>6}  all met")
            for seed in seeds:
                s = run(a.induction, ["--seed", str(seed)], Path(tmp) / f"induction_{seed}.json")
                print(induction_line(seed, s), flush=True)
        if a.grokking:
            print(f"grokking {a.grokking_args}: goals memorised before 1,000, groks in 5,000 .. 25,000 (full run), "
                  "test loss < 0.01, 3-7 key frequencies")
            print(f"{'seed':>4} {'memorised':>9} {'grokked':>8} {'peak test loss':>15} {'at step':>8}"
                  f" {'final test loss':>16} {'steps/s':>8}  key frequencies")
            for seed in seeds:
                s = run(a.grokking, [*shlex.split(a.grokking_args), "--seed", str(seed)],
                        Path(tmp) / f"grokking_{seed}.json")
                peak = s["test_loss_peak"]
                print(f"{seed:>4} {str(s['memorized_step']):>9} {str(s['grokked_step']):>8}"
                      f" {peak['loss']:>15.2f} {peak['step']:>8} {s['test_loss']:>16.2e}"
                      f" {s['steps'] / s['train_seconds']:>8.1f}  {s['key_frequencies']}", flush=True)


if __name__ == "__main__":
    main()
