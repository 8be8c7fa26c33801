#!/usr/bin/env python3
"""Reference values for tests/attention/test_mha_torch_parity.cpp, from torch.nn.MultiheadAttention.

Run once (needs torch; the C++ test does not):  python3 tests/data/make_mha_reference.py
It writes tests/data/mha_<config>.txt, one file per configuration, in float64.

Mapping between the layouts (headgrad computes y = x · W + b with W stored (in x out); torch
computes y = x · Wᵀ + b with W stored (out x in)):
    W_Q = in_proj_weight[0:E].T   (or q_proj_weight.T when kdim or vdim differs from E)
    W_K = in_proj_weight[E:2E].T  (k_proj_weight.T, shape (kdim x E))
    W_V = in_proj_weight[2E:3E].T (v_proj_weight.T, shape (vdim x E))
    W_O = out_proj.weight.T
    b_Q, b_K, b_V = in_proj_bias[0:E], [E:2E], [2E:3E];  b_O = out_proj.bias
    bias_k, bias_v = torch's bias_k, bias_v (1, 1, E) flattened to (E)
Masks: headgrad's key_padding_mask is nonzero where a key is padding (torch: True); is_causal is
given to torch as the explicit causal float mask (torch treats is_causal only as a hint).

The loss whose gradients are recorded is
    L = sum(out * grad_out) + sum(weights * grad_weights)     (second term when need_weights)
with grad_out and grad_weights fixed random tensors written to the file.

File format, one item per line:
    # comment
    config <key> <integer>
    tensor <name> <ndim> <dim_0> ... <dim_ndim-1> <values, row-major, %.17g, -inf allowed>
"""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
torch.set_default_dtype(torch.float64)


def fmt_tensor(name, t):
    t = t.detach().to(torch.float64).contiguous()
    dims = list(t.shape)
    values = " ".join("%.17g" % v for v in t.reshape(-1).tolist())
    return "tensor %s %d %s %s" % (name, len(dims), " ".join(str(d) for d in dims), values)


def causal_mask(T, S):
    m = torch.zeros(T, S)
    m[torch.triu(torch.ones(T, S, dtype=torch.bool), diagonal=1)] = float("-inf")
    return m


