"""Reference values for tests/study/test_transformer_lens_parity.cpp, computed by TransformerLens 3.9 in float64.

Four small HookedTransformer configs (n_layers 2, d_model 16, n_heads 4, d_head 4, d_vocab 12,
n_ctx 16, positional_embedding_type "standard", default_prepend_bos False, use_split_qkv_input and
use_attn_result on, so that the q/k/v input and result hooks exist):
  A  attention-only, normalization_type "LN"
  B  d_mlp 32, act_fn "gelu", "LN"
  C  d_mlp 32, act_fn "relu", normalization_type None
  D  d_mlp 32, act_fn "gelu_new", "LN"
Every weight is drawn from N(0, 1/fan_in) (fan_in = shape[-2]), every bias from N(0, 0.1²) and every
LayerNorm gain from N(1, 0.2²), so that no bias is zero and no gain is one.

Tensors written (<X> is A, B, C or D):
  tokens                   (2, 10) Int64, the clean tokens every config runs on
  corrupted_tokens         (2, 10) Int64, tokens with positions 2 and 5 changed (patching's corrupted run)
  <X>.sd.<name>            model.state_dict() under TL's names: embed.W_E, pos_embed.W_pos,
                           blocks.i.ln1.w, ..., blocks.i.attn.W_Q, ..., unembed.b_U; the buffers
                           blocks.i.attn.IGNORE (F64 scalar) and blocks.i.attn.mask (written as I64,
                           since headgrad does not read BOOL)
  <X>.logits               (2, 10, 12) model(tokens)
  <X>.loss                 () model(tokens, return_type="loss")
  <X>.act.<hook name>      every entry of model.run_with_cache(tokens)[1] (for D only the
                           blocks.i.mlp.* points: D differs from B in its activation alone), shaped
                           as TL has them (attn.hook_q (B, T, H, d), attn.hook_attn_scores (B, H, T, T)
                           with -inf above the diagonal, attn.hook_result (B, T, H, E), ...), except
                           the points TL repeats per head under use_split_qkv_input (blocks.i.hook_q_input,
                           hook_k_input, hook_v_input (B, T, H, E), blocks.i.ln1.hook_scale (B, T, H, 1)
                           and ln1.hook_normalized (B, T, H, E)): every head's slice is the same (the
                           script checks that), so the file keeps one, shaped (B, T, 1, ...).
                           TL's LayerNorm hook_normalized is (x - mean) / scale, before w and b.
                           unembed.hook_in is unembed's input, unembed.hook_out the logits.
Config B only:
  B.patch.metric_token     () Int64, the token whose logit at the last position (mean over the batch) is the metric
  B.patch.clean_metric, B.patch.corrupted_metric   () that metric on the clean and corrupted tokens
  B.patch.head_out_all_pos (L, H) patching.get_act_patch_attn_head_out_all_pos (patches hook_z, every position)
  B.patch.head_out_by_pos  (L, T, H) patching.get_act_patch_attn_head_out_by_pos (hook_z at one position)
  B.grad.<hook name>       d loss / d value at each hook point (loss = model(tokens, return_type="loss")):
                           run_with_cache(..., incl_bwd=True)'s "<hook name>_grad", except at ln1's
                           points, which split-qkv reaches three times (ln1 of the q, k and v
                           inputs, in that order) and whose cache entry holds one call's gradient:
                           there each call's, stacked as (B, T, 3, ...) (q's, k's, v's). The per-head
                           points (hook_q/k/v_input, ln1.hook_scale, ln1.hook_normalized) are summed
                           over the heads, (B, T, 1, ...) (or 3 for ln1's): the gradient with respect
                           to a stream the heads share.
  Logit lens, from the clean cache (left for a later test):
  B.lens.accumulated_resid (2L + 2, B, T, E) cache.accumulated_resid(apply_ln=True, incl_mid=True),
                           labels: 0_pre, 0_mid, 1_pre, 1_mid, final_post
  B.lens.decompose_resid   (2 + 2L, B, T, E) cache.decompose_resid(apply_ln=True),
                           labels: embed, pos_embed, 0_attn_out, 0_mlp_out, 1_attn_out, 1_mlp_out
  B.lens.stack_head_results (L·H, B, T, E) cache.stack_head_results(apply_ln=True),
                           labels: L0H0, L0H1, L0H2, L0H3, L1H0, L1H1, L1H2, L1H3
The labels TL returned are also in the file's metadata ("B.lens.<name>.labels", comma-separated);
the script asserts they are the ones listed above.

Run from the repository root:  python3 tests/data/transformer_lens/make_lm_reference.py
Writes tests/data/transformer_lens/lm_reference.safetensors.
"""
import importlib.metadata
import os

