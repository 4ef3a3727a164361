"""Padding-free SFT batches: each batch's rows laid end to end in one row, positions restarting at
every row, instead of a padded rectangle.

The loss is the same (the same tokens are labelled; the label at each row's first token, which no
token of that row predicts, is ignored as the padded batch's is), but the model reads no padding.
On qwen3's demo fusion data 32% of a padded batch of 4 rows is padding, and SmolLM2's SFT training
took 0.74x as long padding-free, with the same losses (benchmarks/bench_padding_free.py).

This is exact only where the model's attention keeps the rows apart: transformers builds a
block-causal mask from restarting position ids (`masking_utils.find_packed_sequence_indices`) for
its own architectures, but a model's own code (`trust_remote_code`) may read one long row as one
sequence. So each architecture is checked before training: a one-layer model of the same config
with random weights runs two rows both ways, and padding-free is used only when the logits agree.
The check runs without a KV cache, as TRL's SFT loss does: with one, transformers' mask ignores the
packing (on SmolLM2 the logits then move by 22).

Attention row by row: that block-causal mask keeps the rows apart, but SDPA still scores every
position of the flattened row against every other and masks most of the products away (a batch of
8 rows of 80 tokens: 640 x 640 scores where the rows need 8 x 80 x 80). `per_row_sdpa` runs SDPA on
each row's own slice instead, causal, from the restarting positions; it is checked like the mask and
used only where it passes, else the mask. Measured on CPU (benchmarks/bench_per_row_attention.py);
on a GPU, where a loop of small kernels per layer may lose to one masked kernel, the mask stays.

Reward models: TRL's RewardTrainer pads chosen and rejected responses alike, and the sequence
classifier pools each row at its last token. `collate_flat_preferences` lays the responses end to
end and `FlatRewards` reads each reward where the padded row would have been pooled; the check
(`reward_packing_mismatch`) compares the rewards both ways, as the SFT one compares the logits.
"""

from __future__ import annotations

CHECK_ROWS = ([5, 17, 42, 9, 33, 27, 11], [8, 21, 14, 3])  # two rows of different lengths, ids < CHECK_VOCAB
CHECK_VOCAB = 64
TOLERANCE = 1e-4
PER_ROW_ATTENTION = "posttrain_per_row_sdpa"  # a name in transformers' AttentionInterface
# what Llama- and Qwen-shaped attention layers pass beside the tensors, and the row bounds TRL's collator
# adds for flash attention (the same rows as the positions); anything else (attention sinks, softcapping,
# a sliding window) is refused, so that the check falls back to the block-causal mask
_KNOWN_KWARGS = {"dropout", "scaling", "use_cache", "cache_position", "output_attentions",
                 "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"}


def per_row_sdpa(module, query, key, value, attention_mask, position_ids=None, **kwargs):
    """transformers' SDPA attention on each row of a padding-free batch alone: `query`/`key`/`value`
    are (1, heads, positions, dim) for rows laid end to end, and a row starts where `position_ids` is
    0. Only for what padding-free training runs: one flattened row, no padding mask, no KV cache."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    unknown = sorted(k for k, v in kwargs.items() if v is not None and v is not False and k not in _KNOWN_KWARGS)
    if unknown:
        raise ValueError(f"per-row attention does not handle {unknown}")
    if attention_mask is not None or position_ids is None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        raise ValueError("per-row attention takes one padding-free row, without a padding mask or a KV cache")
    starts = torch.nonzero(position_ids[0] == 0).flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("per-row attention needs positions that start at 0")
    bounds = [*starts, query.shape[2]]
    kwargs = {k: v for k, v in kwargs.items() if k in ("dropout", "scaling")}
    rows = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, is_causal=True,
                                   **kwargs)[0] for a, b in zip(bounds, bounds[1:])]
    return torch.cat(rows, dim=1), None


def register_per_row_attention() -> str:
    """Make PER_ROW_ATTENTION loadable (`attn_implementation=`); returns the name. The mask function is
    the flash-attention one: no mask when nothing is padded, which is what padding-free batches are."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import flash_attention_mask

    AttentionInterface.register(PER_ROW_ATTENTION, per_row_sdpa)
    AttentionMaskInterface.register(PER_ROW_ATTENTION, flash_attention_mask)
    return PER_ROW_ATTENTION


