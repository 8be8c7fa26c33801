#pragma once
// Forward mode by the ops' own rules (internal, not installed): tangents carried through a
// recorded graph from its inputs to its outputs, each node's rule (Node::tangents) reading what
// the node saved for backward. jvp and gradcheck's forward-mode check use it where every node on
// the way has a rule, and the double-vjp construction otherwise.
#include <optional>
#include <string>

#include "autograd/tensor.hpp"

namespace autograd::detail {

// The tangents of `outputs` (one each; undefined = zero) when `inputs` (tensors of the graph
// behind the outputs, usually leaves that require grad) move along `tangents` (one per input, of
// its shape and dtype; undefined = zero). Computed outside any graph. nullopt when a node on a
// path from a moving input to an output has no forward-mode rule or was released; nothing is
// changed then, and the caller takes another way.
// `missing`, when given, receives the name of the first op on the way without a rule (or
// "a freed graph"), when nullopt is returned.
std::optional<TensorList> tangents_by_rules(const TensorList& outputs, const TensorList& inputs,
                                            const TensorList& tangents, std::string* missing = nullptr);

}  // namespace autograd::detail
