#!/usr/bin/env python3
"""The character-level GPT of examples/char_gpt in PyTorch, as the peer of the C++ program.

Same corpus and vocabulary, same split, same batches (the batch sampler's SplitMix64 generator is
implemented here bit for bit), same architecture (token + position embeddings, pre-LayerNorm
blocks with causal self-attention and a GELU MLP, a final LayerNorm, a linear head tied to the
token embedding), same initialisation scheme (nanoGPT's: N(0, 0.02) weights, the residual
projections N(0, 0.02 / sqrt(2 n_layer)), zero biases), same optimizer (AdamW, weight decay on
the 2-D parameters only), schedule (linear warmup, cosine decay to min_lr) and gradient clipping.

  char_gpt_torch.py train [--n-layer 4 ...] [--summary FILE]
        trains like `char_gpt` and prints the same progress lines; --summary writes the losses
  char_gpt_torch.py bench --steps N [--threads T] [--warmup W]
        times N training steps after W warm-up steps; prints one TSV line per step time
  char_gpt_torch.py table RESULTS_DIR
        the tables of benchmarks/char_gpt.sh's results (speed.tsv, *_seed<S>.json)
  char_gpt_torch.py parity --init FILE --batches N
        loads the initial parameters the C++ side saved (`char_gpt --save-init FILE`) and prints the
        first N training losses, to compare with the C++ run's

Flags follow nanoGPT's names (--n-layer --n-head --n-embd --block-size --batch-size --max-iters
--lr --dropout --eval-interval --eval-iters ...), with the C++ program's defaults.
"""
import argparse
import json
import warnings
import math
import os
import resource
import stat
import statistics
import sys
import time

MASK64 = (1 << 64) - 1
EVAL_SEED = 0x6576616C  # the evaluation batches' generator seed ("eval"); the same for every run
DEFAULT_DATA = "/usr/share/games/fortunes"
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # pip's torch without numpy