def _one_layer(model_dir: str, trust_remote_code: bool, auto_class: str = "AutoModelForCausalLM"):
    """The architecture of `model_dir` with one layer and a small vocabulary, random weights, float32:
    what it does with packed rows, at a cost that does not grow with the model's depth or vocabulary.
    `auto_class`: the transformers Auto class that builds it (a reward model is a sequence classifier)."""
    import torch
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    text = config.get_text_config()
    text.num_hidden_layers = 1
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:1]
    text.vocab_size = CHECK_VOCAB
    if auto_class == "AutoModelForSequenceClassification":
        text.num_labels, text.pad_token_id = 1, 0  # a reward model's one output; CHECK_ROWS hold no 0
    torch.manual_seed(0)
    build = getattr(transformers, auto_class).from_config
    return build(config, trust_remote_code=trust_remote_code, dtype=torch.float32).eval()


_APART = "this architecture's attention does not keep rows apart"


def _compared(padded_and_flat, attention: str | None, cause: str = _APART) -> str | None:
    """None when `padded_and_flat(attention)` gives two equal tensors (the padded batch's outputs and
    the flattened rows'); else why not: a difference (and its likely `cause`), or the error the check met."""
    import torch

    try:
        with torch.no_grad():  # without a KV cache, as TRL's losses run the model: with one the mask ignores packing
            want, got = padded_and_flat(attention)
        diff = (got - want).abs().max().item()
    except Exception as exc:  # any failure means: keep the padded batch, and say why
        return f"the check failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if diff > TOLERANCE * (1 + want.abs().max().item()):
        return f"flattened rows change the logits by up to {diff:.3g}: {cause}"
    return None


def packing_mismatch(model_dir: str, trust_remote_code: bool = False, attention: str | None = None) -> str | None:
    """None when the padding-free batch gives the padded batch's logits for this architecture; else why
    not (a difference, or the error the check met). `attention`: the attention implementation the
    flattened rows run with (the model's own for both when None)."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    def padded_and_flat(attention):
        model = _one_layer(model_dir, trust_remote_code)
        rows = [{"input_ids": list(r)} for r in CHECK_ROWS]
        padded = DataCollatorForLanguageModeling(pad_token_id=0)(rows)
        flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
        want = model(**{k: v for k, v in padded.items() if k != "labels"}, use_cache=False).logits
        if attention:
            model.set_attn_implementation(attention)
        got = model(**{k: v for k, v in flat.items() if k != "labels"}, use_cache=False).logits[0]
        return torch.cat([want[i, :len(r)] for i, r in enumerate(CHECK_ROWS)]), got

    return _compared(padded_and_flat, attention)


def reward_packing_mismatch(model_dir: str, trust_remote_code: bool = False, attention: str | None = None) -> str | None:
    """`packing_mismatch` for a reward model: the rewards of a flat preference batch
    (`collate_flat_preferences`, read by `FlatRewards`) against TRL's padded one."""
    from trl.trainer.reward_trainer import DataCollatorForPreference

    def padded_and_flat(attention):
        model = _one_layer(model_dir, trust_remote_code, "AutoModelForSequenceClassification")
        pairs = [{"chosen_ids": list(CHECK_ROWS[0]), "rejected_ids": list(CHECK_ROWS[1])},
                 {"chosen_ids": list(CHECK_ROWS[1][:2]), "rejected_ids": list(CHECK_ROWS[0][:5])}]
        want = model(**DataCollatorForPreference(pad_token_id=0)(pairs), use_cache=False).logits
        if attention:
            model.set_attn_implementation(attention)
        return want, FlatRewards(model, reward_head(model))(**collate_flat_preferences(pairs, pad_token_id=0)).logits

    return _compared(padded_and_flat, attention, f"{_APART}, or the rewards are not read where the padded batch pools them")


def _padding_free_attention(check, kind: str, log) -> tuple[bool, dict]:
    """(padding-free, model_init_kwargs) from a packing check (`packing_mismatch` or
    `reward_packing_mismatch` with the model bound): padding-free where it passes, and per-row
    attention where that passes too. The choice and its reason go to `log`, prefixed with `kind`."""
    import torch

    why = check(None)
    if why:
        log(f"{kind}: padded batches ({why})")
        return False, {}
    on_mask = (f"{kind}: padding-free batches (rows end to end, positions restarting: checked exact for this "
               "architecture); attention over the block-causal mask")
    if torch.cuda.is_available():  # a Python loop of small kernels per layer: measured faster on CPU only
        log(f"{on_mask} (row by row is measured on CPU only)")
        return True, {}
    per_row = check(register_per_row_attention())
    if per_row:
        log(f"{on_mask}, not row by row ({per_row})")
        return True, {}
    log(f"{kind}: padding-free batches (rows end to end, positions restarting), attention row by row: both "
        "checked exact for this architecture")
    return True, {"attn_implementation": PER_ROW_ATTENTION}


