"""Rollouts: one interface for every stage that samples from a model (evaluation, curation
filters, rejection sampling, `posttrain generate`).

`rollout(..., backend="hf")`: HF `generate`, batched with left padding, on CPU or GPU. Completions
are decoded with special tokens kept (so <think> tags survive in tokenizers where they are special)
and then cut at the end-of-turn token. `backend="vllm"`: vLLM's offline engine, when the [vllm]
extra is installed and a GPU is present; recipes that ask for it are refused at validation otherwise.

Thinking modes and budgets (Qwen3): `enable_thinking=False` renders the chat template's empty think
block into the prompt. With `thinking_budget=B`, generation runs in two phases: up to B tokens, stopping
early at `</think>`; a completion that spent its budget without closing its thinking gets the
stop-thinking string appended once; then every unfinished completion continues, from its own tokens
so far (prompt + thinking are fed back as the prefix, never sampled again), for up to
`answer_max_new_tokens`. Budget 0 is the no-think mode. A model that answers without opening a think
block still has its first B tokens counted as thinking: the budget is a cap on tokens before the
answer phase, as in Qwen's reference implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stages.core.loading import whole_model
from stages.core.thinking import EMPTY_THINK, STOP_THINKING


@dataclass
class SamplingSpec:
    max_new_tokens: int = 256  # the whole completion (without a budget)
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    n: int = 1  # completions per prompt
    batch_size: int = 16
    seed: int = 0
    enable_thinking: bool = True  # False: the template's empty think block ends the prompt (no-think)
    thinking_budget: int | None = None  # tokens of thinking before the stop-thinking string is forced
    answer_max_new_tokens: int | None = None  # tokens after the thinking phase; None = max_new_tokens
    stop_thinking: str = STOP_THINKING

    @property
    def budgeted(self) -> bool:
        return self.thinking_budget is not None and self.thinking_budget > 0 and self.enable_thinking

    def effective(self) -> SamplingSpec:
        """Budget 0 means no thinking at all: the no-think mode."""
        return replace(self, enable_thinking=False, thinking_budget=None) if self.thinking_budget == 0 else self


@dataclass
class Completion:
    text: str
    finished: bool  # ended with the end-of-turn token; False = cut off by a token limit
    tokens: int  # generated tokens, an inserted stop-thinking string included
    thinking_tokens: int | None = None  # tokens spent before the answer phase (budgeted generation)
    budget_hit: bool = False  # the stop-thinking string was inserted


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
    with whole_model():  # generation runs on one rank
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, trust_remote_code=trust_remote_code)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    return model, tokenizer


def render(tokenizer, prompt: list[dict] | str, enable_thinking: bool = True) -> str:
    """The text a prompt becomes. No-think mode relies on the template's `enable_thinking`; for a
    template that ignores it (or a plain-text prompt) the empty think block is appended here."""
    if isinstance(prompt, str):
        return prompt if enable_thinking else prompt + EMPTY_THINK
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=enable_thinking)
    if not enable_thinking and not text.endswith(EMPTY_THINK):
        text += EMPTY_THINK
    return text


def _clean(text: str, tokenizer) -> str:
    for tok in {tokenizer.eos_token, tokenizer.pad_token, "<|im_end|>", "<|endoftext|>"} - {None}:
        text = text.split(tok)[0] if tok == tokenizer.eos_token else text.replace(tok, "")
    return text.strip()


def generate(model, tokenizer, prompts: list[list[dict] | str], spec: SamplingSpec,
             progress: bool = False) -> list[list[str]]:
    """Completion texts for each prompt: a list of `spec.n` strings per prompt. Chat prompts (lists
    of messages) go through the chat template; plain strings (stages.core.templates) are used as
    they are."""
    return [[c.text for c in cs] for cs in generate_completions(model, tokenizer, prompts, spec, progress)]


def generate_completions(model, tokenizer, prompts: list[list[dict] | str], spec: SamplingSpec,
                         progress: bool = False) -> list[list[Completion]]:
    """`spec.n` Completions per prompt, with a thinking budget when the spec sets one."""
    import torch
    from tqdm import tqdm

    spec = spec.effective()
    texts = [render(tokenizer, p, spec.enable_thinking) for p in prompts]
    torch.manual_seed(spec.seed)
    out: list[list[Completion]] = []
    for start in tqdm(range(0, len(texts), spec.batch_size), desc="generate", disable=not progress):
        batch = tokenizer(texts[start:start + spec.batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False)
        prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
        prompt_ids = [ids for ids in prompt_ids for _ in range(spec.n)]
        limit = spec.thinking_budget if spec.budgeted else spec.max_new_tokens
        first = _sample(model, tokenizer, batch, spec, limit, stop_at_think_end=spec.budgeted, n=spec.n)
        done = _finish_thinking(model, tokenizer, prompt_ids, first, spec) if spec.budgeted else [
            _completion(tokenizer, ids, []) for ids in first]
        out += [done[i:i + spec.n] for i in range(0, len(done), spec.n)]
    return out


def _think_end_id(tokenizer) -> int | None:
    ids = tokenizer("</think>", add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None


def _sample(model, tokenizer, batch, spec: SamplingSpec, max_new_tokens: int, stop_at_think_end: bool,
            n: int) -> list[list[int]]:
    """Generated token ids per sequence, cut after the token that ended it (kept: an end-of-turn, or
    the `</think>` that a thinking budget's first phase stops at), dropping the padding after it.

    Where the pad token is the end token (SmolLM2: both are 2), a row that stopped at `</think>`
    while others went on is padded with end tokens; those are padding, not an end of turn, or the
    row would never get its answer. So a row ends at the first of its stop tokens, and an end token
    that follows a `</think>` stop string is padding."""
    import torch

    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=spec.temperature > 0, num_return_sequences=n,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    if spec.temperature > 0:
        kwargs.update(temperature=spec.temperature, top_p=spec.top_p)
    stops, stop_string = {tokenizer.eos_token_id}, False
    if stop_at_think_end:
        if (think_end := _think_end_id(tokenizer)) is not None:
            kwargs["eos_token_id"] = [tokenizer.eos_token_id, think_end]
            stops.add(think_end)
        else:
            kwargs.update(stop_strings=["</think>"], tokenizer=tokenizer)
            stop_string = True
    batch = {k: v.to(model.device) for k, v in batch.items()}
    with torch.no_grad():
        # synced_gpus off: the model is whole on this rank (load_for_generation), even in a ZeRO-3 run.
        ids = model.generate(**batch, **kwargs, synced_gpus=False)
    out = []
    for row in ids[:, batch["input_ids"].shape[1]:].tolist():
        cut = next((i for i, t in enumerate(row) if t in stops or t == tokenizer.pad_token_id), None)
        if cut is None:
            out.append(row)
            continue
        padded = row[cut] not in stops or (
            stop_string and tokenizer.decode(row[:cut]).rstrip().endswith("</think>"))
        out.append(row[:cut] if padded else row[:cut + 1])
    return out


def _completion(tokenizer, ids: list[int], answer_ids: list[int], inserted: list[int] | None = None,
                closing_tokens: int | None = None) -> Completion:
    """`closing_tokens`: budgeted generation only, how many of `ids` are the model's own `</think>`."""
    inserted = inserted or []
    full = ids + inserted + answer_ids
    text = _clean(tokenizer.decode(full, skip_special_tokens=False), tokenizer)
    finished = bool(full) and full[-1] == tokenizer.eos_token_id
    thinking = None if closing_tokens is None else len(ids) - closing_tokens
    return Completion(text=text, finished=finished, tokens=len(full), thinking_tokens=thinking,
                      budget_hit=bool(inserted))


def _finish_thinking(model, tokenizer, prompt_ids: list[list[int]], first: list[list[int]],
                     spec: SamplingSpec) -> list[Completion]:
    """Phase two of budgeted generation: insert the stop-thinking string where the budget ran out,
    then continue every unfinished sequence from its own tokens to its answer."""
    import torch

    stop_ids = tokenizer(spec.stop_thinking, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    closed = ["</think>" in tokenizer.decode(ids) for ids in first]
    ended = [bool(ids) and ids[-1] == eos for ids in first]
    inserted = [[] if end or close else stop_ids for end, close in zip(ended, closed)]
    todo = [i for i, end in enumerate(ended) if not end]
    think_end_tokens = len(tokenizer("</think>", add_special_tokens=False)["input_ids"])
    answers: dict[int, list[int]] = {}
    answer_spec = replace(spec, n=1)
    for start in range(0, len(todo), spec.batch_size):
        chunk = todo[start:start + spec.batch_size]
        seqs = [prompt_ids[i] + first[i] + inserted[i] for i in chunk]
        width = max(len(s) for s in seqs)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
        cont = _sample(model, tokenizer, {"input_ids": input_ids, "attention_mask": mask}, answer_spec,
                       spec.answer_max_new_tokens or spec.max_new_tokens, stop_at_think_end=False, n=1)
        answers.update(zip(chunk, cont))
    return [_completion(tokenizer, ids, answers.get(i, []), inserted[i], think_end_tokens if closed[i] else 0)
            for i, ids in enumerate(first)]


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
                  trust_remote_code: bool = False) -> list[list[Completion]]:
    """The same contract on vLLM's offline engine; the budget's second phase resubmits each
    sequence's text, which vLLM's prefix cache serves without recomputing it.
    Not exercised on this CPU-only machine."""
    from vllm import LLM, SamplingParams

    spec = spec.effective()
    llm = LLM(model=model_dir, trust_remote_code=trust_remote_code, seed=spec.seed, enable_prefix_caching=True)
    tokenizer = llm.get_tokenizer()
    texts = [render(tokenizer, p, spec.enable_thinking) for p in prompts]
    base = dict(temperature=spec.temperature, top_p=spec.top_p, seed=spec.seed)

    def done(out, text: str, thinking: int | None = None, hit: bool = False, before: int = 0) -> Completion:
        return Completion(text=text, finished=out.finish_reason == "stop" and out.stop_reason is None,
                          tokens=before + len(out.token_ids), thinking_tokens=thinking, budget_hit=hit)

    if not spec.budgeted:
        params = SamplingParams(n=spec.n, max_tokens=spec.max_new_tokens, **base)
        return [[done(o, o.text) for o in r.outputs] for r in llm.generate(texts, params)]
    first = llm.generate(texts, SamplingParams(n=spec.n, max_tokens=spec.thinking_budget, stop=["</think>"],
                                               include_stop_str_in_output=True, **base))
    pending = []  # (prompt index, sample index, text so far, thinking tokens, budget hit)
    results: list[list[Completion | None]] = [[None] * spec.n for _ in texts]
    for i, r in enumerate(first):
        for j, o in enumerate(r.outputs):
            if o.finish_reason == "stop" and o.stop_reason is None:  # end of turn inside the thinking
                results[i][j] = done(o, o.text, len(o.token_ids))
                continue
            hit = o.stop_reason != "</think>"
            pending.append((i, j, o.text + (spec.stop_thinking if hit else ""), len(o.token_ids), hit))
    stop_tokens = len(tokenizer(spec.stop_thinking, add_special_tokens=False)["input_ids"])
    answer = SamplingParams(n=1, max_tokens=spec.answer_max_new_tokens or spec.max_new_tokens, **base)
    for (i, j, so_far, thinking, hit), r in zip(pending, llm.generate([texts[i] + t for i, _, t, _, _ in pending], answer)):
        results[i][j] = done(r.outputs[0], so_far + r.outputs[0].text, thinking, hit,
                             before=thinking + (stop_tokens if hit else 0))
    return results


def rollout_completions(model_dir: str, prompts: list[list[dict] | str], spec: SamplingSpec, backend: str = "hf",
                        trust_remote_code: bool = False, progress: bool = False) -> list[list[Completion]]:
    """`spec.n` Completions per prompt from the model in `model_dir`."""
    if backend == "vllm":
        return generate_vllm(model_dir, prompts, spec, trust_remote_code)
    model, tokenizer = load_for_generation(model_dir, trust_remote_code)
    return generate_completions(model, tokenizer, prompts, spec, progress=progress)


def rollout(model_dir: str, prompts: list[list[dict] | str], spec: SamplingSpec, backend: str = "hf",
            trust_remote_code: bool = False, progress: bool = False) -> list[list[str]]:
    """`spec.n` completion texts per prompt from the model in `model_dir`."""
    return [[c.text for c in cs] for cs in rollout_completions(model_dir, prompts, spec, backend, trust_remote_code,
                                                               progress)]
