"""The GRPO family's advantages and losses as pure tensor functions, written from the papers.

They are the spec the tests check against hand-computed numbers. `grpo`, `dr_grpo` and `dapo` run
inside TRL's GRPOTrainer (tests check that TRL computes the same values as these functions for the
settings `stages.grpo` gives it); `kimi_mirror_descent` has no TRL counterpart and runs from here.

Shapes: B sequences, T completion tokens; `mask` is 1 on real completion tokens, 0 on padding.
"""

from __future__ import annotations

import torch

STD_EPS = 1e-4  # the std = 0 guard; TRL's value, so TRL and this module agree to the last digit


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True) -> torch.Tensor:
    """A_i = r_i - mean(group), divided by the group's std when `scale` (GRPO) and not (Dr. GRPO,
    Kimi). The std is the unbiased one, as in TRL; a group of equal rewards gets A = 0."""
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True) + STD_EPS)
    return centred.reshape(-1)


def zero_variance_groups(advantages: torch.Tensor, group_size: int, tol: float = 1e-6) -> torch.Tensor:
    """One bool per group: True where every member's advantage is 0, i.e. all rewards were equal.
    Such a group carries no policy gradient; DAPO's dynamic sampling drops it."""
    return (advantages.view(-1, group_size).abs() <= tol).all(dim=1)


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): pi_ref/pi - log(pi_ref/pi) - 1 (>= 0)."""
    d = ref_logps - logps
    return torch.exp(d) - d - 1


def clipped_surrogate(logps, old_logps, advantages, eps_low: float, eps_high: float) -> torch.Tensor:
    """Per-token PPO loss -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A), rho = pi/pi_old."""
    ratio = torch.exp(logps - old_logps)
    adv = advantages.unsqueeze(1)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)


def policy_loss(variant: str, logps, old_logps, advantages, mask, *, eps_low: float = 0.2,
                eps_high: float = 0.2, beta: float = 0.0, ref_logps=None,
                max_completion_length: int | None = None) -> torch.Tensor:
    """The clipped-surrogate losses, differing only in how tokens are averaged:

    - grpo: mean over sequences of each sequence's token mean (1/|o_i| per sequence);
    - dr_grpo: sum over all tokens / (B * max_completion_length), a constant;
    - dapo: sum over all tokens / number of tokens in the batch (token-level).
    The k3 KL (weight `beta`) is added per token before averaging, as DeepSeekMath does. Filler rows
    (dynamic sampling's masked groups, mask all zero) count in no denominator (`filler_rescale`).
    """
    per_token = clipped_surrogate(logps, old_logps, advantages, eps_low, eps_high)
    if beta:
        per_token = per_token + beta * k3_kl(logps, ref_logps)
    masked = per_token * mask
    if variant == "grpo":
        return (masked.sum(1) / mask.sum(1).clamp(min=1)).mean() * filler_rescale(mask)
    if variant == "dr_grpo":
        if not max_completion_length:
            raise ValueError("dr_grpo normalises by a constant: pass max_completion_length")
        return masked.sum() / (mask.shape[0] * max_completion_length) * filler_rescale(mask)
    if variant == "dapo":
        return masked.sum() / mask.sum().clamp(min=1)
    raise ValueError(f"unknown clipped-surrogate variant {variant!r}")


def kimi_mirror_descent_loss(logps, old_logps, advantages, mask, tau: float, beta: float = 0.0,
                             ref_logps=None) -> torch.Tensor:
    """Kimi k1.5's online policy mirror descent, as a loss to minimise:

        L = (1/k) sum_j [ -(r_j - mean r) log pi(y_j|x) + (tau/2) (log pi(y_j|x) - log pi_old(y_j|x))^2 ]

    whose gradient is the paper's per-sample gradient with the sign flipped. `advantages` are the
    mean-baselined rewards (no std division); log-probabilities are of whole sequences (token sums);
    no ratio clipping. With one update per rollout batch pi = pi_old, so the regulariser is 0 in
    value and gradient: it bites only when a batch is reused, which is what Kimi's "samples from
    pi_old" describes, so the stage takes `num_iterations` 2 by default with this loss and refuses 1
    (TRL then keeps the rollout policy's log-probabilities as `old_per_token_logps`). Departures: the
    paper states neither tau nor k nor the number of updates per batch; it resets the optimizer each
    iteration, which we do not; the optional k3 KL to a frozen reference (beta) is ours, off by default.
    """
    seq_logp = (logps * mask).sum(1)
    seq_log_ratio = ((logps - old_logps) * mask).sum(1)
    loss = (-advantages * seq_logp + 0.5 * tau * seq_log_ratio ** 2).mean()
    if beta:
        loss = loss + beta * ((k3_kl(logps, ref_logps) * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    return loss * filler_rescale(mask)


def filler_rescale(mask) -> float:
    """B / (rows with any token) for a micro-batch of B rows. Dynamic sampling fills a batch short of
    informative groups with masked rows (mask all zero): they add nothing to a per-sequence sum, but
    a mean over the B rows (grpo, kimi_mirror_descent) or a divisor of B x L (dr_grpo) would still
    count them and shrink the step by (B - fillers) / B. Multiplying by this undoes it; TRL's own
    grpo and dr_grpo losses get the same factor in the trainer. 1 when nothing is masked out."""
    live = int((mask.sum(1) > 0).sum())
    return mask.shape[0] / live if live else 1.0
