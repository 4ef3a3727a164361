"""The GRPO family on hand-made batches: advantages and losses against numbers worked out by hand,
then TRL's trainer (as stages.grpo configures it) against the same formulas."""

import math

import pytest
import torch

from stages.logp_buckets import length_buckets
from stages.rl_losses import (
    filler_rescale,
    group_advantages,
    k3_kl,
    kimi_mirror_descent_loss,
    policy_loss,
    zero_variance_groups,
)

# Two sequences of up to 3 completion tokens; the first has one padding token.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ZEROS = torch.zeros(2, 3)


def test_group_advantages_grpo_and_dr_grpo():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735; group 2: all equal -> 0
    a = group_advantages(rewards, 4, scale=True)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert a[:4].tolist() == pytest.approx([expected, -expected, -expected, expected], abs=1e-5)
    assert a[4:].tolist() == [0.0] * 4
    assert group_advantages(rewards, 4, scale=False).tolist() == [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]
    assert zero_variance_groups(a, 4).tolist() == [False, True]


def test_token_averaging_differs_by_variant():
    # ratio 1 everywhere, so each token's loss is -A: sequence 1 tokens -1 (2 real), sequence 2 +0.5 (3 real)
    adv = torch.tensor([1.0, -0.5])
    assert policy_loss("grpo", ZEROS, ZEROS, adv, MASK).item() == pytest.approx((-1.0 + 0.5) / 2)
    assert policy_loss("dapo", ZEROS, ZEROS, adv, MASK).item() == pytest.approx((-2.0 + 1.5) / 5)
    dr = policy_loss("dr_grpo", ZEROS, ZEROS, adv, MASK, max_completion_length=4)
    assert dr.item() == pytest.approx((-2.0 + 1.5) / (2 * 4))


def test_clipping_low_and_high():
    logps = torch.tensor([[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]])  # ratios e^0.5 = 1.6487 and e^-0.5 = 0.6065
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    # seq 1: -min(1.6487, 1.2) = -1.2; seq 2: -min(-0.6065, -0.8) = 0.8
    assert policy_loss("grpo", logps, ZEROS, adv, mask).item() == pytest.approx((-1.2 + 0.8) / 2)
    # clip-higher (DAPO): the upper bound moves to 1.28, the lower stays at 0.8
    assert policy_loss("dapo", logps, ZEROS, adv, mask, eps_high=0.28).item() == pytest.approx((-1.28 + 0.8) / 2)


def test_k3_kl_value_and_its_place_in_the_loss():
    ref = torch.full((2, 3), math.log(0.5))
    # pi_ref/pi = 0.5: 0.5 - log 0.5 - 1 = 0.19315
    assert k3_kl(ZEROS, ref)[0, 0].item() == pytest.approx(0.5 + math.log(2) - 1)
    assert k3_kl(ZEROS, ZEROS).abs().max().item() == 0.0
    with_kl = policy_loss("grpo", ZEROS, ZEROS, torch.zeros(2), MASK, beta=0.04, ref_logps=ref)
    assert with_kl.item() == pytest.approx(0.04 * (0.5 + math.log(2) - 1))


def test_kimi_mirror_descent_value():
    logps = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -1.0]])
    old = torch.tensor([[-1.5, -2.0, 0.0], [-0.5, -1.0, -1.0]])
    adv = torch.tensor([0.5, -0.5])
    # sequence log-probs: -3 (padding excluded) and -2; log ratios 0.5 and 0.5
    # L = mean(-0.5 * -3 + 0.5 * tau * 0.25, 0.5 * -2 + 0.5 * tau * 0.25), tau = 2
    expected = ((1.5 + 0.25) + (-1.0 + 0.25)) / 2
    assert kimi_mirror_descent_loss(logps, old, adv, MASK, tau=2.0).item() == pytest.approx(expected)


def test_kimi_gradient_is_the_papers_on_policy():
    # With pi = pi_old the regulariser's gradient vanishes: dL/dlogp_t = -(r - mean r) / k per real token.
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -1.0]], requires_grad=True)
    adv = torch.tensor([0.5, -0.5])
    kimi_mirror_descent_loss(logps, logps.detach(), adv, MASK, tau=1.0).backward()
    assert logps.grad.tolist() == [[-0.25, -0.25, 0.0], [0.25, 0.25, 0.25]]


def test_unknown_variant_and_missing_constant_are_refused():
    with pytest.raises(ValueError, match="unknown"):
        policy_loss("ppo", ZEROS, ZEROS, torch.zeros(2), MASK)
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss("dr_grpo", ZEROS, ZEROS, torch.zeros(2), MASK)


# ---- TRL, configured by stages.grpo, computes what the formulas say -------------------------------

