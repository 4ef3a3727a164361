"""What every engine shares: the sampling settings, the completion record, prompt rendering, and
budgeted two-phase generation written once over a token-level sampler.

Thinking modes and budgets (Qwen3): `enable_thinking=False` renders the chat template's empty think
block into the prompt. With `thinking_budget=B`, generation runs in two phases: up to B tokens, stopping
early at `</think>`; a completion that spent its budget without closing its thinking gets the
stop-thinking string appended once; then every unfinished completion continues, from its own tokens
so far (prompt + thinking are fed back as the prefix, never sampled again), for up to
`answer_max_new_tokens`. Budget 0 is the no-think mode. A model that answers without opening a think
block still has its first B tokens counted as thinking: the budget is a cap on tokens before the
answer phase, as in Qwen's reference implementation. A sampler that controls each step (ORT's) runs
the same rules in one pass: the stop-thinking string is forced into the row's own generation, so no
row is fed through the model a second time (`BudgetedSampler`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from toolkit.core.thinking import EMPTY_THINK, STOP_THINKING

THINK_END = "</think>"


@dataclass
class SamplingSpec:
    max_new_tokens: int = 256  # the whole completion (without a budget)
    # Sampled: from the whole distribution after temperature and top_p, as TRL, vLLM and the papers
    # sample; no engine may cut it to its top-k by a default of its own (HF's and ORT GenAI's is 50).
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
    # the token ids the engine generated, as TRL's completion_ids: the end token and an inserted
    # stop-thinking string included. Lengths and length rewards read these, never the text encoded
    # again, which drops the end token and need not give the same ids.
    ids: list[int] = field(repr=False)
    thinking_tokens: int | None = None  # tokens spent before the answer phase (budgeted generation)
    budget_hit: bool = False  # the stop-thinking string was inserted

    @property
    def tokens(self) -> int:
        return len(self.ids)


# A token-level sampler: for each sequence of token ids (prompt and any prefix), the ids it generates,
# each row cut after the token that ended it (kept: an end-of-turn, or the `</think>` a budget's first
# phase stops at) and without padding. Arguments: sequences, max new tokens, stop at `</think>`, spec
# (temperature, top_p). Rows are sampled independently; `n` copies of a prompt are `n` rows.
TokenSampler = Callable[[list[list[int]], int, bool, SamplingSpec], list[list[int]]]
# Budgeted generation in one pass, for a sampler that controls each step (ORT's carries one as its
# `budgeted` attribute): per sequence, the (thinking, inserted stop-thinking, answer) ids the two
# phases below would give, without feeding each unfinished row through the model a second time.
# Arguments: sequences, spec (with its budget and answer limit), the stop-thinking string's ids.
BudgetedSampler = Callable[[list[list[int]], SamplingSpec, list[int]], list[tuple[list[int], list[int], list[int]]]]


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


def think_end_ids(tokenizer) -> list[int]:
    """`</think>`'s token ids: one on Qwen3, several where the tokenizer splits it (SmolLM2)."""
    return tokenizer(THINK_END, add_special_tokens=False)["input_ids"]


def think_end_id(tokenizer) -> int | None:
    """`</think>` as one token id, or None where the tokenizer splits it (SmolLM2)."""
    ids = think_end_ids(tokenizer)
    return ids[0] if len(ids) == 1 else None


def cut_at_stop(tokenizer, row: list[int], stops: set[int], stop_string: bool) -> list[int]:
    """A generated row cut after its first stop: a stop token, or (`stop_string`) the token that
    completes a multi-token `</think>`. Where the pad token is the end token (SmolLM2: both are 2), a
    row that stopped at `</think>` while others went on is padded with end tokens; those are padding,
    not an end of turn, or the row would never get its answer."""
    for i, token in enumerate(row):
        if token in stops:
            return row[:i + 1]
        if stop_string and ">" in tokenizer.decode([token]) and tokenizer.decode(row[:i + 1]).rstrip().endswith(THINK_END):
            return row[:i + 1]
    return row


