"""PyTorch <-> headgrad state_dict interop, checked both ways (tests/nn/test_torch_state_dict.cpp).

    python3 tests/data/torch_interop/make_fixtures.py [BUILD_DIR]     (needs: pip install torch safetensors)

1. PyTorch -> headgrad: for each case below, builds the torch.nn module in float64 with random
   parameters (every parameter drawn, biases and LayerNorm weights included, so that a value
   put in the wrong place shows), runs it on random inputs, and writes
       <case>.safetensors      the module's state_dict()                 (what the C++ test loads)
       <case>.io.safetensors   the inputs and PyTorch's outputs          (what it compares with)
   The C++ test loads each state_dict with nn::load_torch_state_dict and matches the outputs to
   1e-10. CI has no torch: it reads these committed files only.
2. headgrad -> PyTorch (when BUILD_DIR holds the test binary tests/test_torch_state_dict): runs that test with
   HEADGRAD_TORCH_EXPORT_DIR set, which writes headgrad's own models of the same cases (its own
   random parameters, saved by nn::save_torch_state_dict) with headgrad's outputs on the same
   inputs; loads each into the torch module with load_state_dict(strict=True) and compares.
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
torch.set_default_dtype(torch.float64)


def randomize(module, gen):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    return module.eval()


def encoder_layer(d_model, nhead, d_ff, activation, eps=1e-5):
    return torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=d_ff, dropout=0.0, activation=activation,
                                            layer_norm_eps=eps, batch_first=True, norm_first=True)


class Tree(torch.nn.Module):
    """The user's tree of the C++ test: embedding, two encoder layers, LayerNorm, attention, readout."""

    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(9, 6)
        self.body = torch.nn.Sequential(encoder_layer(6, 2, 12, "gelu"), encoder_layer(6, 3, 8, "relu"))
        self.norm = torch.nn.LayerNorm(6)
        self.attn = torch.nn.MultiheadAttention(6, 2, batch_first=True)
        self.head = torch.nn.Linear(6, 4, bias=False)

    def forward(self, idx):
        x = self.body(self.tok(idx.long()))
        h = self.norm(x)
        return self.head(x + self.attn(h, h, h, need_weights=False)[0])


def mha(q, k, v):
    return lambda m, io: dict(zip(("out", "weights"), m(io["q"], io["k"], io["v"])))


def causal(m, io):
    T = io["x"].shape[1]
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
    return {"out": m(io["x"], src_mask=mask, is_causal=True)}


# name -> (module factory, inputs factory, forward giving the named outputs)
CASES = {
    "linear": (lambda: torch.nn.Linear(4, 3), lambda g: {"x": torch.rand(2, 3, 4, generator=g)},
               lambda m, io: {"out": m(io["x"])}),
    "linear_no_bias": (lambda: torch.nn.Linear(5, 2, bias=False), lambda g: {"x": torch.rand(3, 5, generator=g)},
                       lambda m, io: {"out": m(io["x"])}),
    "embedding": (lambda: torch.nn.Embedding(7, 4),
                  lambda g: {"idx": torch.randint(0, 7, (2, 5), generator=g).double()},
                  lambda m, io: {"out": m(io["idx"].long())}),
    "layer_norm": (lambda: torch.nn.LayerNorm((3, 4), eps=1e-6), lambda g: {"x": torch.rand(2, 3, 4, generator=g)},
                   lambda m, io: {"out": m(io["x"])}),
    "layer_norm_no_bias": (lambda: torch.nn.LayerNorm(4, bias=False), lambda g: {"x": torch.rand(3, 4, generator=g)},
                           lambda m, io: {"out": m(io["x"])}),
    "mha": (lambda: torch.nn.MultiheadAttention(6, 2, batch_first=True),
            lambda g: {"q": torch.rand(2, 4, 6, generator=g), "k": torch.rand(2, 5, 6, generator=g),
                       "v": torch.rand(2, 5, 6, generator=g)}, mha("q", "k", "v")),
    "mha_kdim_vdim": (lambda: torch.nn.MultiheadAttention(6, 3, kdim=5, vdim=3, batch_first=True),
                      lambda g: {"q": torch.rand(2, 4, 6, generator=g), "k": torch.rand(2, 5, 5, generator=g),
                                 "v": torch.rand(2, 5, 3, generator=g)}, mha("q", "k", "v")),
    "mha_bias_kv": (lambda: torch.nn.MultiheadAttention(4, 2, bias=False, add_bias_kv=True, add_zero_attn=True,
                                                        batch_first=True),
                    lambda g: {"q": torch.rand(2, 3, 4, generator=g), "k": torch.rand(2, 3, 4, generator=g),
                               "v": torch.rand(2, 3, 4, generator=g)}, mha("q", "k", "v")),
    "block_gelu": (lambda: encoder_layer(6, 2, 10, "gelu"), lambda g: {"x": torch.rand(2, 5, 6, generator=g)},
                   lambda m, io: {"out": m(io["x"])}),
    "block_relu_causal": (lambda: encoder_layer(6, 3, 8, "relu", eps=1e-6),
                          lambda g: {"x": torch.rand(2, 5, 6, generator=g)}, causal),
    "tree": (Tree, lambda g: {"idx": torch.randint(0, 9, (2, 5), generator=g).double()},
             lambda m, io: {"out": m(io["idx"])}),
}