def _trainer(tiny_model, tmp_path, loss: str, bucket_rows: int | None = None, **knobs):
    from datasets import Dataset

    from stages.grpo import GRPOConfig, trl_config
    from stages.grpo_trainer import PosttrainGRPOTrainer, RLOptions
    from stages.prompt_sampler import PromptSampler
    from stages.runtime import StageContext
    from toolkit.rewards import get_reward

    cfg = GRPOConfig(name="rl", model="base", data="synthetic_math", loss=loss, rewards=[{"name": "format_think"}],
                     num_generations=2, per_device_batch_size=4, max_completion_length=8, beta=0.05, **knobs)
    ctx = StageContext.local(tmp_path)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1?"}], "_index": 0}])
    rl = RLOptions(sampler=PromptSampler("random", 1), success_reward=0, loss=loss, tau=0.3, length_bucket_rows=bucket_rows)
    trainer = PosttrainGRPOTrainer(model=str(tiny_model), args=trl_config(cfg, ctx), train_dataset=data,
                                   reward_funcs=[get_reward("format_think")], rl=rl)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer, cfg


def test_the_stage_s_adam_epsilon_is_the_optimizer_s(tiny_model, tmp_path):
    """`adam_epsilon` (probes 30-31, benchmarks/RESULTS.md) reaches the AdamW the trainer builds."""
    default, _ = _trainer(tiny_model, tmp_path / "a", "grpo")
    raised, _ = _trainer(tiny_model, tmp_path / "b", "grpo", adam_epsilon=1e-4)
    assert default.create_optimizer().defaults["eps"] == 1e-8
    assert raised.create_optimizer().defaults["eps"] == 1e-4


def _batch(trainer):
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 300, (4, 5), generator=g)
    completion_ids = torch.randint(5, 300, (4, 8), generator=g)
    completion_mask = torch.ones(4, 8)
    completion_mask[0, 5:] = 0
    completion_mask[2, 3:] = 0
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([torch.ones(4, 5), completion_mask], 1), 8)
    noise = lambda scale: torch.randn(4, 8, generator=g) * scale
    return logps, {"prompt_ids": prompt_ids, "prompt_mask": torch.ones(4, 5), "completion_ids": completion_ids,
                   "completion_mask": completion_mask, "advantages": torch.tensor([1.0, -1.0, 0.7, -0.7]),
                   "old_per_token_logps": logps + noise(0.3),  # ratios far enough from 1 to clip
                   "ref_per_token_logps": logps + noise(0.2), "num_items_in_batch": completion_mask.sum()}


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo"])
def test_trl_loss_matches_the_formula(tiny_model, tmp_path, loss):
    trainer, cfg = _trainer(tiny_model, tmp_path, loss)
    logps, inputs = _batch(trainer)
    with torch.no_grad():
        got = trainer._compute_loss(trainer.model, inputs).item()
    want = policy_loss(loss, logps, inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"],
                       eps_low=cfg.clip_low, eps_high=cfg.effective("clip_high"), beta=cfg.effective("beta"),
                       ref_logps=inputs["ref_per_token_logps"], max_completion_length=cfg.max_completion_length)
    assert got == pytest.approx(want.item(), rel=1e-4, abs=1e-6)
    assert trainer._metrics["train"]["clip_ratio/region_mean"][-1] > 0  # the batch exercised clipping


def test_kimi_loss_runs_in_the_trainer(tiny_model, tmp_path):
    trainer, cfg = _trainer(tiny_model, tmp_path, "kimi_mirror_descent")
    logps, inputs = _batch(trainer)
    with torch.no_grad():
        got = trainer._compute_loss(trainer.model, inputs).item()
    want = kimi_mirror_descent_loss(logps, inputs["old_per_token_logps"], inputs["advantages"],
                                    inputs["completion_mask"], tau=0.3, beta=0.05, ref_logps=inputs["ref_per_token_logps"])
    assert got == pytest.approx(want.item(), rel=1e-4)
    assert cfg.effective("scale_rewards") is False  # mean baseline only, as in the paper


@pytest.mark.parametrize("variant", ["grpo", "dr_grpo", "dapo", "kimi_mirror_descent"])
def test_filler_rows_count_in_no_denominator(variant):
    """Dynamic sampling's masked filler rows leave every loss as it is on the live rows alone (they
    shrank grpo, dr_grpo and the Kimi loss by (B - fillers) / B)."""
    torch.manual_seed(0)
    live, fillers = 6, 2
    logps = torch.randn(live + fillers, 5)
    old = logps.detach() + 0.1 * torch.randn_like(logps)
    adv = torch.randn(live + fillers)
    mask = torch.ones(live + fillers, 5)
    mask[live:] = 0
    mask[0, 3:] = 0  # a short live sequence

    def loss(rows):
        if variant == "kimi_mirror_descent":
            return kimi_mirror_descent_loss(logps[rows], old[rows], adv[rows], mask[rows], tau=0.5)
        return policy_loss(variant, logps[rows], old[rows], adv[rows], mask[rows], max_completion_length=5)

    assert loss(slice(None)).item() == pytest.approx(loss(slice(0, live)).item(), rel=1e-6)
    assert filler_rescale(mask) == pytest.approx((live + fillers) / live) and filler_rescale(mask[:live]) == 1.0