def _clean(text: str, tokenizer) -> str:
    for tok in {tokenizer.eos_token, tokenizer.pad_token, "<|im_end|>", "<|endoftext|>"} - {None}:
        text = text.split(tok)[0] if tok == tokenizer.eos_token else text.replace(tok, "")
    return text.strip()


def complete(sample: TokenSampler, tokenizer, prompts: list[list[dict] | str], spec: SamplingSpec,
             progress: bool | str = False) -> list[list[Completion]]:
    """`spec.n` Completions per prompt, with a thinking budget when the spec sets one. Chat prompts
    (lists of messages) go through the chat template; plain strings (toolkit.core.templates) are used
    as they are. `progress`: a bar per batch, labelled with the string when it is one."""
    from tqdm import tqdm

    spec = spec.effective()
    texts = [render(tokenizer, p, spec.enable_thinking) for p in prompts]
    out: list[list[Completion]] = []
    label = progress if isinstance(progress, str) else "generate"
    one_pass: BudgetedSampler | None = getattr(sample, "budgeted", None) if spec.budgeted else None
    for start in tqdm(range(0, len(texts), spec.batch_size), desc=label, disable=not progress):
        encoded = tokenizer(texts[start:start + spec.batch_size], add_special_tokens=False)["input_ids"]
        prompt_ids = [ids for ids in encoded for _ in range(spec.n)]
        if one_pass is not None:
            done = [_thought(tokenizer, *parts) for parts in one_pass(prompt_ids, spec, stop_thinking_ids(tokenizer, spec))]
        elif spec.budgeted:
            done = _finish_thinking(sample, tokenizer, prompt_ids, sample(prompt_ids, spec.thinking_budget, True, spec), spec)
        else:
            done = [_completion(tokenizer, ids, []) for ids in sample(prompt_ids, spec.max_new_tokens, False, spec)]
        out += [done[i:i + spec.n] for i in range(0, len(done), spec.n)]
    return out


def _completion(tokenizer, ids: list[int], answer_ids: list[int], inserted: list[int] | None = None,
                closing_tokens: int | None = None) -> Completion:
    """`closing_tokens`: budgeted generation only, how many of `ids` are the model's own `</think>`."""
    inserted = inserted or []
    full = ids + inserted + answer_ids
    text = _clean(tokenizer.decode(full, skip_special_tokens=False), tokenizer)
    finished = bool(full) and full[-1] == tokenizer.eos_token_id
    thinking = None if closing_tokens is None else len(ids) - closing_tokens
    return Completion(text=text, finished=finished, ids=full, thinking_tokens=thinking, budget_hit=bool(inserted))


def stop_thinking_ids(tokenizer, spec: SamplingSpec) -> list[int]:
    return tokenizer(spec.stop_thinking, add_special_tokens=False)["input_ids"]


def _thought(tokenizer, thinking: list[int], inserted: list[int], answer: list[int]) -> Completion:
    """A budgeted completion from its parts; its thinking tokens exclude the model's own `</think>`."""
    closed = THINK_END in tokenizer.decode(thinking)
    closing = len(think_end_ids(tokenizer)) if closed else 0
    return _completion(tokenizer, thinking, answer, inserted, closing)


def _finish_thinking(sample: TokenSampler, tokenizer, prompt_ids: list[list[int]], first: list[list[int]],
                     spec: SamplingSpec) -> list[Completion]:
    """Phase two of budgeted generation: insert the stop-thinking string where the budget ran out,
    then continue every unfinished sequence from its own tokens to its answer."""
    stop_ids = stop_thinking_ids(tokenizer, spec)
    eos = tokenizer.eos_token_id
    closed = [THINK_END in tokenizer.decode(ids) for ids in first]
    ended = [bool(ids) and ids[-1] == eos for ids in first]
    inserted = [[] if end or close else stop_ids for end, close in zip(ended, closed)]
    todo = [i for i, end in enumerate(ended) if not end]
    answers: dict[int, list[int]] = {}
    answer_spec = replace(spec, n=1)
    for start in range(0, len(todo), spec.batch_size):
        chunk = todo[start:start + spec.batch_size]
        seqs = [prompt_ids[i] + first[i] + inserted[i] for i in chunk]
        answers.update(zip(chunk, sample(seqs, spec.answer_max_new_tokens or spec.max_new_tokens, False, answer_spec)))
    return [_thought(tokenizer, ids, inserted[i], answers.get(i, [])) for i, ids in enumerate(first)]


