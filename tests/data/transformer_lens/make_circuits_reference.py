"""Reference values for tests/study/test_circuits*.cpp, computed by TransformerLens 3.9 in float64.

A small random attention-only model (2 layers, 4 heads, d_model 16, d_head 4, LayerNorm, every
weight and bias drawn from a normal distribution so that no bias is zero), a fixed batch of token
sequences that repeat, and what TL computes from them:
  - the weights (TL's shapes: W_Q (L, H, E, d), W_O (L, H, d, E), b_Q (L, H, d), b_O (L, E), ...),
  - model.OV and model.QK: norms, singular values, eigenvalues (real and imaginary parts, in TL's order),
  - model.all_composition_scores("Q" / "K" / "V"),
  - FactoredMatrix on plain random factors (batched, broadcast, products, transpose),
  - the attention patterns of the batch and TL's head detector scores on them, for each head kind,
    exclude_bos / exclude_current_token and both error measures.

Run from the repository root:  python3 tests/data/transformer_lens/make_circuits_reference.py
Writes tests/data/transformer_lens/circuits_reference.safetensors.
"""
import importlib.metadata
import itertools
import os

import torch
from safetensors.torch import save_file

from transformer_lens import FactoredMatrix, HookedTransformer, HookedTransformerConfig
from transformer_lens.utilities import composition_scores
from transformer_lens import head_detector

torch.set_default_dtype(torch.float64)
torch.manual_seed(1234)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "circuits_reference.safetensors")

L, H, E, D, V, N_CTX = 2, 4, 16, 4, 12, 32


def make_model():
    cfg = HookedTransformerConfig(
        n_layers=L, n_heads=H, d_model=E, d_head=D, d_vocab=V, n_ctx=N_CTX, attn_only=True,
        normalization_type="LN", positional_embedding_type="standard", dtype=torch.float64,
        seed=0, act_fn="gelu", default_prepend_bos=False)
    model = HookedTransformer(cfg)
    # Sequences are given as token tensors (1, T): to_tokens passes them through (for a list,
    # detect_head only reads the first one's length before scoring each on its own).
    model.to_tokens = lambda seq, *args, **kwargs: torch.stack(seq).squeeze(1) if isinstance(seq, list) else seq
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln1.w") or name.endswith("ln_final.w"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".b_Q") or name.endswith(".b_K") or name.endswith(".b_V") or name.endswith(".b_O"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / (p.shape[-2] ** 0.5 if p.dim() >= 2 else 10.0))
    return model.eval()


def tokens_with_repeats():
    # Three sequences of 12 tokens: a random half repeated, a sequence with scattered repeats, and a
    # repeated half whose first token recurs.
    a = torch.randint(0, V, (6,))
    b = torch.tensor([3, 7, 3, 1, 7, 7, 2, 5, 2, 3, 9, 1])
    c = torch.tensor([4, 8, 4, 0, 11, 6])
    return torch.stack([torch.cat([a, a]), b, torch.cat([c, c])])