def make(name, *, E, H, T, S=None, B=None, kdim=None, vdim=None, bias=True, add_bias_kv=False,
         add_zero_attn=False, self_attention=False, need_weights=True, average=False,
         is_causal=False, padding=None, attn_mask=None, seed=0):
    """padding: list (per batch entry) of key indices that are padding (a flat list unbatched).
    attn_mask: None, "2d" or "3d" (random finite values with a few -inf, never a full row)."""
    g = torch.Generator().manual_seed(seed)
    S = T if S is None else S
    kdim = E if kdim is None else kdim
    vdim = E if vdim is None else vdim
    batched = B is not None
    lead = [B] if batched else []
    mha = torch.nn.MultiheadAttention(E, H, dropout=0.0, bias=bias, add_bias_kv=add_bias_kv,
                                      add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim,
                                      batch_first=True, dtype=torch.float64)
    mha.eval()
    # Nontrivial parameters, biases included (torch initialises the biases to zero).
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))

    query = torch.randn(lead + [T, E], generator=g).requires_grad_()
    if self_attention:
        key = value = query
    else:
        key = torch.randn(lead + [S, kdim], generator=g).requires_grad_()
        value = torch.randn(lead + [S, vdim], generator=g).requires_grad_()

    kpm = None
    if padding is not None:
        kpm = torch.zeros(lead + [S], dtype=torch.bool)
        if batched:
            for b, keys in enumerate(padding):
                for j in keys:
                    kpm[b, j] = True
        else:
            for j in padding:
                kpm[j] = True

    mask = None
    if attn_mask is not None:
        rows = (B if batched else 1) * H if attn_mask == "3d" else None
        shape = [T, S] if attn_mask == "2d" else [rows, T, S]
        mask = torch.randn(shape, generator=g)
        # Block a few entries, keeping key 0 visible so that no row is fully blocked.
        block = torch.rand(shape, generator=g) < 0.3
        block[..., 0] = False
        mask[block] = float("-inf")
    torch_mask = mask
    if is_causal:
        torch_mask = causal_mask(T, S) if torch_mask is None else torch_mask + causal_mask(T, S)

    # torch wants both masks of one kind: the padding mask as a float 0 / -inf mask.
    torch_kpm = None if kpm is None else torch.zeros(kpm.shape).masked_fill(kpm, float("-inf"))
    out, weights = mha(query, key, value, key_padding_mask=torch_kpm, need_weights=need_weights,
                       attn_mask=torch_mask, average_attn_weights=average)
    assert torch.isfinite(out).all(), name
    grad_out = torch.randn(out.shape, generator=g)
    loss = (out * grad_out).sum()
    grad_weights = None
    if need_weights:
        grad_weights = torch.randn(weights.shape, generator=g)
        loss = loss + (weights * grad_weights).sum()
    loss.backward()

    E_ = E
    if mha._qkv_same_embed_dim:
        W = mha.in_proj_weight
        params = {"W_Q": W[0:E_].T, "W_K": W[E_:2 * E_].T, "W_V": W[2 * E_:].T}
        grads = {"W_Q": W.grad[0:E_].T, "W_K": W.grad[E_:2 * E_].T, "W_V": W.grad[2 * E_:].T}
    else:
        params = {"W_Q": mha.q_proj_weight.T, "W_K": mha.k_proj_weight.T, "W_V": mha.v_proj_weight.T}
        grads = {"W_Q": mha.q_proj_weight.grad.T, "W_K": mha.k_proj_weight.grad.T,
                 "W_V": mha.v_proj_weight.grad.T}
    params["W_O"] = mha.out_proj.weight.T
    grads["W_O"] = mha.out_proj.weight.grad.T
    if bias:
        b = mha.in_proj_bias
        for i, n in enumerate(["b_Q", "b_K", "b_V"]):
            params[n] = b[i * E_:(i + 1) * E_]
            grads[n] = b.grad[i * E_:(i + 1) * E_]
        params["b_O"] = mha.out_proj.bias
        grads["b_O"] = mha.out_proj.bias.grad
    if add_bias_kv:
        params["bias_k"] = mha.bias_k.reshape(E_)
        params["bias_v"] = mha.bias_v.reshape(E_)
        grads["bias_k"] = mha.bias_k.grad.reshape(E_)
        grads["bias_v"] = mha.bias_v.grad.reshape(E_)

    lines = ["# torch.nn.MultiheadAttention(batch_first=True) reference, float64, torch %s" % torch.__version__,
             "# generated by tests/data/make_mha_reference.py (configuration '%s'); do not edit" % name]
    cfg = dict(embed_dim=E, num_heads=H, kdim=kdim, vdim=vdim, bias=int(bias), add_bias_kv=int(add_bias_kv),
               add_zero_attn=int(add_zero_attn), batched=int(batched), self_attention=int(self_attention),
               need_weights=int(need_weights), average_attn_weights=int(average), is_causal=int(is_causal))
    lines += ["config %s %d" % kv for kv in cfg.items()]
    lines.append(fmt_tensor("query", query))
    if not self_attention:
        lines.append(fmt_tensor("key", key))
        lines.append(fmt_tensor("value", value))
    if kpm is not None:
        lines.append(fmt_tensor("key_padding_mask", kpm.to(torch.float64)))
    if mask is not None:
        lines.append(fmt_tensor("attn_mask", mask))
    for n, p in params.items():
        lines.append(fmt_tensor(n, p))
    lines.append(fmt_tensor("grad_out", grad_out))
    if need_weights:
        lines.append(fmt_tensor("grad_weights", grad_weights))
    lines.append(fmt_tensor("out", out))
    if need_weights:
        lines.append(fmt_tensor("weights", weights))
    lines.append(fmt_tensor("d_query", query.grad))
    if not self_attention:
        lines.append(fmt_tensor("d_key", key.grad))
        lines.append(fmt_tensor("d_value", value.grad))
    for n, gr in grads.items():
        lines.append(fmt_tensor("d_" + n, gr))
    path = os.path.join(HERE, "mha_%s.txt" % name)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", os.path.relpath(path))


CONFIGS = [
    dict(name="unbatched", E=4, H=2, T=3, self_attention=True),
    dict(name="batched", E=6, H=3, T=3, B=2, self_attention=True, average=True),
    dict(name="causal", E=4, H=2, T=4, B=2, self_attention=True, is_causal=True),
    dict(name="cross_kdim_vdim", E=6, H=2, T=3, S=5, B=2, kdim=4, vdim=5),
    dict(name="key_padding", E=4, H=2, T=4, S=5, B=3, padding=[[4], [1, 3], []]),
    dict(name="float_mask_2d", E=4, H=2, T=3, S=4, B=2, attn_mask="2d"),
    dict(name="float_mask_3d", E=4, H=2, T=3, S=4, B=2, attn_mask="3d", padding=[[2], []]),
    dict(name="one_head", E=4, H=1, T=3, S=4, B=2),
    dict(name="heads_of_width_1", E=4, H=4, T=3, S=4, B=2, average=True),
    dict(name="no_bias", E=4, H=2, T=3, S=4, B=2, bias=False),
    dict(name="causal_padding_unbatched", E=4, H=2, T=4, self_attention=True, is_causal=True, padding=[2, 3],
         attn_mask="3d"),
    dict(name="add_bias_kv", E=4, H=2, T=3, S=4, B=2, add_bias_kv=True, padding=[[3], [0]], attn_mask="2d"),
    dict(name="add_zero_attn", E=4, H=2, T=3, S=4, B=2, add_zero_attn=True, padding=[[1], []]),
    dict(name="bias_kv_zero_attn_causal", E=4, H=2, T=3, add_bias_kv=True, add_zero_attn=True,
         self_attention=True, is_causal=True, bias=False),
    dict(name="no_weights", E=6, H=3, T=3, S=5, B=2, kdim=3, vdim=2, need_weights=False, padding=[[0], [4]]),
]

if __name__ == "__main__":
    for i, c in enumerate(CONFIGS):
        c = dict(c)
        make(c.pop("name"), seed=1000 + i, **c)