import torch
from safetensors.torch import save_file

from transformer_lens import HookedTransformer, HookedTransformerConfig, patching

torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lm_reference.safetensors")

L, H, E, D, V, N_CTX, D_MLP = 2, 4, 16, 4, 12, 16, 32
BATCH, T = 2, 10
METRIC_TOKEN = 7
# TL's split-qkv points repeat the residual stream per head (and ln1 normalises each copy): the
# file keeps one head's slice of them, after checking that the slices are equal.
PER_HEAD_REPEATS = ("hook_q_input", "hook_k_input", "hook_v_input", "ln1.hook_scale", "ln1.hook_normalized")

CONFIGS = {
    "A": dict(attn_only=True, normalization_type="LN", act_fn="gelu"),
    "B": dict(d_mlp=D_MLP, normalization_type="LN", act_fn="gelu"),
    "C": dict(d_mlp=D_MLP, normalization_type=None, act_fn="relu"),
    "D": dict(d_mlp=D_MLP, normalization_type="LN", act_fn="gelu_new"),
}


def make_model(name, seed):
    cfg = HookedTransformerConfig(
        n_layers=L, n_heads=H, d_model=E, d_head=D, d_vocab=V, n_ctx=N_CTX,
        positional_embedding_type="standard", default_prepend_bos=False, dtype=torch.float64, seed=0,
        use_split_qkv_input=True, use_attn_result=True, **CONFIGS[name])
    model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            last = pname.split(".")[-1]
            noise = torch.randn(p.shape, generator=gen)
            if last == "w":  # LayerNorm gains
                p.copy_(1.0 + 0.2 * noise)
            elif last.startswith("b"):  # b_Q .. b_O, b_in, b_out, b_U, LayerNorm biases
                p.copy_(0.1 * noise)
            else:
                assert p.dim() >= 2, pname
                p.copy_(noise / p.shape[-2] ** 0.5)
    return model.eval()


def loss_gradients(model, tokens):
    """d loss / d value at every hook point: run_with_cache(return_type="loss", incl_bwd=True)'s
    gradients, except at the points a forward reaches more than once (ln1's, which split-qkv runs on
    the q, k and v inputs, in that order), whose cache entry holds one call's gradient: there, each
    call's, from tensor hooks of our own, stacked (..., 3, ·) as q's, k's, v's. The per-head points
    are summed over the heads (see the docstring)."""
    _, cache = model.run_with_cache(tokens, return_type="loss", incl_bwd=True)
    model.zero_grad(set_to_none=True)
    per_call = {}  # name -> each call's gradient, in the order of the forward calls

    def capture(value, hook):
        calls = per_call.setdefault(hook.name, [])
        i = len(calls)
        calls.append(None)
        value.register_hook(lambda g: calls.__setitem__(i, g.detach().clone()))

    for name in model.hook_dict:
        if name + "_grad" not in cache:
            continue  # a point this config does not reach (hook_attn_in, hook_mlp_in, ...)
        model.add_hook(name, capture, dir="fwd")
    model(tokens, return_type="loss").backward()
    model.reset_hooks()
    model.zero_grad(set_to_none=True)
    out = {}
    for name in model.hook_dict:
        if name + "_grad" not in cache:
            continue
        calls = per_call[name]
        assert all(g is not None for g in calls), name
        if len(calls) == 1:
            assert torch.equal(calls[0], cache[name + "_grad"]), name
            g = calls[0]
        else:
            assert name.endswith(("ln1.hook_scale", "ln1.hook_normalized")) and len(calls) == 3, (name, len(calls))
            assert any(torch.equal(c, cache[name + "_grad"]) for c in calls), name
        if any(name.endswith(p) for p in PER_HEAD_REPEATS):
            # (B, T, H, X) per call -> (B, T, 1, X), or (B, T, 3, X) for ln1's q, k, v calls
            g = torch.cat([c.sum(dim=2, keepdim=True) for c in calls], dim=2)
        out[name] = g
    return out