def test_kimi_tau_acts_because_each_rollout_batch_is_updated_on_more_than_once(tiny_model, tmp_path):
    """With one update per batch pi_old is pi and tau changes nothing (grad(tau) is the same for every
    tau); the stage's default of two updates per batch makes TRL keep the rollout policy's
    log-probabilities, and from the second update on tau shapes the gradient."""
    from stages.grpo import GRPOConfig

    trainer, cfg = _trainer(tiny_model, tmp_path, "kimi_mirror_descent")
    assert cfg.effective("num_iterations") == 2 and trainer.num_iterations == 2
    with pytest.raises(ValueError, match="tau term has no gradient"):
        GRPOConfig(name="rl", model="base", data="synthetic_math", loss="kimi_mirror_descent",
                   rewards=[{"name": "accuracy_math"}], num_iterations=1)
    logps, inputs = _batch(trainer)
    inputs = {**inputs, "ref_per_token_logps": None}
    trainer.beta = 0.0

    def grad(tau: float, old: torch.Tensor) -> torch.Tensor:
        trainer.rl.tau = tau
        trainer.model.zero_grad()
        trainer._compute_loss(trainer.model, {**inputs, "old_per_token_logps": old}).backward()
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])

    same = logps.detach()  # the first update on a batch: pi_old is pi
    assert torch.allclose(grad(0.1, same), grad(100.0, same))
    updated = inputs["old_per_token_logps"]  # a later update on the same batch: pi has moved from pi_old
    assert not torch.allclose(grad(0.1, updated), grad(100.0, updated))


def test_length_buckets_sort_rows_and_cut_each_bucket_to_its_real_tokens():
    # prompts 3 wide (left-padded), completions 4 wide (right-padded)
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1],    # row 0: prompt 2, completion 4
                         [1, 1, 1, 1, 0, 0, 0],    # row 1: prompt 3, completion 1
                         [0, 0, 1, 1, 1, 0, 0],    # row 2: prompt 1, completion 2
                         [0, 0, 1, 0, 0, 0, 0]])   # row 3: prompt 1, completion empty
    buckets = [(idx.tolist(), lo, hi) for idx, lo, hi in length_buckets(mask, 4, rows=2)]
    # by end column: row 3 (3, raised to 4: one completion column at least), row 1 (4), row 2 (5), row 0 (7)
    assert buckets == [([3, 1], 0, 4), ([2, 0], 1, 7)]


@pytest.mark.parametrize("head", ["fused_lm_head", "dense_lm_head"])
@pytest.mark.parametrize("shared", [False, True], ids=["distinct_prompts", "groups_share_prompts"])
@pytest.mark.parametrize("loss", ["grpo", "dapo", "kimi_mirror_descent"])
def test_length_buckets_give_trl_s_loss_and_gradient(tiny_model, tmp_path, loss, shared, head):
    """The policy's log-probabilities over length buckets equal TRL's one padded batch at every real
    token, and so do the loss and its gradient, with prompts and completions of mixed lengths; where
    groups share a prompt (as GRPO's do), that prompt runs once and its gradient comes from each row.
    A trainer built with buckets on a float32 CPU model scores them with the dense LM head; TRL's
    padded batch keeps TRL's fused head through the same model."""
    from stages.logp_buckets import shared_prompt_forward

    trainer, _ = _trainer(tiny_model, tmp_path, loss, bucket_rows=2 if head == "dense_lm_head" else None)
    assert trainer._bucket_head == head
    _, inputs = _batch(trainer)
    inputs["prompt_mask"][1, :3] = 0  # left padding of different widths
    inputs["prompt_mask"][3, :1] = 0
    if shared:  # two groups of two: rows 0-1 with 3 padding columns, rows 2-3 with 1
        inputs["prompt_ids"][0], inputs["prompt_ids"][2] = inputs["prompt_ids"][1], inputs["prompt_ids"][3]
        inputs["prompt_mask"][0], inputs["prompt_mask"][2] = inputs["prompt_mask"][1], inputs["prompt_mask"][3]
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():  # the path under test: shared prompts run once, distinct ones row by row
        assert (shared_prompt_forward(trainer.model, ids, attention, 8, False, trainer.accelerator.autocast, head)
                is not None) == shared

    def run(rows):
        trainer.rl.length_bucket_rows = rows
        trainer.model.zero_grad()
        logps, entropy, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, 8,
                                                                        compute_entropy=True)
        value = trainer._compute_loss(trainer.model, inputs)
        value.backward()
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        real = inputs["completion_mask"].bool()
        return logps.detach()[real], entropy.detach()[real], value.item(), grads

    padded, bucketed = run(None), run(2)
    assert torch.allclose(padded[0], bucketed[0], atol=1e-4) and torch.allclose(padded[1], bucketed[1], atol=1e-4)
    assert bucketed[2] == pytest.approx(padded[2], rel=1e-4, abs=1e-6)
    assert torch.allclose(padded[3], bucketed[3], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "recomputed"])
