#!/usr/bin/env python3
"""Reference strings for tests/engine/test_printing.cpp, from PyTorch's own tensor printer.

Run once (needs torch; the C++ test does not):  python3 tests/data/make_printing_reference.py
It writes tests/data/printing_reference.txt.

Each case's values follow a formula the C++ test recomputes (or are listed), so both sides print
the same numbers. The values are multiples of powers of two, exact in float32 and float64, and
never all integers (PyTorch prints all-integer float tensors as "1.", headgrad as "1.0000").

The expected text is PyTorch's: torch._tensor_str._tensor_str (the body, with PyTorch's columns,
line wrapping and "..." summary) after "tensor(", then torch._tensor_str._add_suffixes with
headgrad's suffixes ("dtype=Float32", "shape=[2, 3]", "requires_grad=true"), so the suffixes wrap
onto a new line exactly where PyTorch would wrap its own.

File format:
    case <name>
    dtype Float32|Float64
    shape <dims...>                      (no dims: a scalar)
    formula <a> <b> <m> <o> <d> <n>      value i = s_i * (((i*a + b) mod m) + o) / d,
                                         s_i = -1 when n > 0 and i mod n == 1, else 1
    values <v...>                        (instead of formula; nan, inf, -inf allowed)
    options <precision> <threshold> <edgeitems> <linewidth> <sci: -1 auto, 0 off, 1 on>
    requires_grad 0|1
    expected <number of lines>
    <the lines>
"""
import os

import torch
from torch._tensor_str import _add_suffixes, _tensor_str, printoptions

here = os.path.dirname(os.path.abspath(__file__))

DEFAULT = (4, 1000, 3, 80, -1)  # PyTorch's defaults: precision, threshold, edgeitems, linewidth

# name, dtype, shape, ("formula", a, b, m, o, d, n) or ("values", [...]), options, requires_grad
CASES = [
    ("rank1_short", "Float64", [5], ("formula", 7, 3, 11, -5, 4, 0), DEFAULT, 0),
    ("rank1_wraps", "Float32", [30], ("formula", 37, 11, 101, -50, 8, 0), DEFAULT, 0),
    ("rank1_fits_one_line_then_suffix_wraps", "Float64", [8], ("formula", 5, 1, 13, 30, 8, 0), DEFAULT, 1),
    ("rank2_rows_wrap", "Float64", [4, 13], ("formula", 53, 7, 199, -99, 16, 0), DEFAULT, 0),
    ("rank2_negative_aligned", "Float32", [3, 4], ("formula", 3, 1, 7, 1, 4, 2), DEFAULT, 0),
    ("rank3", "Float32", [2, 3, 11], ("formula", 29, 5, 97, -48, 8, 0), DEFAULT, 0),
    ("rank4", "Float64", [2, 2, 3, 9], ("formula", 31, 2, 89, -44, 4, 0), DEFAULT, 1),
    ("wide_values_fixed", "Float64", [3, 7], ("formula", 7919, 13, 90000, 8000, 8, 3), DEFAULT, 0),
    ("small_values_scientific", "Float32", [4, 6], ("formula", 389, 17, 5000, 1, 1048576, 4), DEFAULT, 0),
    ("large_values_scientific", "Float64", [9], ("formula", 617, 3, 1000, 1, 1.0 / 1048576, 2), DEFAULT, 0),
    ("ratio_over_1000_scientific", "Float64", [2, 3], ("values", [0.001953125, 2.5, -3.25, 0.5, 1.75, -0.125]),
     DEFAULT, 0),
    ("nonfinite_and_zero", "Float64", [2, 4], ("values", ["nan", "inf", "-inf", 0.0, -1.5, 2.25, 0.125, -7.875]),
     DEFAULT, 0),
    ("rank1_summarised", "Float32", [2000], ("formula", 37, 11, 1009, -504, 16, 0), DEFAULT, 0),
    ("rank2_summarised", "Float64", [40, 30], ("formula", 53, 7, 499, -249, 8, 0), DEFAULT, 0),
    ("rank3_summarised", "Float32", [12, 10, 10], ("formula", 61, 3, 211, -105, 4, 0), DEFAULT, 0),
    ("rank4_summarised", "Float64", [4, 5, 7, 8], ("formula", 67, 9, 401, -200, 8, 0), DEFAULT, 1),
    ("summary_uses_only_shown_values", "Float64", [1001], ("formula", 1, 0, 1001, -500, 2, 0), DEFAULT, 0),
    ("narrow_lines", "Float64", [3, 10], ("formula", 13, 4, 41, -20, 8, 0), (2, 1000, 3, 40, -1), 0),
    ("low_threshold_two_edge_items", "Float32", [7, 9], ("formula", 11, 2, 37, -18, 4, 0), (4, 20, 2, 80, -1), 0),
    ("scientific_forced", "Float64", [5], ("formula", 3, 1, 7, -3, 8, 0), (3, 1000, 3, 80, 1), 0),
    ("scientific_off", "Float64", [4], ("values", [0.00001, 123.5, -2.25, 0.5]), (4, 1000, 3, 80, 0), 0),
    ("scalar", "Float64", [], ("values", [-2.375]), DEFAULT, 0),
]


def values_of(spec, n):
    if spec[0] == "values":
        return [float(v) for v in spec[1]]
    _, a, b, m, o, d, neg = spec
    out = []
    for i in range(n):
        s = -1.0 if neg > 0 and i % neg == 1 else 1.0
        out.append(s * (((i * a + b) % m) + o) / d)
    return out


def main():
    lines = ["# PyTorch " + torch.__version__ + "'s printing of these tensors; made by make_printing_reference.py"]
    for name, dtype, shape, spec, options, requires_grad in CASES:
        n = 1
        for s in shape:
            n *= s
        vals = values_of(spec, n)
        assert len(vals) == n, name
        t = torch.tensor(vals, dtype=torch.float32 if dtype == "Float32" else torch.float64).reshape(shape)
        assert t.tolist() == torch.tensor(vals, dtype=torch.float64).reshape(shape).tolist() or any(
            v != v for v in vals), name + ": values must be exact in " + dtype
        precision, threshold, edgeitems, linewidth, sci = options
        with printoptions(precision=precision, threshold=threshold, edgeitems=edgeitems, linewidth=linewidth,
                          sci_mode=None if sci < 0 else bool(sci)):
            suffixes = ["dtype=" + dtype, "shape=[" + ", ".join(str(s) for s in shape) + "]"]
            if requires_grad:
                suffixes.append("requires_grad=true")
            text = _add_suffixes("tensor(" + _tensor_str(t, len("tensor(")), suffixes, len("tensor("), False)
        lines.append("case " + name)
        lines.append("dtype " + dtype)
        lines.append("shape" + "".join(" " + str(s) for s in shape))
        if spec[0] == "values":
            lines.append("values " + " ".join(repr(float(v)) for v in spec[1]))
        else:
            lines.append("formula " + " ".join(repr(x) for x in spec[1:]))
        lines.append("options " + " ".join(str(x) for x in options))
        lines.append("requires_grad " + str(requires_grad))
        body = text.split("\n")
        lines.append("expected " + str(len(body)))
        lines.extend(body)
    with open(os.path.join(here, "printing_reference.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
