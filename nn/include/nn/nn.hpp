#pragma once
// headgrad nn: modules built on the public autograd API; everything in namespace nn.
#include <autograd/autograd.hpp>

#include "nn/checkpoint.hpp"
#include "nn/circuits.hpp"
#include "nn/functional.hpp"
#include "nn/hooks.hpp"
#include "nn/init.hpp"
#include "nn/layers.hpp"
#include "nn/linear.hpp"
#include "nn/loss.hpp"
#include "nn/module.hpp"
#include "nn/multihead_attention.hpp"
#include "nn/optim.hpp"
#include "nn/per_example.hpp"
#include "nn/study.hpp"
#include "nn/torch_state_dict.hpp"
#include "nn/transformer_lm.hpp"
#include "nn/viewer.hpp"