def derivable(spec: SamplingSpec) -> bool:
    """Whether budgeted completions for `spec` can come from the same prompts' unlimited ones
    (budgeted_from_unlimited): greedy, one per prompt, a budget above 0."""
    spec = spec.effective()
    return spec.temperature == 0 and spec.n == 1 and spec.budgeted


def budgeted_from_unlimited(sample: TokenSampler, tokenizer, prompts: list[list[dict] | str],
                            unlimited: list[Completion], spec: SamplingSpec,
                            progress: bool | str = False) -> list[Completion]:
    """Greedy budgeted completions of `prompts` derived from `unlimited`, their greedy completions
    without a budget, instead of generated anew: greedy decoding is a function of the prefix, so
    phase one is the unlimited completion's first B tokens cut at their first stop, and a thought
    that closed within the budget goes on as the unlimited one did, up to the answer limit. Only
    rows whose budget ran out (the stop-thinking string makes a new prefix), and rows whose
    unlimited completion stopped at its token limit too soon to say, are generated, as phase two
    always is (from prompt + thinking + stop string). Exact up to floating-point differences
    between batch shapes, as the two-phase and one-pass paths are to each other."""
    from tqdm import tqdm

    if not derivable(spec):
        raise ValueError("budgeted completions derive only from greedy token ids, one per prompt, with a budget above 0")
    spec = spec.effective()
    think_end, eos, stop_ids = think_end_id(tokenizer), tokenizer.eos_token_id, stop_thinking_ids(tokenizer, spec)
    stops, budget = {eos} | ({think_end} if think_end is not None else set()), spec.thinking_budget
    answer_limit = spec.answer_max_new_tokens or spec.max_new_tokens
    out: dict[int, Completion] = {}
    todo: list[tuple[int, list[int], list[int]]] = []  # row, its thinking, the inserted string
    for i, ids in enumerate(c.ids for c in unlimited):
        head = cut_at_stop(tokenizer, ids[:budget], stops, think_end is None)
        if head and head[-1] == eos:
            out[i] = _thought(tokenizer, head, [], [])
        elif THINK_END in tokenizer.decode(head):
            answer = ids[len(head):len(head) + answer_limit]
            if len(answer) == answer_limit or ids[-1] == eos:
                out[i] = _thought(tokenizer, head, [], answer)
            else:  # the unlimited completion hit its own token limit before the answer's
                todo.append((i, head, []))
        elif len(head) == budget:
            todo.append((i, head, stop_ids))
    continued = {i for i, _, _ in todo}
    if rest := [i for i in range(len(prompts)) if i not in out and i not in continued]:
        # the unlimited completion stopped short of the budget without closing: phase one is longer
        out.update(zip(rest, (c[0] for c in complete(sample, tokenizer, [prompts[i] for i in rest], spec))))
    label = progress if isinstance(progress, str) else "continue"
    for start in tqdm(range(0, len(todo), spec.batch_size), desc=label, disable=not progress):
        chunk = todo[start:start + spec.batch_size]
        texts = [render(tokenizer, prompts[i], spec.enable_thinking) for i, _, _ in chunk]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        seqs = [p + head + inserted for p, (_, head, inserted) in zip(encoded, chunk)]
        for (i, head, inserted), answer in zip(chunk, sample(seqs, answer_limit, False, spec)):
            out[i] = _thought(tokenizer, head, inserted, answer)
    return [out[i] for i in range(len(prompts))]
