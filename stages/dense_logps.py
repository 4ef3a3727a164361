"""Completion tokens' log-probabilities and entropies through the LM head, for a CPU.

TRL's fused LM head (`add_fused_lm_head`, `trl.kernels.chunked_logprob`) folds each vocabulary tile
in a Triton kernel on a GPU; on a CPU it falls back to torch ops that make about a dozen passes over
every tile, and it scores every position of the batch, prompt and padding included. On SmolLM2's
49,152-token vocabulary that fallback took 1.5 s for the forward and backward of 1,000 positions
here, against 0.2 s for each of the three matmuls it needs (benchmarks/RESULTS.md, "A dense LM head
on the CPU"). This head does the same arithmetic in a few fused torch ops per chunk of positions,
scores only the positions whose label is real, and keeps the log-probabilities for the backward
where they are small (a GRPO bucket's are tens of MB) and recomputes them chunk by chunk where not,
so a long batch costs one chunk's logits.

The numbers are TRL's up to float rounding (tests/test_rl_losses.py holds them together): the logits
divided by the sampling temperature, log p of each label, and the entropy of each position's
distribution; the entropy has its gradient too (TRL's entropy bonus uses it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

CHUNK_TOKENS = 1024  # positions per matmul: 1024 x 49,152 float32 logits are 200 MB
KEEP_BYTES = 256 << 20  # log-probabilities kept for the backward up to this size, recomputed above it


def _chunks(n: int):
    return [(start, min(start + CHUNK_TOKENS, n)) for start in range(0, n, CHUNK_TOKENS)]


class DenseLogProbs(torch.autograd.Function):
    """(log p(label), entropy, whether the label is the likeliest token) per row of `hidden` [N, H]
    under softmax(hidden @ weight.T / temperature); the third has no gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature: float):
        ctx.set_materialize_grads(False)
        logps = hidden.new_empty(hidden.size(0), dtype=torch.float32)
        entropy, log_z = torch.empty_like(logps), torch.empty_like(logps)
        top1 = torch.empty_like(logps, dtype=torch.bool)
        keep = hidden.size(0) * weight.size(0) * 4 <= KEEP_BYTES
        kept = []
        for lo, hi in _chunks(hidden.size(0)):
            log_p = torch.mm(hidden[lo:hi], weight.t()).div_(temperature)
            log_z[lo:hi] = torch.logsumexp(log_p, -1)
            log_p.sub_(log_z[lo:hi, None])
            logps[lo:hi] = log_p.gather(1, labels[lo:hi, None]).squeeze(1)
            top1[lo:hi] = logps[lo:hi] >= log_p.amax(1)
            entropy[lo:hi] = log_p.exp().mul_(log_p).sum(1).neg_()
            if keep:
                kept.append(log_p)
        ctx.save_for_backward(hidden, weight, labels, log_z, entropy)
        ctx.temperature, ctx.kept = temperature, kept
        ctx.mark_non_differentiable(top1)
        return logps, entropy, top1

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy, _grad_top1):
        hidden, weight, labels, log_z, entropy = ctx.saved_tensors
        t = ctx.temperature
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        if grad_logps is None and grad_entropy is None:
            return grad_hidden, grad_weight, None, None
        for i, (lo, hi) in enumerate(_chunks(hidden.size(0))):
            if ctx.kept:
                log_p = ctx.kept[i]
            else:
                log_p = torch.mm(hidden[lo:hi], weight.t()).div_(t).sub_(log_z[lo:hi, None])
            p = log_p.exp()
            # d log p(y) / dz = onehot(y) - p; d entropy / dz = -p (log p + entropy); z = logits / t,
            # so each is divided by t on its way to the logits
            if grad_entropy is None:
                grad = p.mul_(grad_logps[lo:hi, None] / -t)
            else:
                grad = (log_p + entropy[lo:hi, None]).mul_(p).mul_(grad_entropy[lo:hi, None] / -t)
                if grad_logps is not None:
                    grad.sub_(p.mul_(grad_logps[lo:hi, None] / t))
            if grad_logps is not None:
                grad.scatter_add_(1, labels[lo:hi, None], grad_logps[lo:hi, None] / t)
            if grad_hidden is not None:
                grad_hidden[lo:hi] = torch.mm(grad, weight)
            if grad_weight is not None:
                grad_weight.addmm_(grad.t(), hidden[lo:hi])
        ctx.kept = None
        return grad_hidden, grad_weight, None, None