def padding_free_collator(model_dir: str, trust_remote_code: bool, log=print):
    """(collator, model_init_kwargs): TRL's padding-free collator where `packing_mismatch` finds none,
    with per-row attention where that passes too; else (None, {}), TRL's padded batches. The choice and
    its reason go to `log`."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    flat, attention = _padding_free_attention(
        lambda attention: packing_mismatch(model_dir, trust_remote_code, attention=attention), "sft", log)
    return (DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True) if flat else None), attention


def reward_padding_free(model_dir: str, trust_remote_code: bool, log=print) -> tuple[bool, dict]:
    """(padding-free, model_init_kwargs) for reward-model training, as `padding_free_collator` chooses
    for SFT: flat preference batches where `reward_packing_mismatch` finds none."""
    return _padding_free_attention(
        lambda attention: reward_packing_mismatch(model_dir, trust_remote_code, attention=attention), "reward_model", log)


# --- preference pairs, padding-free -------------------------------------------------------------------
# TRL's RewardTrainer pads each batch's chosen and rejected responses to the longest of them; on r1's
# demo whole-response pairs 45% of a padded batch of 4 pairs is padding. Laid end to end, the model
# reads none, and each response's reward is read where the padded batch pools it.


def collate_flat_preferences(examples: list[dict], pad_token_id: int) -> dict:
    """TRL's preference batch (every chosen response, then every rejected one) as one row, positions
    restarting at each response. `pool_index`: where each response's reward is read, the place
    transformers' sequence classifiers pool a padded row (its rightmost token that is not the pad id);
    `attention_mask`: ones, read by TRL's token count only (`FlatRewards` does not pass it on, since a
    mask would hide the packing from transformers)."""
    import torch

    responses = [e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples]
    pool, start = [], 0
    for ids in responses:
        kept = [i for i, token in enumerate(ids) if token != pad_token_id]
        pool.append(start + (kept[-1] if kept else 0))
        start += len(ids)
    batch = {"input_ids": torch.tensor([[t for ids in responses for t in ids]]),
             "position_ids": torch.tensor([[i for ids in responses for i in range(len(ids))]]),
             "attention_mask": torch.ones(1, start, dtype=torch.long), "pool_index": torch.tensor(pool)}
    if "margin" in examples[0]:
        batch["margin"] = torch.tensor([e["margin"] for e in examples], dtype=torch.float)
    return batch


def reward_head(model):
    """The module that maps hidden states to rewards in transformers' sequence classifiers."""
    return model.get_submodule("score")


class FlatRewards:
    """What RewardTrainer's loss calls as `model(**batch)` for a flat batch: the model over the one row,
    and the reward head's output read at `pool_index`, shaped as the padded batch's pooled logits.
    The head's output at every position is taken with a forward hook, which fires however the trainer
    has wrapped the model (DeepSpeed included); the model's own pooling, at the row's end, is unused."""

    def __init__(self, model, head):
        self.model, self.head = model, head

    def __call__(self, input_ids, position_ids, pool_index, attention_mask=None, margin=None, use_cache=False):
        from types import SimpleNamespace

        outputs = []
        hook = self.head.register_forward_hook(lambda module, args, out: outputs.append(out))
        try:
            self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        finally:
            hook.remove()
        return SimpleNamespace(logits=outputs[-1][0, pool_index])


def flat_reward_trainer():
    """TRL's RewardTrainer with its loss reading flat batches (`collate_flat_preferences`) through
    `FlatRewards`; the loss and its metrics are TRL's own."""
    from trl import RewardTrainer

    class FlatRewardTrainer(RewardTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            flat = FlatRewards(model, reward_head(self.model))  # self.model: unwrapped, where the hook goes
            return super().compute_loss(flat, inputs, return_outputs, num_items_in_batch)

    return FlatRewardTrainer
