#pragma once
// PyTorch state_dicts: safetensors files under the names and layouts of the equivalent torch.nn
// modules, so that PyTorch loads what headgrad writes and the other way round:
//
//   nn::save_torch_state_dict(model, "model.torch.safetensors");
//   # Python:  torch_model.load_state_dict(safetensors.torch.load_file("model.torch.safetensors"), strict=True)
//   # Python:  safetensors.torch.save_file(torch_model.state_dict(), "from_torch.safetensors")
//   nn::load_torch_state_dict(model, "from_torch.safetensors");
//
// headgrad module             torch.nn module                     keys (under the module's own name)
//   Linear                     nn.Linear                           weight (out, in) = Wᵀ, bias
//   Embedding                  nn.Embedding                        weight (num_embeddings, embedding_dim)
//   LayerNorm                  nn.LayerNorm                        weight, bias (normalized_shape)
//   MultiHeadAttention         nn.MultiheadAttention(              in_proj_weight (3E, E) = [W_Qᵀ; W_Kᵀ; W_Vᵀ]
//                                batch_first=True, same options)     (q_proj_weight (E, E), k_proj_weight (E, kdim),
//                                                                     v_proj_weight (E, vdim) when kdim or vdim ≠ E),
//                                                                    in_proj_bias (3E) = [b_Q; b_K; b_V],
//                                                                    bias_k, bias_v (1, 1, E) with add_bias_kv,
//                                                                    out_proj.weight = W_Oᵀ, out_proj.bias = b_O
//   TransformerBlock           nn.TransformerEncoderLayer(d_model,  self_attn.* (attn), linear1.* (fc_1),
//                                nhead, dim_feedforward=d_ff,        linear2.* (fc_2), norm1.* (ln_1), norm2.* (ln_2)
//                                activation="gelu" or "relu",
//                                layer_norm_eps, batch_first=True,
//                                norm_first=True, dropout=0)
//   TransformerLM              its children: embed.weight, pos_embed.weight, blocks.i.* as above,
//                                ln_final.*, unembed.* (the causal mask is not a tensor)
//   any other module with no   a torch module with the same        the children's keys under the children's names
//   parameters of its own      child names (e.g. nn.Sequential)    ("body.0.self_attn.in_proj_weight")
//     (Sequential, ReLU, GELU, a user's module tree of these)
//
// A module that holds parameters of its own and is none of the above (a user's own layer), and a
// TransformerBlock with bias = false (torch's bias=False also drops the LayerNorms' biases),
// without an MLP, without LayerNorm or with GELU's tanh form have no torch equivalent: saving or loading them throws nn::CheckpointError naming the module's path
// and type. Tied modules and parameters appear under each of their names, as in PyTorch's
// state_dict(). Dropout is not in a state_dict (torch's encoder layer also applies its dropout to
// the residual branches, so only eval-mode outputs are the same).
//
// Loading is all-or-nothing with load_parameters' checks (nn/checkpoint.hpp): every key present
// (strict), no other key (strict), each tensor of torch's shape, the parameters' dtype unless
// convert_dtype; tied parameters given the same values under every name. Nothing changes unless
// everything is right. A file in headgrad's own naming (save_parameters) or a training checkpoint
// is refused with a message saying which function loads it. Float32 and Float64.
//
// Saved files get metadata "format" = "pt" (as Hugging Face's tools expect; unless the caller
// gives a "format"), "headgrad.naming" = "torch" and "headgrad.config" (the module tree, see
// nn::module_config in nn/checkpoint.hpp). Saving is atomic, as save_parameters.
#include <string>

#include "nn/checkpoint.hpp"
#include "nn/module.hpp"

namespace nn {

// The module tree's tensors under torch's names and in torch's layouts (copies, detached).
NamedTensors torch_state_dict(const Module& module);

void save_torch_state_dict(const Module& module, const std::string& path, const Metadata& metadata = {});
void load_torch_state_dict(Module& module, const std::string& path, const LoadOptions& options = {});

}  // namespace nn
