"""HF `generate` as a token sampler: batched with left padding, on CPU or GPU, in the model's
precision (float32 on CPU unless a stage asks for bfloat16, which runs on AMX here)."""

from __future__ import annotations

from toolkit.core.loading import whole_model
from toolkit.rollouts.cpu_decode import weight_major_linear
from toolkit.rollouts.sampling import SamplingSpec, TokenSampler, cut_at_stop, think_end_id


def load_tokenizer(model_dir: str, trust_remote_code: bool = False):
    """The model's tokenizer, padding with end-of-sequence when it defines no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_for_generation(model_dir: str, trust_remote_code: bool = False, precision: str | None = None):
    """The model whole on this rank, in eval mode, with a left-padding tokenizer. `precision`:
    float32 or bfloat16; default bfloat16 on GPU, float32 on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(model_dir, trust_remote_code)
    tokenizer.padding_side = "left"  # generation appends on the right
    precision = precision or ("bfloat16" if torch.cuda.is_available() else "float32")
    with whole_model():  # generation runs on one rank
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, precision),
                                                     trust_remote_code=trust_remote_code)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    return model, tokenizer


def hf_sampler(model, tokenizer) -> TokenSampler:
    import torch

    def sample(seqs: list[list[int]], max_new_tokens: int, stop_at_think_end: bool,
               spec: SamplingSpec) -> list[list[int]]:
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=spec.temperature > 0,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        if spec.temperature > 0:  # top_k 0: not generate's default of the 50 likeliest tokens
            kwargs.update(temperature=spec.temperature, top_p=spec.top_p, top_k=0)
        stops, stop_string = {tokenizer.eos_token_id}, False
        if stop_at_think_end:
            if (think_end := think_end_id(tokenizer)) is not None:
                kwargs["eos_token_id"] = [tokenizer.eos_token_id, think_end]
                stops.add(think_end)
            else:
                kwargs.update(stop_strings=["</think>"], tokenizer=tokenizer)
                stop_string = True
        width, pad = max(len(s) for s in seqs), tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=model.device)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=model.device)
        with torch.no_grad(), weight_major_linear():
            # synced_gpus off: the model is whole on this rank (load_for_generation), even in a ZeRO-3 run.
            ids = model.generate(input_ids=input_ids, attention_mask=mask, **kwargs, synced_gpus=False)
        return [cut_at_stop(tokenizer, row, stops, stop_string) for row in ids[:, width:].tolist()]

    return sample