def write_fixtures():
    for i, (name, (make, inputs, forward)) in enumerate(CASES.items()):
        gen = torch.Generator().manual_seed(1000 + i)
        module = randomize(make(), gen)
        io = inputs(gen)
        with torch.no_grad():
            outputs = forward(module, io)
        state = {k: v.contiguous() for k, v in module.state_dict().items()}
        save_file(state, os.path.join(HERE, name + ".safetensors"), metadata={"format": "pt"})
        save_file({**io, **{k: v.contiguous() for k, v in outputs.items()}}, os.path.join(HERE, name + ".io.safetensors"))
    print(f"wrote {len(CASES)} PyTorch fixtures to {HERE}")


def check_headgrad_files(build_dir):
    test = os.path.join(build_dir, "tests", "test_torch_state_dict")
    if not os.path.exists(test):
        print(f"{test} not found: skipped the headgrad -> PyTorch direction")
        return
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([test, "--run_test=exports/*"], check=True,
                       env={**os.environ, "HEADGRAD_TORCH_EXPORT_DIR": out})
        names = sorted(f[:-len(".io.safetensors")] for f in os.listdir(out) if f.endswith(".io.safetensors"))
        assert len(names) >= len(CASES), names
        for name in names:
            base = name.removesuffix("_f32")
            module = CASES[base][0]()
            state = load_file(os.path.join(out, name + ".safetensors"))
            io = load_file(os.path.join(out, name + ".io.safetensors"))
            f32 = name.endswith("_f32")
            if f32:
                module = module.float()
            module.load_state_dict(state, strict=True)
            module.eval()
            inputs = {k: v for k, v in io.items() if not k.startswith("headgrad_")}
            with torch.no_grad():
                ours = CASES[base][2](module, inputs)
            worst = 0.0
            for k, v in ours.items():
                # float64 to 1e-10; float32 to 1e-5 of the outputs' size (its rounding is ~6e-8 per op)
                scale = 1.0 if not f32 else max(1.0, v.abs().max().item())
                diff = (v - io["headgrad_" + k]).abs().max().item() / scale
                assert diff <= (1e-5 if f32 else 1e-10), f"{name}.{k}: PyTorch and headgrad differ by {diff}"
                worst = max(worst, diff)
            print(f"  {name}: load_state_dict(strict=True) accepted headgrad's file; outputs agree to {worst:.1e}"
                  + (" (relative)" if f32 else ""))
    print(f"checked {len(names)} headgrad-written files in PyTorch")


if __name__ == "__main__":
    write_fixtures()
    check_headgrad_files(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "build"))
