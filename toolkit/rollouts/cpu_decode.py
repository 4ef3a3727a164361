"""Decode steps of HF `generate` on CPU with the weight as the matmul's left operand.

Found by measuring (benchmarks/bench_decode_linear.py, the AMD Zen 4 machine kind, torch 2.13 with
MKL 2024.2): a float32 `F.linear(x, W)` with a few rows in `x` (a decode step: one row per sequence)
runs MKL's sgemm on `x @ W.T`, which packs all of W on every call. A decode step reads every weight
once, so that packing is most of its cost: SmolLM2's 49152 x 576 LM head took 20-26 ms at 4 rows
against 7-10 ms for the same product computed as `(W @ x.T).T`, the shape MKL streams W through
without packing. Across a whole greedy decode step of the 24-layer demo student the second form took
0.46-0.48x the time at batch 4 and 0.84-0.98x at batch 16-32 (benchmarks/RESULTS.md, "Decode steps
weight-major").

`weight_major_linear()` is a `TorchFunctionMode`: inside it, every float32 CPU `F.linear` whose input
has at most `rows` rows and needs no gradient is computed the second way; everything else (prefill,
training, bfloat16, GPUs) runs as it would. The two forms differ only in float rounding (about 1e-5
on SmolLM2's logits); greedy outputs matched on every prompt measured (tests/test_engines.py and the
benchmark count them). Nothing here changes a precision or a weight.
"""

from __future__ import annotations

import contextlib
import functools

DECODE_ROWS = 64  # measured faster at 4 to 64 rows a step; a prefill's rows are batch x prompt length


@functools.cache
def _mode_class():
    """The mode's class, made on first use: importing this module must not import torch (a data
    stage's worker imports the rollouts package and never loads torch)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class WeightMajorLinear(TorchFunctionMode):
        def __init__(self, rows: int):
            super().__init__()
            self.rows = rows
            self.served = 0  # linears computed weight-major

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.linear and len(args) >= 2:  # nn.Linear passes input and weight by position
                x, weight = args[0], args[1]
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                if (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and x.dim() >= 2
                        and x.numel() <= self.rows * x.shape[-1] and not torch.is_grad_enabled()):
                    self.served += 1
                    flat = x.reshape(-1, x.shape[-1])
                    out = (weight @ flat.t()).t().contiguous().reshape(*x.shape[:-1], weight.shape[0])
                    return out if bias is None else out + bias
            return func(*args, **kwargs)

    return WeightMajorLinear


def weight_major_linear(rows: int = DECODE_ROWS):
    """A context in which small float32 CPU linears run as `(W @ x.T).T` (see the module's doc); a
    no-op context where torch runs on a GPU, which has no such cost."""
    import torch

    if torch.cuda.is_available():
        return contextlib.nullcontext()
    return _mode_class()(rows)