def main():
    t = {}
    meta = {"transformer_lens": importlib.metadata.version("transformer-lens"), "torch": torch.__version__}
    gen = torch.Generator().manual_seed(2024)
    tokens = torch.randint(0, V, (BATCH, T), generator=gen)
    corrupted = tokens.clone()
    corrupted[:, 2] = (tokens[:, 2] + 3) % V
    corrupted[:, 5] = (tokens[:, 5] + 5) % V
    t["tokens"] = tokens
    t["corrupted_tokens"] = corrupted

    for i, name in enumerate(CONFIGS):
        model = make_model(name, seed=100 + i)
        for k, v in model.state_dict().items():
            t[f"{name}.sd.{k}"] = v.to(torch.int64) if v.dtype == torch.bool else v
        logits, cache = model.run_with_cache(tokens)
        t[f"{name}.logits"] = logits
        t[f"{name}.loss"] = model(tokens, return_type="loss")
        assert torch.equal(model(tokens), logits)
        for k, v in cache.items():
            if name == "D" and ".mlp." not in k:
                continue  # D differs from B in its activation alone: its MLP points suffice
            if any(k.endswith(p) for p in PER_HEAD_REPEATS):
                # (B, T, H, ...) with every head's slice the same: kept as (B, T, 1, ...)
                assert v.dim() == 4 and v.shape[2] == H, (k, v.shape)
                for h in range(H):
                    assert torch.equal(v[:, :, h], v[:, :, 0]), (k, h)
                v = v[:, :, :1]
            t[f"{name}.act.{k}"] = v

        if name == "B":
            def metric(lg):
                return lg[:, -1, METRIC_TOKEN].mean()
            corrupted_logits = model(corrupted)
            t["B.patch.metric_token"] = torch.tensor(METRIC_TOKEN, dtype=torch.int64)
            t["B.patch.clean_metric"] = metric(logits)
            t["B.patch.corrupted_metric"] = metric(corrupted_logits)
            t["B.patch.head_out_all_pos"] = patching.get_act_patch_attn_head_out_all_pos(
                model, corrupted, cache, metric)
            t["B.patch.head_out_by_pos"] = patching.get_act_patch_attn_head_out_by_pos(
                model, corrupted, cache, metric)
            expected_labels = {
                "accumulated_resid": ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"],
                "decompose_resid": ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"],
                "stack_head_results": [f"L{l}H{h}" for l in range(L) for h in range(H)],
            }
            lens = {
                "accumulated_resid": cache.accumulated_resid(apply_ln=True, incl_mid=True, return_labels=True),
                "decompose_resid": cache.decompose_resid(apply_ln=True, return_labels=True),
                "stack_head_results": cache.stack_head_results(apply_ln=True, return_labels=True),
            }
            for k, (stack, labels) in lens.items():
                assert list(labels) == expected_labels[k], (k, labels)
                t[f"B.lens.{k}"] = stack
                meta[f"B.lens.{k}.labels"] = ",".join(labels)
            for k, v in loss_gradients(model, tokens).items():
                t[f"B.grad.{k}"] = v

    t = {k: v.detach().clone().contiguous() for k, v in t.items()}
    for k, v in t.items():
        assert v.dtype in (torch.float64, torch.int64), (k, v.dtype)
    save_file(t, OUT, metadata=meta)
    print(f"wrote {OUT}: {len(t)} tensors, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
