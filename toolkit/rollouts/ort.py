"""ONNX Runtime GenAI as a token sampler: Microsoft's generation loop over ONNX Runtime, with a
model builder that turns an HF Llama/Qwen/Phi checkpoint into an ONNX graph of fused operators
(GroupQueryAttention, SkipSimplifiedLayerNormalization, MatMulNBits for int4 weights).

A model is converted once per precision (float32, or int4 weights with int8 activations:
`int4_accuracy_level=4`) into a cache keyed by its weights' checksum, the package's version and
the precision (`keep_conversions_in`; the worker points it at `$POSTTRAIN_HOME/cache/ort`). In
float32, a model whose architecture was converted before is made from that checked conversion with
its own weights written in, not by the builder (toolkit.rollouts.ort_layout, `from_template`).

Two things this engine does differently from HF, both measured (benchmarks/RESULTS.md):
- Padding goes on the RIGHT. ORT GenAI's attention reads each row's length from its padding, and
  left-padded rows decode differently from the same row alone (4/4 prompts differed); right-padded
  rows match HF's greedy output token for token.
- The padding id is one no sequence can hold: ORT GenAI masks every position holding the pad id,
  and SmolLM2 pads with its end-of-turn token, which every chat prompt contains (and any real id
  can turn up in a budget's second phase, which feeds generated tokens back). So the pad id is -1,
  set at load: never a token, and a valid index for the embedding's Gather where it is masked.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from toolkit.core.files import process_temp_dir, publish_kept, weights_fingerprint
from toolkit.rollouts.ort_layout import from_template, record_template
from toolkit.rollouts.sampling import THINK_END, SamplingSpec, TokenSampler, cut_at_stop, think_end_id

BUILDER_PRECISIONS = {"float32": ["-p", "fp32"], "int4": ["-p", "int4", "--extra_options", "int4_accuracy_level=4"]}
KEPT_CONVERSIONS = 4
PAD_ID = -1
MAX_ROWS = 32  # the generator refuses larger batches ("batch_size (64) must be in [1, 32]")
# A sampled generator runs until its longest row ends, every finished row still computed. Once the
# unfinished rows are at most 1/TAIL_SHARE of its rows with at least TAIL_MIN_STEPS tokens still
# allowed, they go on in a generator of their own, prompt and tokens so far run through the model
# once more (measured here on SmolLM2: a decode step of 16 rows 47 ms, of 4 rows 28 ms; a prefill
# costs about 1 ms per row and token, so 4 rows of 100 tokens pay for themselves in about 21 steps).
TAIL_SHARE = 4
TAIL_MIN_STEPS = 32
_CACHE: list[Path] = []
_FAILED: dict[str, str] = {}  # conversion key -> why the builder failed, in this process


def keep_conversions_in(directory: Path | None) -> None:
    """Where converted models are kept across processes; unset, each process converts into a temp
    dir of its own, removed at exit."""
    _CACHE[:] = [Path(directory)] if directory else []


def ort_unavailable() -> str | None:
    import importlib.util

    if importlib.util.find_spec("onnxruntime_genai") is None:
        return "engine ort needs the onnxruntime-genai package (a dependency: run `make setup`)"
    return None


def converted(model_dir: str, precision: str) -> Path:
    """The model's ONNX conversion at `precision`, made once by the package's model builder (in a
    child process, which loads the HF model whole) and published with publish_kept. A model it cannot
    convert fails once per process: `auto` then falls back to HF without paying for the try again."""
    import onnxruntime_genai as og

    root = _CACHE[0] if _CACHE else process_temp_dir("posttrain-ort-")
    key = hashlib.sha256(f"{weights_fingerprint(Path(model_dir))}|{og.__version__}|{precision}".encode()).hexdigest()[:20]
    if key in _FAILED:  # the builder does not know this model: say so again without a second try
        raise ValueError(_FAILED[key])
    built_here = []

    def build(out: Path) -> None:
        if precision == "float32" and from_template(model_dir, out, root):
            return
        built_here.append(out)
        done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", model_dir, "-o", str(out),
                               "-e", "cpu", "-c", str(out.parent / "cache"), *BUILDER_PRECISIONS[precision]],
                              capture_output=True, text=True)
        if done.returncode or not (out / "genai_config.json").exists():
            _FAILED[key] = (f"the ONNX Runtime GenAI builder could not convert {model_dir}: "
                            f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
            raise ValueError(_FAILED[key])

    final = publish_kept(root / key, "genai_config.json", build, KEPT_CONVERSIONS)
    if built_here and precision == "float32":  # the builder's own output: a template for models like this one
        record_template(model_dir, final)
    return final


def open_model(conversion: Path, threads: int):
    """The converted model with this process's thread budget, padding with PAD_ID."""
    import onnxruntime_genai as og

    config = og.Config(str(conversion))
    config.overlay(json.dumps({"model": {"pad_token_id": PAD_ID, "decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    return og.Model(config)


def forced_draw(logits, temperature: float, generator):
    """`logits` (ORT's, one row per sequence) turned into scores whose argmax is a token drawn from
    softmax(logits / temperature): the drawn token keeps 0, every other token the lowest float, so
    the generator's greedy search appends the draw. Drawn by the inverse of the cumulative
    distribution (float64 sums, so no tail is lost to rounding); `torch.multinomial` draws the same
    law, but took 22 ms for 16 rows here against 0.5 ms."""
    import torch

    scores = torch.from_numpy(logits).reshape(-1, logits.shape[-1])
    cdf = torch.softmax(scores / temperature, dim=-1).cumsum(-1, dtype=torch.float64)
    u = torch.rand((len(cdf), 1), dtype=torch.float64, generator=generator) * cdf[:, -1:]
    drawn = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.size(1) - 1)
    forced = torch.full_like(scores, torch.finfo(scores.dtype).min).scatter_(1, drawn, 0.0)
    return forced.reshape(logits.shape).numpy()


def ort_sampler(model, tokenizer) -> TokenSampler:
    """Rows are sampled independently (`n` copies of a prompt are `n` rows), at most MAX_ROWS to a
    generator; a new sampler per `complete` call makes its draws reproducible. ORT GenAI stops a row
    at the end token itself; a `</think>` stop (one token or split, as in SmolLM2) is watched for
    after every step, and the batch ends when every row has stopped.

    Sampling the whole distribution (top_p 1) is drawn here, from the logits ORT computes, and handed
    back through `set_logits` to its greedy search (`forced_draw`): a step takes 1.2x a greedy one,
    where ORT GenAI's own sampler with top_k 0 and top_p 1 took 2.5x at 16 rows and 4x at 32
    (benchmarks/bench_ort_sampling.py). With top_p < 1 ORT's own top-p sampler runs. Drawn here, the
    rows still going once most have ended continue in a generator of their own (`TAIL_SHARE`), so the
    batch's finished rows stop costing a decode step each.

    The sampler also runs budgeted generation in one pass (`sample.budgeted`, see sampling.py): the
    stop-thinking string is forced into a row's own generation where its budget runs out, and the row
    goes on to its answer in the same generator, where the two-phase path would feed every unfinished
    row's prompt and thinking through the model again (a prefill of 32 rows of 124 tokens costs as
    much as 84 decode steps here)."""
    import numpy as np
    import onnxruntime_genai as og
    import torch

    generators_made = [0]  # each generator gets its own seed: spec.seed, then the next ones
    eos = tokenizer.eos_token_id
    think_end = think_end_id(tokenizer)

    def generator_for(seqs: list[list[int]], max_new_tokens: int, **search):
        width = max(len(s) for s in seqs)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=width + max_new_tokens, batch_size=len(seqs), **search)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([s + [PAD_ID] * (width - len(s)) for s in seqs], dtype=np.int32))
        return generator

    def start(seqs: list[list[int]], max_new_tokens: int, spec: SamplingSpec):
        seed = spec.seed + generators_made[0]
        generators_made[0] += 1
        draw_here = spec.temperature > 0 and spec.top_p >= 1.0
        search = dict(do_sample=spec.temperature > 0 and not draw_here)
        if search["do_sample"]:
            # top_k 0: the whole distribution, not the builder's genai_config default of the 50 likeliest
            search.update(temperature=spec.temperature, top_p=spec.top_p, top_k=0, random_seed=seed)
        return generator_for(seqs, max_new_tokens, **search), torch.Generator().manual_seed(seed) if draw_here else None

    def step(generator, draws, spec: SamplingSpec, forced: dict[int, int] | None = None) -> list[int]:
        """One token per row; `forced`: rows whose next token is given (row -> token id)."""
        if draws is not None or forced:
            logits = np.asarray(generator.get_logits())
            if draws is not None:
                logits = forced_draw(logits, spec.temperature, draws)
            for row, token in (forced or {}).items():
                logits[row] = np.finfo(logits.dtype).min
                logits[row, ..., token] = 0.0
            generator.set_logits(logits)
        generator.generate_next_token()
        return generator.get_next_tokens().tolist()

    def closes_thinking(row: list[int], token: int) -> bool:
        if think_end is not None:
            return token == think_end
        return ">" in tokenizer.decode([token]) and tokenizer.decode(row[-8:]).rstrip().endswith(THINK_END)

    def sample(seqs: list[list[int]], max_new_tokens: int, stop_at_think_end: bool,
               spec: SamplingSpec) -> list[list[int]]:
        return [row for first in range(0, len(seqs), MAX_ROWS)
                for row in sample_rows(seqs[first:first + MAX_ROWS], max_new_tokens, stop_at_think_end, spec)]

    def sample_rows(seqs: list[list[int]], max_new_tokens: int, stop_at_think_end: bool,
                    spec: SamplingSpec) -> list[list[int]]:
        generator, draws = start(seqs, max_new_tokens, spec)
        stops = {eos} | ({think_end} if stop_at_think_end and think_end is not None else set())
        stop_string = stop_at_think_end and think_end is None
        rows: list[list[int]] = [[] for _ in seqs]
        stopped = [False] * len(seqs)
        live = list(range(len(seqs)))  # the generator's rows, as indices into seqs
        steps = 0
        while not generator.is_done() and not all(stopped):
            for i, token in zip(live, step(generator, draws, spec)):
                if stopped[i]:
                    continue
                rows[i].append(token)
                stopped[i] = token in stops or (stop_string and closes_thinking(rows[i], token))
            steps += 1
            left = [i for i in live if not stopped[i]]
            # drawn here, the tail's tokens follow the same law from the rows' own logits; ORT's own
            # sampler (top_p < 1) and greedy search keep one generator, so their streams stay as they were
            if draws is not None and left and len(left) * TAIL_SHARE <= len(live) and max_new_tokens - steps >= TAIL_MIN_STEPS:
                del generator  # its KV cache, before the tail's is made
                generator = generator_for([seqs[i] + rows[i] for i in left], max_new_tokens - steps, do_sample=False)
                live = left
        return [cut_at_stop(tokenizer, row, stops, stop_string) for row in rows]

    def budgeted(seqs: list[list[int]], spec: SamplingSpec, stop_ids: list[int]) -> list[tuple[list[int], ...]]:
        return [row for first in range(0, len(seqs), MAX_ROWS)
                for row in budgeted_rows(seqs[first:first + MAX_ROWS], spec, stop_ids)]

    def budgeted_rows(seqs: list[list[int]], spec: SamplingSpec, stop_ids: list[int]) -> list[tuple[list[int], ...]]:
        """Per row (thinking, inserted, answer): thinking up to the budget, ended early by `</think>`
        or the end token; where the budget ran out unclosed, `stop_ids` forced one a step; then the
        answer, up to its own limit or the end token."""
        budget, answer_limit = spec.thinking_budget, spec.answer_max_new_tokens or spec.max_new_tokens
        generator, draws = start(seqs, budget + len(stop_ids) + answer_limit, spec)
        thinking, inserted, answer = ([[] for _ in seqs] for _ in range(3))
        to_force: dict[int, list[int]] = {}  # rows forcing the stop-thinking string -> its ids still to come
        phase = ["think"] * len(seqs)  # think -> (force ->) answer -> done
        while not generator.is_done() and not all(p == "done" for p in phase):
            for i, token in enumerate(step(generator, draws, spec, {i: ids[0] for i, ids in to_force.items()})):
                if phase[i] == "think":
                    thinking[i].append(token)
                    if token == eos:
                        phase[i] = "done"
                    elif closes_thinking(thinking[i], token):
                        phase[i] = "answer"
                    elif len(thinking[i]) == budget:
                        phase[i], to_force[i] = "force", list(stop_ids)
                elif phase[i] == "force":
                    if token != to_force[i][0]:
                        raise RuntimeError(f"ORT GenAI did not take the forced token {to_force[i][0]} (it gave {token})")
                    inserted[i].append(to_force[i].pop(0))
                    if not to_force[i]:
                        del to_force[i]
                        phase[i] = "answer"
                elif phase[i] == "answer":
                    answer[i].append(token)
                    if token == eos or len(answer[i]) == answer_limit:
                        phase[i] = "done"
        return list(zip(thinking, inserted, answer))

    sample.budgeted = budgeted
    return sample
