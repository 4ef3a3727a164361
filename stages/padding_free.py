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
"""

from __future__ import annotations

CHECK_ROWS = ([5, 17, 42, 9, 33, 27, 11], [8, 21, 14, 3])  # two rows of different lengths, ids < CHECK_VOCAB
CHECK_VOCAB = 64
TOLERANCE = 1e-4


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


def packing_mismatch(model_dir: str, trust_remote_code: bool = False) -> str | None:
    """None when the padding-free batch gives the padded batch's logits for this architecture; else why
    not (a difference, or the error the check met)."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    try:
        model = _one_layer(model_dir, trust_remote_code)
        rows = [{"input_ids": list(r)} for r in CHECK_ROWS]
        padded = DataCollatorForLanguageModeling(pad_token_id=0)(rows)
        flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
        with torch.no_grad():  # without a KV cache, as TRL's SFT loss runs the model: with one the mask ignores packing
            want = model(**{k: v for k, v in padded.items() if k != "labels"}, use_cache=False).logits
            got = model(**{k: v for k, v in flat.items() if k != "labels"}, use_cache=False).logits[0]
        want = torch.cat([want[i, :len(r)] for i, r in enumerate(CHECK_ROWS)])
        diff = (got - want).abs().max().item()
    except Exception as exc:  # any failure means: keep the padded batch, and say why
        return f"the check failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if diff > TOLERANCE * (1 + want.abs().max().item()):
        return f"flattened rows change the logits by up to {diff:.3g}: this architecture's attention does not keep rows apart"
    return None


def padding_free_collator(model_dir: str, trust_remote_code: bool, log=print):
    """TRL's padding-free collator where `packing_mismatch` finds none, else None (TRL's padded
    batches); the choice and its reason go to `log`."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    why = packing_mismatch(model_dir, trust_remote_code)
    if why:
        log(f"sft: padded batches ({why})")
        return None
    log("sft: padding-free batches (rows end to end, positions restarting: checked exact for this architecture)")
    return DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