class SplitMix64:
    """ag::Generator's next_u64 (SplitMix64), bit for bit."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def corpus_files(path):
    """A directory's regular files sorted by name (bytes), skipping the fortune index files
    (*.dat) and the *.u8 links; or the one file given."""
    if not os.path.isdir(path):
        return [path]
    names = sorted(os.listdir(os.fsencode(path)))
    out = []
    for n in names:
        if n.endswith(b".dat") or n.endswith(b".u8"):
            continue
        full = os.path.join(os.fsencode(path), n)
        if stat.S_ISREG(os.lstat(full).st_mode):
            out.append(full)
    return out


def load_corpus(path):
    data = b"".join(open(f, "rb").read() for f in corpus_files(path))
    return data.decode("utf-8")


class Data:
    def __init__(self, path):
        import torch

        text = load_corpus(path)
        self.chars = sorted(set(text))
        # Token ids through a str -> bytes translation (vocabularies up to 256), which keeps the
        # peak memory of a multi-MB corpus small; a list of Python ints would take ~30x the text.
        if len(self.chars) <= 256:
            table = {ord(c): i for i, c in enumerate(self.chars)}
            ids = torch.frombuffer(bytearray(text.translate(table).encode("latin-1")), dtype=torch.uint8).long()
        else:
            index = {c: i for i, c in enumerate(self.chars)}
            ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
        del text
        n_train = len(ids) * 9 // 10
        self.train, self.val = ids[:n_train], ids[n_train:]

    def batch(self, split, gen, B, T):
        import torch

        data = self.train if split == "train" else self.val
        n = len(data) - T
        ix = [gen.next_u64() % n for _ in range(B)]
        x = torch.stack([data[i : i + T] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
        return x, y


def build_model(cfg, vocab):
    import torch
    from torch import nn
    from torch.nn import functional as F

    E, H, L = cfg.n_embd, cfg.n_head, cfg.n_layer

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(E, 3 * E, bias=cfg.bias)
            self.c_proj = nn.Linear(E, E, bias=cfg.bias)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(E, dim=2)
            q, k, v = (t.view(B, T, H, E // H).transpose(1, 2) for t in (q, k, v))
            p = cfg.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, E))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(E)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(E)
            self.c_fc = nn.Linear(E, 4 * E, bias=cfg.bias)
            self.c_proj = nn.Linear(4 * E, E, bias=cfg.bias)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, E)
            self.wpe = nn.Embedding(cfg.block_size, E)
            self.drop = nn.Dropout(cfg.dropout)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(E)
            self.lm_head = nn.Linear(E, vocab, bias=False)
            if cfg.tie_weights:
                self.lm_head.weight = self.wte.weight
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                        nn.init.ones_(p)
                    else:
                        nn.init.zeros_(p)
                else:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, dtype=torch.int64)
            x = self.drop(self.wte(idx) + self.wpe(pos))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def make_optimizer(cfg, model):
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = {"fused": True} if cfg.fused_adamw else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, **kwargs)


def lr_at(cfg, step):
    """nn::warmup_cosine_lr(lr, warmup_iters, lr_decay_iters, min_lr)."""
    decay_iters = cfg.lr_decay_iters if cfg.lr_decay_iters > 0 else cfg.max_iters
    if step < cfg.warmup_iters:
        return cfg.lr * (step + 1) / cfg.warmup_iters
    if step >= decay_iters:
        return cfg.min_lr
    progress = (step - cfg.warmup_iters) / (decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


class Trainer:
    def __init__(self, cfg, data=None):
        import torch

        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.data = data if data is not None else Data(cfg.data)
        self.model = build_model(cfg, len(self.data.chars))
        self.opt = make_optimizer(cfg, self.model)
        self.gen = SplitMix64(cfg.seed ^ 0x6261746368)  # the batch sampler's seed, as char_gpt's
        self.step_count = 0

    def train_step(self):
        import torch

        cfg = self.cfg
        for g in self.opt.param_groups:
            g["lr"] = lr_at(cfg, self.step_count)
        x, y = self.data.batch("train", self.gen, cfg.batch_size, cfg.block_size)
        loss = self.model(x, y)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.step_count += 1
        return loss.item()

    def evaluate(self, split):
        import torch

        cfg = self.cfg
        gen = SplitMix64(EVAL_SEED + (0 if split == "train" else 1))
        self.model.eval()
        with torch.no_grad():
            losses = [self.model(*self.data.batch(split, gen, cfg.batch_size, cfg.block_size)).item()
                      for _ in range(cfg.eval_iters)]
        self.model.train()
        return sum(losses) / len(losses)

    def full_val_loss(self):
        """Mean loss over the whole validation split in consecutive windows of block_size."""
        import torch

        T, data = self.cfg.block_size, self.data.val
        starts = list(range(0, len(data) - T, T))
        total = 0.0
        self.model.eval()
        with torch.no_grad():
            for k in range(0, len(starts), self.cfg.batch_size):
                chunk = starts[k : k + self.cfg.batch_size]
                x = torch.stack([data[i : i + T] for i in chunk])
                y = torch.stack([data[i + 1 : i + 1 + T] for i in chunk])
                total += self.model(x, y).item() * len(chunk)
        self.model.train()
        return total / len(starts)


def train(cfg):
    t = Trainer(cfg)
    tokens = cfg.batch_size * cfg.block_size
    history = {"train": [], "eval": []}

    def evaluate():
        tr, va = t.evaluate("train"), t.evaluate("val")
        history["eval"].append({"step": t.step_count, "train": tr, "val": va})
        print(f"step {t.step_count}: train loss {tr:.4f}, val loss {va:.4f}", flush=True)

    print(f"corpus: {len(t.data.train) + len(t.data.val)} characters, vocabulary {len(t.data.chars)}; "
          f"{sum(p.numel() for p in t.model.parameters())} parameters", flush=True)
    evaluate()
    start = time.perf_counter()
    while t.step_count < cfg.max_iters:
        t0 = time.perf_counter()
        loss = t.train_step()
        dt = time.perf_counter() - t0
        history["train"].append(loss)
        if t.step_count % cfg.log_interval == 0:
            print(f"step {t.step_count}: loss {loss:.4f}, {tokens / dt:.0f} tokens/s", flush=True)
        if t.step_count % cfg.eval_interval == 0 or t.step_count == cfg.max_iters:
            evaluate()
    seconds = time.perf_counter() - start
    full = t.full_val_loss()
    print(f"full validation loss {full:.4f} after {t.step_count} steps, {seconds:.1f} s", flush=True)
    if cfg.summary:
        with open(cfg.summary, "w") as f:
            json.dump({"implementation": "pytorch", "seed": cfg.seed, "steps": t.step_count,
                       "train_losses": history["train"], "evals": history["eval"], "full_val_loss": full,
                       "seconds": seconds, "peak_rss_mib": peak_rss_mib()}, f)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)


def bench(cfg):
    import torch  # noqa: F401  (the library's own memory counts before the model's)

    data = Data(cfg.data)
    rss_data = current_rss_mib()
    t = Trainer(cfg, data)
    for _ in range(cfg.warmup):
        t.train_step()
    rss_warm = peak_rss_mib()
    times, cpu = [], []
    for _ in range(cfg.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        t.train_step()
        cpu.append(time.process_time() - c0)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"pytorch\t{cfg.threads}\t{cfg.n_layer}\t{cfg.n_embd}\t{cfg.block_size}\t{cfg.batch_size}\t"
          f"{med * 1e3:.3f}\t{1.0 / med:.3f}\t{peak_rss_mib():.1f}\t{rss_warm:.1f}\t{statistics.median(cpu) * 1e3:.3f}"
          f"\t{peak_rss_mib() - rss_data:.1f}", flush=True)


def parity(cfg):
    """Loads the C++ side's initial parameters and prints the first losses on the shared batches."""
    import torch
    from safetensors.torch import load_file

    t = Trainer(cfg)
    ours = load_file(cfg.init)
    with torch.no_grad():
        sd = t.model.state_dict()
        def put(name, value):
            if sd[name].shape != value.shape:
                raise SystemExit(f"parity: {name} is {tuple(sd[name].shape)}, the file's {tuple(value.shape)}")
            sd[name].copy_(value)
        put("wte.weight", ours["wte.weight"])
        put("wpe.weight", ours["wpe.weight"])
        put("ln_f.weight", ours["ln_f.weight"])
        put("ln_f.bias", ours["ln_f.bias"])
        if not cfg.tie_weights:
            put("lm_head.weight", ours["lm_head.weight"].t())
        for i in range(cfg.n_layer):
            h = f"h.{i}."  # the same block names on both sides; the layouts differ
            for ln in ("ln_1", "ln_2"):
                put(h + ln + ".weight", ours[h + ln + ".weight"])
                put(h + ln + ".bias", ours[h + ln + ".bias"])
            qkv = torch.cat([ours[h + "attn.W_" + n] for n in "QKV"], dim=1)  # (E, 3E), x·W layout
            put(h + "attn.c_attn.weight", qkv.t())
            put(h + "attn.c_proj.weight", ours[h + "attn.W_O"].t())
            put(h + "c_fc.weight", ours[h + "fc_1.weight"].t())
            put(h + "c_proj.weight", ours[h + "fc_2.weight"].t())
            if cfg.bias:
                put(h + "attn.c_attn.bias", torch.cat([ours[h + "attn.b_" + n] for n in "QKV"]))
                put(h + "attn.c_proj.bias", ours[h + "attn.b_O"])
                put(h + "c_fc.bias", ours[h + "fc_1.bias"])
                put(h + "c_proj.bias", ours[h + "fc_2.bias"])
    for _ in range(cfg.batches):
        print(f"{t.train_step():.6f}")


