"""Completions' log-probabilities for the work of their real tokens (a grpo stage's `length_bucket_rows`).

TRL scores a GRPO batch as one tensor padded to its longest prompt and its longest completion, and
runs every row's prompt through the model, although the G rows of a group share one prompt. Here,
for the same numbers (up to float rounding; tests/test_rl_losses.py holds them to TRL's):

- rows sorted by where their last real token lies run `rows` at a time, each bucket cut to the
  columns its rows use (`length_buckets`, `bucketed_logps`);
- a prompt several rows share runs once (`shared_prompt_forward`): its keys and values go to each
  of its rows' completion forwards as a KV cache that keeps its autograd graph, so the gradient
  reaches the prompt's positions from every row, as it does in the padded batch.

Positions shift by the trimmed left padding; rotary attention depends on distances only and does
not see it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer

# forward(row indices, first column, one past the last column) -> (log-probs, entropies or None) of
# those rows' completion tokens in columns [prompt width, last)
BucketForward = Callable[[torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor | None]]


def first_real_column(mask: torch.Tensor, default: int) -> torch.Tensor:
    """Each row's first unmasked column; `default` for a row with none."""
    real = mask.bool()
    return torch.where(real.any(1), real.int().argmax(1), default)


def length_buckets(attention_mask: torch.Tensor, completion_width: int, rows: int) -> list[tuple[torch.Tensor, int, int]]:
    """Row indices sorted by where their last real token lies, `rows` at a time, each with the column
    span [lo, hi) that holds every real token of its rows. Prompts are left-padded and completions
    right-padded to the batch's longest, so a bucket of like lengths cut to its span runs the model
    over (nearly) only real tokens. The span keeps the last prompt column, which predicts the first
    completion token, and at least one completion column."""
    width = attention_mask.size(1)
    prompt_width = width - completion_width
    first = first_real_column(attention_mask, prompt_width - 1)
    end = width - attention_mask.bool().flip(1).int().argmax(1)  # one past the last real column
    order = torch.argsort(end, stable=True)
    buckets = []
    for start in range(0, len(order), rows):
        idx = order[start:start + rows]
        lo = max(min(int(first[idx].min()), prompt_width - 1), 0)
        buckets.append((idx, lo, max(int(end[idx].max()), prompt_width + 1)))
    return buckets


def bucketed_logps(forward: BucketForward, attention_mask: torch.Tensor, logits_to_keep: int,
                   rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`forward` run bucket by bucket (`length_buckets`), its outputs put back in the batch's row
    order and width; padding positions get 0, which every loss and metric masks out."""
    prompt_width = attention_mask.size(1) - logits_to_keep
    logps, entropies, order = [], [], []
    for idx, lo, hi in length_buckets(attention_mask, logits_to_keep, rows):
        part, entropy = forward(idx, lo, hi)
        keep = hi - prompt_width
        logps.append(F.pad(part, (0, logits_to_keep - keep)))
        if entropy is not None:
            entropies.append(F.pad(entropy, (0, logits_to_keep - keep)))
        order.append(idx)
    inverse = torch.argsort(torch.cat(order))
    return torch.cat(logps)[inverse], torch.cat(entropies)[inverse] if entropies else None


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  prompt_width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's prompt as an index into the batch's distinct prompts (ids and padding alike), and
    one row holding each distinct prompt; None when no two rows share one."""
    key = torch.cat([input_ids[:, :prompt_width], attention_mask[:, :prompt_width].to(input_ids.dtype)], 1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    if len(distinct) == len(key):
        return None
    rows = torch.arange(len(key), device=key.device)
    holder = torch.full((len(distinct),), len(key), device=key.device).scatter_reduce(0, inverse, rows, "amin")
    return inverse, holder


def shared_prompt_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                          compute_entropy: bool, autocast, head: str = "fused_lm_head") -> BucketForward | None:
    """A `BucketForward` that runs each distinct prompt once, now, and then only the rows'
    completions. None where it cannot: no shared prompt, a one-token prompt, or a model whose cache
    is not a plain `DynamicCache` (sliding windows, recurrent layers).

    The prompt runs without its last token. Each row's forward starts at that token, whose output
    predicts the first completion token, so TRL's fused LM head (`model(..., labels, fused_lm_head=True)`,
    with its temperature and its entropy) scores every completion token as in TRL's own path; `head`
    "dense_lm_head" asks `stages.dense_logps`'s head instead, which gives the same numbers faster on a CPU."""
    prompt_width = input_ids.size(1) - logits_to_keep
    groups = prompt_groups(input_ids, attention_mask, prompt_width)
    if groups is None or prompt_width < 2:
        return None
    inverse, holder = groups
    lo = int(first_real_column(attention_mask[holder, :prompt_width - 1], prompt_width - 1).min())
    if lo >= prompt_width - 1:
        return None
    prefix_mask = attention_mask[holder, lo:prompt_width - 1]
    with autocast():
        cache = model(input_ids=input_ids[holder, lo:prompt_width - 1], attention_mask=prefix_mask, use_cache=True,
                      logits_to_keep=1).cache
    if type(cache) is not DynamicCache or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    keys_values = [(layer.keys, layer.values) for layer in cache.layers]

    def forward(idx: torch.Tensor, _lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids, own_mask = input_ids[idx, prompt_width - 1:hi], attention_mask[idx, prompt_width - 1:hi]
        labels = ids.masked_fill(own_mask == 0, -100)  # column 0's label is dropped by the shift
        prompts = inverse[idx]
        # index_select, not k[prompts]: both gather, but the backward of advanced indexing on a CPU
        # adds a prompt's rows into it with parallel atomic adds, in an order that changes from run to
        # run, so the same batch gave other weights in their last bits (RESULTS.md, "General RL is not
        # bit-reproducible"); index_select's backward (index_add) adds them in row order
        rows_cache = DynamicCache([(k.index_select(0, prompts), v.index_select(0, prompts)) for k, v in keys_values])
        with autocast():
            out = model(input_ids=ids, attention_mask=torch.cat([prefix_mask[prompts], own_mask], 1),
                        cache=rows_cache, labels=labels, **{head: True})
        keep = hi - prompt_width
        return out.log_probs[:, -keep:], out.entropy[:, -keep:] if compute_entropy else None

    return forward