def main():
    t = {}
    model = make_model()
    sd = model.state_dict()
    for name, p in model.named_parameters():
        t["param." + name] = p.detach().clone()
    for l in range(L):
        for k in ["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"]:
            assert torch.equal(sd[f"blocks.{l}.attn.{k}"], getattr(model.blocks[l].attn, k))

    # OV and QK circuits of every head, (L, H, E, E)
    for name, fm in [("OV", model.OV), ("QK", model.QK)]:
        t[f"{name}.norm"] = fm.norm()
        t[f"{name}.S"] = fm.S
        ev = fm.eigenvalues
        t[f"{name}.eig_real"] = ev.real.contiguous()
        t[f"{name}.eig_imag"] = ev.imag.contiguous()
        t[f"{name}.AB"] = fm.AB
    for mode in ["Q", "K", "V"]:
        t[f"composition.{mode}"] = model.all_composition_scores(mode)

    # FactoredMatrix on plain factors
    A = torch.randn(3, 7, 4)      # batched (3, 7, 4)
    B = torch.randn(4, 5)         # broadcast against A's batch
    fm = FactoredMatrix(A, B)
    t["fm.A"], t["fm.B"] = A, B
    t["fm.AB"] = fm.AB
    t["fm.norm"] = fm.norm()
    t["fm.S"] = fm.S
    t["fm.collapse_l_norm"] = fm.collapse_l().norm(dim=(-2, -1))
    Sq_A, Sq_B = torch.randn(2, 6, 3), torch.randn(2, 3, 6)
    sq = FactoredMatrix(Sq_A, Sq_B)
    t["sq.A"], t["sq.B"] = Sq_A, Sq_B
    ev = sq.eigenvalues
    t["sq.eig_real"], t["sq.eig_imag"] = ev.real.contiguous(), ev.imag.contiguous()
    t["sq.S"] = sq.S
    M = torch.randn(5, 2)
    prod = fm @ M
    t["fm.M"] = M
    t["fm_M.A"], t["fm_M.B"] = prod.A, prod.B
    t["fm_M.S"] = prod.S
    Ml = torch.randn(6, 7)
    left_prod = Ml @ fm
    t["fm.Ml"] = Ml
    t["Ml_fm.AB"] = left_prod.AB
    t["Ml_fm.S"] = left_prod.S
    W = torch.randn(5, 3)
    W2 = torch.randn(3, 8)
    ff = fm @ FactoredMatrix(W, W2)
    t["ff.W"], t["ff.W2"] = W, W2
    t["ff.AB"] = ff.AB
    t["ff.S"] = ff.S
    t["fm.T.S"] = fm.T.S
    t["fm.T.AB"] = fm.T.AB
    # composition scores with broadcast leading dims: left (3, ...) right (2, ...) -> (3, 2)
    R_A, R_B = torch.randn(2, 5, 3), torch.randn(2, 3, 6)
    t["comp.R_A"], t["comp.R_B"] = R_A, R_B
    t["comp.broadcast"] = composition_scores(fm, FactoredMatrix(R_A, R_B), broadcast_dims=True)
    R2_A, R2_B = torch.randn(3, 5, 3), torch.randn(3, 3, 6)
    t["comp.R2_A"], t["comp.R2_B"] = R2_A, R2_B
    t["comp.elementwise"] = composition_scores(fm, FactoredMatrix(R2_A, R2_B), broadcast_dims=False)

    # Patterns of a batch with repeats, and TL's head detector scores on them
    tokens = tokens_with_repeats()
    t["tokens"] = tokens.to(torch.int64)
    _, cache = model.run_with_cache(tokens)
    for l in range(L):
        t[f"pattern.{l}"] = cache["pattern", l].contiguous()  # (B, H, T, T)
    kinds = ["previous_token_head", "duplicate_token_head", "induction_head"]
    getters = {
        "previous_token_head": head_detector.get_previous_token_head_detection_pattern,
        "duplicate_token_head": head_detector.get_duplicate_token_head_detection_pattern,
        "induction_head": head_detector.get_induction_head_detection_pattern,
    }
    for kind in kinds:
        for b in range(tokens.shape[0]):
            t[f"detection.{kind}.{b}"] = getters[kind](tokens[b:b + 1]).to(torch.float64)
        for bos, cur, measure in itertools.product([False, True], [False, True], ["mul", "abs"]):
            # TL's detect_head on the list of sequences (it averages the per-sequence scores);
            # to_tokens is the identity here, since the sequences are given as token tensors.
            scores = head_detector.detect_head(model, [tokens[b:b + 1] for b in range(tokens.shape[0])], kind,
                                               exclude_bos=bos, exclude_current_token=cur, error_measure=measure)
            # The same from the batch's cache, one sequence at a time, as a check of the call above.
            manual = torch.zeros(L, H)
            for l in range(L):
                for h in range(H):
                    per = [head_detector.compute_head_attention_similarity_score(
                        cache["pattern", l][b, h].clone(), getters[kind](tokens[b:b + 1]).to(torch.float64),
                        exclude_bos=bos, exclude_current_token=cur, error_measure=measure)
                        for b in range(tokens.shape[0])]
                    manual[l, h] = sum(per) / len(per)
            assert torch.allclose(scores, manual, atol=1e-12, rtol=0), (kind, bos, cur, measure)
            t[f"scores.{kind}.bos{int(bos)}.cur{int(cur)}.{measure}"] = scores

    t = {k: v.detach().clone().contiguous() for k, v in t.items()}
    save_file(t, OUT, metadata={"transformer_lens": importlib.metadata.version("transformer-lens"),
                                "torch": torch.__version__})
    print(f"wrote {OUT}: {len(t)} tensors, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
