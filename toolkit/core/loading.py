"""Loading a model whole on one rank, also inside a ZeRO-3 run.

Under ZeRO-3, transformers builds every model inside deepspeed.zero.Init, which partitions its
weights across the ranks with collectives. A model that one rank loads alone (evaluation and
rollouts on rank 0, a reward model each rank scores with, the base a LoRA adapter merges into)
would wait forever for the other ranks there, or come out partitioned. Such loads go through
`whole_model()`.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def whole_model():
    """Within this block, from_pretrained builds models whole on this rank (ZeRO-3 or not)."""
    from transformers.integrations import deepspeed as hf_deepspeed

    held = hf_deepspeed._hf_deepspeed_config_weak_ref  # no public getter; restored below
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = held
