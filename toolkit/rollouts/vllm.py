"""vLLM's offline engine, when the [vllm] extra is installed and a GPU is present; recipes that ask
for it are refused at validation otherwise. It samples from text, not from a token sampler, so the
budget's two phases are written here in its own terms."""

from __future__ import annotations

from toolkit.rollouts.sampling import THINK_END, Completion, SamplingSpec, render, stop_thinking_ids, think_end_ids


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


def load_vllm(model_dir: str, trust_remote_code: bool = False, precision: str = "bfloat16"):
    """vLLM's offline engine over `model_dir`, loaded once per Engine: its start (weights,
    compilation, CUDA graphs, the KV cache) costs more than most sampling calls, so an evaluation's
    modes and budgets share one. The engine seed is fixed; each call's `spec.seed` seeds its
    requests (vLLM gives a request's n samples seed, seed+1, ...)."""
    import os

    from vllm import LLM

    # vLLM forks its engine process unless it sees CUDA initialised here, but torch.cuda.is_available()
    # (engine_problems calls it) already makes a forked child fail "Cannot re-initialize CUDA in forked
    # subprocess": seen on an H200 (benchmarks/RESULTS.md, vLLM against HF generate). Spawn always works.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    return LLM(model=model_dir, trust_remote_code=trust_remote_code, seed=0, enable_prefix_caching=True,
               dtype=precision)


def generate_vllm(llm, prompts: list[list[dict] | str], spec: SamplingSpec) -> list[list[Completion]]:
    """The same contract on vLLM's offline engine; the budget's second phase resubmits each
    sequence's text, which vLLM's prefix cache serves without recomputing it.
    Its bookkeeping is tested on CPU against a scripted stand-in for `LLM.generate` (test_engines);
    the real engine runs it in benchmarks/gpu_generation.py on a GPU."""
    from vllm import SamplingParams

    spec = spec.effective()
    tokenizer = llm.get_tokenizer()
    texts = [render(tokenizer, p, spec.enable_thinking) for p in prompts]
    base = dict(temperature=spec.temperature, top_p=spec.top_p, seed=spec.seed)

    def done(out, text: str, thinking: int | None = None, hit: bool = False, before: list[int] | None = None) -> Completion:
        # vLLM keeps every generated id, the end token and the tokens of a matched stop string included
        return Completion(text=text, finished=out.finish_reason == "stop" and out.stop_reason is None,
                          ids=(before or []) + list(out.token_ids), thinking_tokens=thinking, budget_hit=hit)

    if not spec.budgeted:
        params = SamplingParams(n=spec.n, max_tokens=spec.max_new_tokens, **base)
        return [[done(o, o.text) for o in r.outputs] for r in llm.generate(texts, params)]
    first = llm.generate(texts, SamplingParams(n=spec.n, max_tokens=spec.thinking_budget, stop=[THINK_END],
                                               include_stop_str_in_output=True, **base))
    pending = []  # (prompt index, sample index, text so far, ids so far, thinking tokens, budget hit)
    results: list[list[Completion | None]] = [[None] * spec.n for _ in texts]
    closing_tokens = len(think_end_ids(tokenizer))
    stop_ids = stop_thinking_ids(tokenizer, spec)
    for i, r in enumerate(first):
        for j, o in enumerate(r.outputs):
            if o.finish_reason == "stop" and o.stop_reason is None:  # end of turn inside the thinking
                results[i][j] = done(o, o.text, len(o.token_ids))
                continue
            hit = o.stop_reason != THINK_END
            # as the token-level engines count: the model's own </think> is not thinking; the
            # inserted stop-thinking string is neither thinking nor the model's, but is a token spent
            thinking = len(o.token_ids) - (0 if hit else closing_tokens)
            pending.append((i, j, o.text + (spec.stop_thinking if hit else ""),
                            list(o.token_ids) + (stop_ids if hit else []), thinking, hit))
    answer = SamplingParams(n=1, max_tokens=spec.answer_max_new_tokens or spec.max_new_tokens, **base)
    answers = llm.generate([texts[i] + so_far for i, _, so_far, *_ in pending], answer)
    for (i, j, so_far, ids, thinking, hit), r in zip(pending, answers):
        results[i][j] = done(r.outputs[0], so_far + r.outputs[0].text, thinking, hit, before=ids)
    return results
