"""Rollouts: one interface for every stage that samples from a model (evaluation, curation filters).

`rollout(..., backend="hf")`: HF `generate`, batched with left padding, on CPU or GPU. Completions
are decoded with special tokens kept (so <think> tags survive in tokenizers where they are special)
and then cut at the end-of-turn token. `backend="vllm"`: vLLM's offline engine, when the [vllm]
extra is installed and a GPU is present; recipes that ask for it are refused at validation otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingSpec:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    n: int = 1  # completions per prompt
    batch_size: int = 16
    seed: int = 0


def load_tokenizer(model_dir: str, trust_remote_code: bool = False):
    """The model's tokenizer, padding with end-of-sequence when it defines no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_for_generation(model_dir: str, trust_remote_code: bool = False):
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(model_dir, trust_remote_code)
    tokenizer.padding_side = "left"  # generation appends on the right
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, trust_remote_code=trust_remote_code)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    return model, tokenizer


def _clean(text: str, tokenizer) -> str:
    for tok in {tokenizer.eos_token, tokenizer.pad_token, "<|im_end|>", "<|endoftext|>"} - {None}:
        text = text.split(tok)[0] if tok == tokenizer.eos_token else text.replace(tok, "")
    return text.strip()


def generate(model, tokenizer, prompts: list[list[dict] | str], spec: SamplingSpec,
             progress: bool = False) -> list[list[str]]:
    """Completions for each prompt: a list of `spec.n` strings per prompt. Chat prompts (lists of
    messages) go through the chat template; plain strings (stages.core.templates) are used as they are."""
    import torch
    from tqdm import tqdm

    texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in prompts]
    sample = spec.temperature > 0
    gen_kwargs = dict(max_new_tokens=spec.max_new_tokens, do_sample=sample, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, num_return_sequences=spec.n)
    if sample:
        gen_kwargs.update(temperature=spec.temperature, top_p=spec.top_p)
    torch.manual_seed(spec.seed)
    out: list[list[str]] = []
    batches = range(0, len(texts), spec.batch_size)
    for start in tqdm(batches, desc="generate", disable=not progress):
        batch = tokenizer(texts[start:start + spec.batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False).to(model.device)
        with torch.no_grad():
            ids = model.generate(**batch, **gen_kwargs)
        decoded = tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=False)
        decoded = [_clean(t, tokenizer) for t in decoded]
        out += [decoded[i:i + spec.n] for i in range(0, len(decoded), spec.n)]
    return out


def vllm_unavailable() -> list[str]:
    """Why vLLM rollouts cannot run here (empty when they can)."""
    import importlib.util

    import torch

    problems = []
    if importlib.util.find_spec("vllm") is None:
        problems.append("vLLM rollouts need the [vllm] extra: pip install 'posttrain[vllm]'")
    if not torch.cuda.is_available():
        problems.append("vLLM rollouts need a GPU; use rollout: hf on CPU")
    return problems


def generate_vllm(model_dir: str, prompts: list[list[dict] | str], spec: SamplingSpec,
                  trust_remote_code: bool = False) -> list[list[str]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, trust_remote_code=trust_remote_code, seed=spec.seed)
    tokenizer = llm.get_tokenizer()
    texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in prompts]
    params = SamplingParams(n=spec.n, temperature=spec.temperature, top_p=spec.top_p,
                            max_tokens=spec.max_new_tokens, seed=spec.seed)
    return [[o.text for o in out.outputs] for out in llm.generate(texts, params)]


def rollout(model_dir: str, prompts: list[list[dict] | str], spec: SamplingSpec, backend: str = "hf",
            trust_remote_code: bool = False, progress: bool = False) -> list[list[str]]:
    """`spec.n` completions per prompt from the model in `model_dir`."""
    if backend == "vllm":
        return generate_vllm(model_dir, prompts, spec, trust_remote_code)
    model, tokenizer = load_for_generation(model_dir, trust_remote_code)
    return generate(model, tokenizer, prompts, spec, progress=progress)
