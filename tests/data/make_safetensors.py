"""Writes the safetensors files that tests/nn/test_checkpoint.cpp reads, with Python's safetensors.

    python3 tests/data/make_safetensors.py      (needs: pip install safetensors torch)

python_written.safetensors holds tensors whose values follow simple formulas that the C++ test
recomputes on its own; python_f16.safetensors holds a float16 tensor, which headgrad refuses.
"""
import os

import torch
from safetensors.torch import save_file

here = os.path.dirname(os.path.abspath(__file__))

tensors = {
    # weight[i] = (i - 2.5) / 4, row-major, float32
    "layer.weight": ((torch.arange(6, dtype=torch.float64) - 2.5) / 4).reshape(2, 3).to(torch.float32),
    # bias[i] = 1 / (i + 1), float64 (not exact in binary: checks every bit survives)
    "layer.bias": 1.0 / (torch.arange(3, dtype=torch.float64) + 1),
    "scale": torch.tensor(3.5, dtype=torch.float32),   # shape []
    "empty": torch.zeros(0, 4, dtype=torch.float32),   # no elements
}
save_file(tensors, os.path.join(here, "python_written.safetensors"), metadata={"format": "pt"})
save_file({"half": torch.ones(2, 2, dtype=torch.float16)}, os.path.join(here, "python_f16.safetensors"))