@dataclass
class DenseHeadOutput:
    log_probs: torch.Tensor  # [B, L - 1]: log p of each next label, 0 where the label is -100
    entropy: torch.Tensor  # [B, L - 1]: each position's entropy, 0 where the label is -100


def dense_head_usable(model) -> bool:
    """A float32 model on a CPU whose head has no bias, softcap or logit scaling (TRL's head knows
    those; this one does not) and is not partitioned by ZeRO-3."""
    head = model.get_output_embeddings()
    config = model.config.get_text_config()
    scaled = any(getattr(config, key, None) is not None for key in (
        "final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling"))
    return (head is not None and head.weight.device.type == "cpu" and head.weight.dtype == torch.float32
            and head.bias is None and not scaled and not hasattr(head.weight, "ds_id"))


def _dense_scores(model, args, kwargs, labels, temperature: float) -> tuple[torch.Tensor, ...]:
    """The backbone, then the dense head at every position whose next label is real: (label mask,
    log p, entropy, top-1), each [B, L - 1] and zero where the label is -100."""
    if torch.is_autocast_enabled("cpu"):
        raise RuntimeError("the dense LM head computes in float32: it is not for autocast")
    kwargs["use_cache"] = False
    hidden = model.base_model(*args, **kwargs).last_hidden_state
    hidden, labels = hidden[:, :-1], labels[:, 1:]
    real = labels != -100
    scores = DenseLogProbs.apply(hidden[real], model.get_output_embeddings().weight, labels[real], temperature)
    return real, *(torch.zeros(real.shape, dtype=x.dtype, device=x.device).masked_scatter(real, x) for x in scores)


def add_dense_lm_head(model, temperature: float) -> None:
    """`model(..., labels=labels, dense_lm_head=True)` returns a `DenseHeadOutput`, scored as TRL's
    fused head scores (`add_fused_lm_head`, whose forward this wraps and calls otherwise). Called
    through the model, so DDP and PEFT wrappers see the forward as usual."""
    inner_forward = model.forward

    @functools.wraps(type(model).forward)  # generate validates its kwargs against this signature
    def forward(*args, dense_lm_head: bool = False, labels=None, **kwargs):
        if not dense_lm_head:
            return inner_forward(*args, **kwargs, **({} if labels is None else {"labels": labels}))
        _, logps, entropy, _ = _dense_scores(model, args, kwargs, labels, temperature)
        return DenseHeadOutput(logps, entropy)

    model.forward = forward


def answer_fused_head_densely(model) -> bool:
    """Answer TRL's fused-head calls (`model(..., labels, fused_lm_head=True)`, which TRL's SFT trainer
    makes for its loss and its entropy and token-accuracy metrics) with the dense head, where
    `dense_head_usable` and the model has no MoE router loss to add; returns whether it did. TRL's
    head on a CPU scores every position, prompt and padding included, with about a dozen passes over
    each vocabulary tile; this one scores the positions with a real label. The output is TRL's
    `FusedCausalLMOutput` with the fields SFT reads (log_probs, entropy, is_top1, label_mask) and its
    loss; the same numbers up to float rounding (tests/test_runtime.py). Calls this head does not
    answer the same way (labels pre-shifted for sequence parallelism, router logits) go to TRL's."""
    from trl.trainer.utils import FusedCausalLMOutput

    if not dense_head_usable(model) or getattr(model.config.get_text_config(), "output_router_logits", False):
        return False
    inner_forward = model.forward

    @functools.wraps(type(model).forward)
    def forward(*args, fused_lm_head: bool = False, labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head or kwargs.get("shift_labels") is not None or kwargs.get("output_router_logits"):
            given = {"fused_lm_head": fused_lm_head, "labels": labels, "num_items_in_batch": num_items_in_batch}
            return inner_forward(*args, **kwargs, **{k: v for k, v in given.items() if v is not None})
        kwargs.pop("shift_labels", None)
        real, logps, entropy, top1 = _dense_scores(model, args, kwargs, labels, 1.0)
        loss = -logps.sum() / (real.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        return FusedCausalLMOutput(loss=loss, log_probs=logps, entropy=entropy, is_top1=top1, label_mask=real)

    model.forward = forward
    return True