def test_the_dense_head_gives_trl_s_log_probabilities_entropies_and_gradients(monkeypatch, keep):
    """`DenseLogProbs` against TRL's fused head on the same inputs: log p of each label and each
    position's entropy at a temperature, and the gradients of a loss that uses both, with the log-
    probabilities kept for the backward or recomputed there in chunks of positions."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    import stages.dense_logps as dense

    monkeypatch.setattr(dense, "CHUNK_TOKENS", 7)  # 3 chunks of 20 positions, the last one short
    if not keep:
        monkeypatch.setattr(dense, "KEEP_BYTES", 0)
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(20, 16, generator=g), torch.randn(300, 16, generator=g) * 0.5
    labels = torch.randint(0, 300, (20,), generator=g)
    mix = torch.randn(20, generator=g), torch.randn(20, generator=g)

    def run(head):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        logps, entropy = head(h, w)
        ((logps * mix[0]).sum() + (entropy * mix[1]).sum()).backward()
        return logps.detach(), entropy.detach(), h.grad, w.grad

    trl = run(lambda h, w: ChunkedLogProbFunction.apply(h, w, None, labels, 0.7, 128, None, 1.0, ("log_probs", "entropy"))[:2])
    ours = run(lambda h, w: dense.DenseLogProbs.apply(h, w, labels, 0.7)[:2])
    for a, b in zip(trl, ours):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(trl[1], run(lambda h, w: dense.DenseLogProbs.apply(h, w, labels, 1.0)[:2])[1], atol=1e-3)


def test_the_dense_head_stays_off_where_trl_s_head_knows_more():
    from transformers import AutoConfig, AutoModelForCausalLM

    from stages.dense_logps import dense_head_usable

    config = AutoConfig.for_model("llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(config)
    assert dense_head_usable(model)
    assert not dense_head_usable(model.to(torch.bfloat16))
    softcapped = AutoModelForCausalLM.from_config(config)
    softcapped.config.final_logit_softcapping = 30.0
    assert not dense_head_usable(softcapped)


def test_the_bucketed_backward_adds_each_shared_prompt_s_gradients_in_a_fixed_order(tiny_model, tmp_path):
    """A prompt run once for its group gathers its keys and values for each row; the backward adds the
    rows' gradients back into it. Advanced indexing (`keys[rows]`) does that with an accumulating
    `index_put`, which on a CPU adds in parallel with atomic adds, so the sum's order, and its last
    bits, changed from run to run: general RL wrote other weights from the same batch (RESULTS.md,
    "General RL is not bit-reproducible"). No accumulating `index_put` with a repeated index may run
    in the backward; a race that shows once in tens of runs is not a test, so the op is looked for."""
    from torch.utils._python_dispatch import TorchDispatchMode

    trainer, _ = _trainer(tiny_model, tmp_path, "grpo", bucket_rows=2)
    _, inputs = _batch(trainer)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    for rows, _, _ in length_buckets(attention, 8, 2):  # the rows of each bucket share a prompt, as a
        inputs["prompt_ids"][rows] = inputs["prompt_ids"][rows[0]].clone()  # group's rows of like length do
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    trainer.model.zero_grad()
    logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, 8)

    racy = []  # accumulating index_puts with a repeated index, seen in the backward

    class RacyAdds(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.__name__.startswith(("index_put", "_index_put_impl")):
                accumulate = kwargs.get("accumulate", args[3] if len(args) > 3 else False)
                index = [i for i in args[1] if i is not None]
                repeated = any(i.dtype != torch.bool and i.unique().numel() < i.numel() for i in index)
                if accumulate and repeated:
                    racy.append(func.__name__)
            return func(*args, **kwargs)

    with RacyAdds():
        (logps * inputs["completion_mask"]).sum().backward()
    assert racy == []
    assert all(p.grad is not None for p in trainer.model.parameters() if p.requires_grad)
