#pragma once
// headgrad nn: modules built on the public autograd API; everything in namespace nn.
#include <autograd/autograd.hpp>

#include "nn/module.hpp"
