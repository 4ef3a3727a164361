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


def _one_layer(model_dir: str, trust_remote_code: bool):
    """The architecture of `model_dir` with one layer and a small vocabulary, random weights, float32:
    what it does with packed rows, at a cost that does not grow with the model's depth or vocabulary."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    text = config.get_text_config()
    text.num_hidden_layers = 1
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:1]
    text.vocab_size = CHECK_VOCAB
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, dtype=torch.float32).eval()


def packing_mismatch(model_dir: str, trust_remote_code: bool = False, attention: str | None = None) -> str | None:
    """None when the padding-free batch gives the padded batch's logits for this architecture; else why
    not (a difference, or the error the check met). `attention`: the attention implementation the
    flattened rows run with (the model's own for both when None)."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    try:
        model = _one_layer(model_dir, trust_remote_code)
        rows = [{"input_ids": list(r)} for r in CHECK_ROWS]
        padded = DataCollatorForLanguageModeling(pad_token_id=0)(rows)
        flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
        with torch.no_grad():  # without a KV cache, as TRL's SFT loss runs the model: with one the mask ignores packing
            want = model(**{k: v for k, v in padded.items() if k != "labels"}, use_cache=False).logits
            if attention:
                model.set_attn_implementation(attention)
            got = model(**{k: v for k, v in flat.items() if k != "labels"}, use_cache=False).logits[0]
        want = torch.cat([want[i, :len(r)] for i, r in enumerate(CHECK_ROWS)])
        diff = (got - want).abs().max().item()
    except Exception as exc:  # any failure means: keep the padded batch, and say why
        return f"the check failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if diff > TOLERANCE * (1 + want.abs().max().item()):
        return f"flattened rows change the logits by up to {diff:.3g}: this architecture's attention does not keep rows apart"
    return None


def padding_free_collator(model_dir: str, trust_remote_code: bool, log=print):
    """(collator, model_init_kwargs): TRL's padding-free collator where `packing_mismatch` finds none,
    with per-row attention where that passes too; else (None, {}), TRL's padded batches. The choice and
    its reason go to `log`."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    why = packing_mismatch(model_dir, trust_remote_code)
    if why:
        log(f"sft: padded batches ({why})")
        return None, {}
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    on_mask = ("sft: padding-free batches (rows end to end, positions restarting: checked exact for this "
               "architecture); attention over the block-causal mask")
    if torch.cuda.is_available():  # a Python loop of small kernels per layer: measured faster on CPU only
        log(f"{on_mask} (row by row is measured on CPU only)")
        return collator, {}
    per_row = packing_mismatch(model_dir, trust_remote_code, attention=register_per_row_attention())
    if per_row:
        log(f"{on_mask}, not row by row ({per_row})")
        return collator, {}
    log("sft: padding-free batches (rows end to end, positions restarting), attention row by row: both checked "
        "exact for this architecture")
    return collator, {"attn_implementation": PER_ROW_ATTENTION}