def table(cfg):
    """The tables of docs/benchmarks.md and docs/char_gpt.md, from benchmarks/char_gpt.sh's results."""
    speed_file = os.path.join(cfg.results, "speed.tsv")
    if os.path.exists(speed_file):
        rows = {}
        for line in open(speed_file):
            if line.startswith("#") or not line.strip():
                continue
            f = line.rstrip("\n").split("\t")
            rows.setdefault((f[0], int(f[2])), {}).setdefault(f[1], []).append(f)
        print("| config | threads | headgrad steps/s | PyTorch steps/s | PyTorch / headgrad (wall) | (CPU time) "
              "| heap allocations per warm step | peak RSS headgrad / PyTorch | training memory headgrad / PyTorch |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for (name, threads), sides in sorted(rows.items(), key=lambda kv: (kv[0][0] != "cpu", kv[0][1])):
            if "headgrad" not in sides or "pytorch" not in sides:
                continue
            ours, theirs = sides["headgrad"], sides["pytorch"]
            ms_ours = statistics.median(float(r[7]) for r in ours)
            ms_theirs = statistics.median(float(r[7]) for r in theirs)
            cpu_ours = statistics.median(float(r[11]) for r in ours)
            cpu_theirs = statistics.median(float(r[11]) for r in theirs)
            allocs = max(float(r[13]) for r in ours)
            rss_ours = max(float(r[9]) for r in ours)
            rss_theirs = max(float(r[9]) for r in theirs)
            train_ours = max(float(r[12]) for r in ours)
            train_theirs = max(float(r[12]) for r in theirs)
            print(f"| {name} | {threads} | {1e3 / ms_ours:.2f} | {1e3 / ms_theirs:.2f} | {ms_theirs / ms_ours:.2f}x "
                  f"| {cpu_theirs / cpu_ours:.2f}x | {allocs:g} | {rss_ours:.0f} / {rss_theirs:.0f} MiB "
                  f"| {train_ours:.0f} / {train_theirs:.0f} MiB |")
    runs = {}
    for name in sorted(os.listdir(cfg.results)):
        if name.endswith(".json") and "_seed" in name:
            impl, seed = name[:-5].split("_seed")
            runs.setdefault(int(seed), {})[impl] = json.load(open(os.path.join(cfg.results, name)))
    if runs:
        print()
        print("| seed | headgrad: full val loss | PyTorch: full val loss | headgrad: val loss (eval batches) "
              "| PyTorch: val loss (eval batches) | headgrad time | PyTorch time |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        means = {"headgrad": [], "pytorch": []}
        for seed, r in sorted(runs.items()):
            cells = []
            for impl in ("headgrad", "pytorch"):
                full = r.get(impl, {}).get("full_val_loss")
                cells.append(f"{full:.4f}" if full is not None else "-")
                if full is not None:
                    means[impl].append(full)
            for impl in ("headgrad", "pytorch"):
                ev = r.get(impl, {}).get("evals", [])
                last = ev[-1] if ev else None
                cells.append(f"{last['val']:.4f} (step {last['step']})" if last else "-")
            for impl in ("headgrad", "pytorch"):
                cells.append(f"{r[impl]['seconds']:.0f} s" if impl in r else "-")
            print(f"| {seed} | " + " | ".join(cells) + " |")
        if means["headgrad"] and means["pytorch"]:
            a, b = statistics.mean(means["headgrad"]), statistics.mean(means["pytorch"])
            print(f"| mean | {a:.4f} | {b:.4f} | | | | |")
            print(f"\nheadgrad's mean minus PyTorch's: {a - b:+.4f}")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["train", "bench", "parity", "table"])
    p.add_argument("results", nargs="?", default="", help="table: benchmarks/char_gpt.sh's results directory")
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup-iters", type=int, default=100)
    p.add_argument("--lr-decay-iters", type=int, default=0, help="0: --max-iters")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--bias", action="store_true")
    p.add_argument("--no-tie-weights", dest="tie_weights", action="store_false")
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True)")
    p.add_argument("--summary", default="")
    p.add_argument("--steps", type=int, default=20, help="bench: timed steps")
    p.add_argument("--warmup", type=int, default=5, help="bench: untimed steps first")
    p.add_argument("--init", default="", help="parity: the C++ side's initial parameters")
    p.add_argument("--batches", type=int, default=5, help="parity: losses to print")
    return p.parse_args(argv)


def main(argv):
    cfg = parse(argv)
    {"train": train, "bench": bench, "parity": parity, "table": table}[cfg.mode](cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
