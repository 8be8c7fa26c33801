#pragma once
// headgrad's autograd engine: everything in namespace autograd.
#include "autograd/attention.hpp"
#include "autograd/dtype.hpp"
#include "autograd/dot.hpp"
#include "autograd/format.hpp"
#include "autograd/function.hpp"
#include "autograd/grad_mode.hpp"
#include "autograd/gradcheck.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "autograd/random.hpp"
#include "autograd/shape.hpp"
#include "autograd/tensor.hpp"
