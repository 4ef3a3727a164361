"""Which engine generates: `hf` (HF generate), `ct2` (CTranslate2, CPU), `ort` (ONNX Runtime GenAI,
CPU), `ov` (OpenVINO GenAI's continuous batching, CPU), `vllm` (GPU), or `auto`, the fastest one
available for the precision asked: on a GPU, vLLM with the [vllm] extra, else HF; on CPU, OpenVINO
GenAI for float32 and bfloat16 (else ONNX Runtime GenAI for float32 and HF for bfloat16; a
test-sized model stays HF: see resolve_engine), CTranslate2 for int8, ONNX Runtime GenAI for int4.

Precision is a generation setting of its own, never silently changed: float32 (every engine on
CPU), bfloat16 (HF or OpenVINO on AMX, or a GPU; vLLM), int8 (CTranslate2, weights in int8, activations in
float32) or int4 (ONNX Runtime GenAI, int4 weights, int8 activations). Lower precision changes
outputs (bf16, int8 and int4 greedy completions differ from float32's on most prompts; on a trained
SmolLM2, int8 cost 9 points of held-out accuracy and int4 19.5), so a stage uses it only where a
benchmark shows its held-out accuracy and rewards stay within float32's interval
(benchmarks/bench_generation.py), and the stage's run records it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolkit.rollouts.sampling import (
    Completion,
    SamplingSpec,
    TokenSampler,
    budgeted_from_unlimited,
    complete,
    derivable,
)

ENGINES = ("auto", "hf", "ct2", "ort", "ov", "vllm")
PRECISIONS = ("float32", "bfloat16", "int8", "int4")
AUTO_ORT_MIN_BYTES = 100 * 2**20  # SmolLM2-135M in float32: 540 MB; the suite's tiny models: a few MB
SUPPORTED = {"hf": {"float32", "bfloat16"}, "ct2": {"float32", "int8"}, "ort": {"float32", "int4"},
             "ov": {"float32", "bfloat16"}, "vllm": {"float32", "bfloat16"}}
log = logging.getLogger(__name__)
_OPENED: list[str] = []  # every engine this process loaded, for the stage's record


@dataclass
class Engine:
    """A loaded model that samples completions; `name` and `precision` say what actually runs."""
    name: str
    precision: str
    threads: int
    tokenizer: object
    _complete: Callable[[list, SamplingSpec, bool | str], list[list[Completion]]]
    _greedy_sampler: Callable[[], TokenSampler] | None = None  # None: the engine samples from text (vLLM)

    def complete(self, prompts: list[list[dict] | str], spec: SamplingSpec,
                 progress: bool | str = False) -> list[list[Completion]]:
        """`spec.n` Completions per prompt (see toolkit.rollouts.sampling for budgets and modes)."""
        return self._complete(prompts, spec, progress)

    def complete_budgeted(self, prompts: list[list[dict] | str], spec: SamplingSpec, unlimited: list[Completion],
                          progress: bool | str = False) -> list[list[Completion]]:
        """Greedy completions with `spec`'s thinking budget, given `unlimited`: the same prompts'
        greedy completions without one. Derived from them where greedy decoding allows
        (sampling.budgeted_from_unlimited), so only rows whose budget ran out are generated; on an
        engine without a token-level sampler (vLLM), or a spec that samples, generated as `complete` would."""
        if self._greedy_sampler is None or not derivable(spec):
            return self.complete(prompts, spec, progress)
        done = budgeted_from_unlimited(self._greedy_sampler(), self.tokenizer, prompts, unlimited, spec, progress)
        return [[c] for c in done]

    def texts(self, prompts: list[list[dict] | str], spec: SamplingSpec, progress: bool | str = False) -> list[list[str]]:
        return [[c.text for c in cs] for cs in self.complete(prompts, spec, progress)]

    def describe(self) -> str:
        return f"{self.name} {self.precision}, {self.threads} thread(s)"


def drain_opened() -> list[str]:
    """The engines this process loaded since the last call, as a stage records them (engine,
    precision, threads); one worker process may run several stages (launcher mode `inprocess`)."""
    found = sorted(set(_OPENED))
    _OPENED.clear()
    return found


def engine_problems(engine: str, precision: str) -> list[str]:
    """Why `engine` at `precision` cannot run here (empty when it can), for validation before any
    compute: `auto` always runs, at float32 at least."""
    from toolkit.rollouts.ct2 import ct2_unavailable
    from toolkit.rollouts.ort import ort_unavailable
    from toolkit.rollouts.ov import ov_precision_problem, ov_unavailable
    from toolkit.rollouts.vllm import vllm_unavailable

    if engine == "auto":
        return {"int8": [m for m in [ct2_unavailable()] if m], "int4": [m for m in [ort_unavailable()] if m]}.get(precision, [])
    problems = [] if precision in SUPPORTED[engine] else [
        f"engine {engine} does not run {precision} (it runs {', '.join(sorted(SUPPORTED[engine]))})"]
    if engine == "ct2":
        problems += [m for m in [ct2_unavailable()] if m]
    if engine == "ort":
        problems += [m for m in [ort_unavailable()] if m]
    if engine == "ov":
        problems += [m for m in [ov_unavailable(), ov_precision_problem(precision)] if m]
    if engine == "vllm":
        problems += vllm_unavailable()
    return problems


def resolve_engine(engine: str, precision: str, model_dir: str | None = None) -> str:
    """The engine `auto` stands for, at this precision, on this machine, for this model."""
    import torch

    if engine != "auto":
        return engine
    if torch.cuda.is_available():  # vLLM with the [vllm] extra, else HF on the GPU
        return next((c for c in ("vllm", "hf") if precision in SUPPORTED[c] and not engine_problems(c, precision)), "hf")
    # Measured on the 2-core machines (benchmarks/RESULTS.md, fast generation): OpenVINO GenAI and
    # ONNX Runtime GenAI float32 give HF float32's greedy outputs (63-64 of 64 prompts), OpenVINO the
    # faster at every batch (2.0-2.7x HF against ORT's 1.1-2.4x on the Intel machine), and bfloat16
    # on AMX only through OpenVINO runs well above HF's. A conversion costs seconds (OpenVINO's
    # export about 13 s), which pays only for a model that generates for long: so a real model
    # (weights of AUTO_ORT_MIN_BYTES or more) goes to ov, else ort, and a test-sized one stays HF.
    # int8 is CTranslate2's, int4 ONNX Runtime GenAI's.
    if weight_bytes(model_dir) >= AUTO_ORT_MIN_BYTES:
        if precision in ("float32", "bfloat16") and not engine_problems("ov", precision):
            return "ov"
        if precision == "float32" and not engine_problems("ort", precision):
            return "ort"
    for candidate in ("hf", "ct2", "ort"):
        if precision in SUPPORTED[candidate] and not engine_problems(candidate, precision):
            return candidate
    return "hf"


def weight_bytes(model_dir: str | None) -> int:
    """The size of a model's weight files (0 when there is no model directory to look at)."""
    if not model_dir or not Path(model_dir).is_dir():
        return 0
    return sum(f.stat().st_size for f in Path(model_dir).iterdir() if f.suffix in (".safetensors", ".bin"))


def keep_conversions_in(cache_root: Path | None) -> None:
    """Where each converting engine keeps its conversions (`cache_root`/ct2, /ort, /ov), shared
    by every process of a home; None: each process converts into a temp dir."""
    from toolkit.rollouts import ct2, ort, ov

    for module in (ct2, ort, ov):
        module.keep_conversions_in(cache_root / module.__name__.rsplit(".", 1)[1] if cache_root else None)


def thread_budget() -> int:
    """The threads this process may use: torch's setting, which the launcher sets from
    OMP_NUM_THREADS (the cores shared among the ranks on a node)."""
    import torch

    return torch.get_num_threads()


def open_engine(model_dir: str, engine: str = "auto", precision: str = "float32", trust_remote_code: bool = False) -> Engine:
    """Load the model in `model_dir` into the engine; `auto` falls back to HF, with a warning, when
    CTranslate2 cannot convert the model's architecture."""
    loaded = _load(model_dir, engine, precision, trust_remote_code)
    _OPENED.append(loaded.describe())
    return loaded


def _load(model_dir: str, engine: str, precision: str, trust_remote_code: bool) -> Engine:
    import torch

    if problems := engine_problems(engine, precision):
        raise ValueError(f"generation engine {engine!r} at {precision}: " + "; ".join(problems))
    chosen, threads = resolve_engine(engine, precision, model_dir), thread_budget()
    if chosen == "vllm":
        from toolkit.rollouts.hf import load_tokenizer
        from toolkit.rollouts.vllm import generate_vllm, load_vllm

        llm = load_vllm(model_dir, trust_remote_code, precision)

        def run(prompts, spec, progress):
            return generate_vllm(llm, prompts, spec)
        return Engine("vllm", precision, threads, load_tokenizer(model_dir, trust_remote_code), run)
    if chosen == "ct2":
        from toolkit.rollouts.ct2 import converted, ct2_sampler, open_generator
        from toolkit.rollouts.hf import load_tokenizer

        try:
            conversion = converted(model_dir, trust_remote_code)  # hashed and converted once per engine
            generator = open_generator(conversion, precision, threads)
        except (ValueError, NotImplementedError) as e:  # an architecture its converter does not know
            if engine != "auto":
                raise ValueError(f"engine ct2 cannot load {model_dir}: {e}") from e
            log.warning("generation: CTranslate2 cannot convert %s (%s); using HF generate", model_dir, e)
            return _load(model_dir, "hf", "float32" if precision == "int8" else precision, trust_remote_code)
        import ctranslate2

        tokenizer = load_tokenizer(model_dir, trust_remote_code)

        def run(prompts, spec, progress):
            sampler = generator
            if spec.temperature > 0:
                # CTranslate2 seeds each worker thread's generator once, on its first draw: a
                # fresh generator (about a second) is the only way to make `seed` reproducible
                ctranslate2.set_random_seed(spec.seed)
                sampler = open_generator(conversion, precision, threads)
            return complete(ct2_sampler(sampler, tokenizer), tokenizer, prompts, spec, progress)
        return Engine("ct2", precision, threads, tokenizer, run, lambda: ct2_sampler(generator, tokenizer))
    if chosen == "ort":
        return _load_ort(model_dir, engine, precision, threads, trust_remote_code)
    if chosen == "ov":
        return _load_ov(model_dir, engine, precision, threads, trust_remote_code)
    from toolkit.rollouts.hf import hf_sampler, load_for_generation

    model, tokenizer = load_for_generation(model_dir, trust_remote_code, precision)
    sample = hf_sampler(model, tokenizer)

    def run(prompts, spec, progress):
        torch.manual_seed(spec.seed)
        return complete(sample, tokenizer, prompts, spec, progress)
    return Engine("hf", precision, threads, tokenizer, run, lambda: sample)


def _load_ort(model_dir: str, engine: str, precision: str, threads: int, trust_remote_code: bool) -> Engine:
    from toolkit.rollouts.hf import load_tokenizer
    from toolkit.rollouts.ort import converted, open_model, ort_sampler

    try:
        model = open_model(converted(model_dir, precision), threads)  # converted once per model and precision
    except ValueError as e:  # an architecture its builder does not know
        if engine != "auto":
            raise ValueError(f"engine ort cannot load {model_dir}: {e}") from e
        log.warning("generation: ONNX Runtime GenAI cannot convert %s (%s); using HF generate", model_dir, e)
        return _load(model_dir, "hf", "float32", trust_remote_code)
    tokenizer = load_tokenizer(model_dir, trust_remote_code)
    return Engine("ort", precision, threads, tokenizer, lambda prompts, spec, progress: complete(
        ort_sampler(model, tokenizer), tokenizer, prompts, spec, progress),  # a fresh sampler: seeds from spec.seed
        lambda: ort_sampler(model, tokenizer))


def _load_ov(model_dir: str, engine: str, precision: str, threads: int, trust_remote_code: bool) -> Engine:
    from toolkit.rollouts.hf import load_tokenizer
    from toolkit.rollouts.ov import converted, open_pipeline, ov_sampler

    try:
        pipeline = open_pipeline(converted(model_dir), precision, threads)  # exported once per model
    except ValueError as e:  # an architecture the exporter does not know
        if engine != "auto":
            raise ValueError(f"engine ov cannot load {model_dir}: {e}") from e
        log.warning("generation: OpenVINO cannot convert %s (%s); using HF generate", model_dir, e)
        return _load(model_dir, "hf", precision, trust_remote_code)
    tokenizer = load_tokenizer(model_dir, trust_remote_code)
    return Engine("ov", precision, threads, tokenizer, lambda prompts, spec, progress: complete(
        ov_sampler(pipeline, tokenizer), tokenizer, prompts, spec, progress),  # a fresh sampler: seeds from spec.seed
        lambda: ov_sampler(pipeline, tokenizer))


def rollout_completions(model_dir: str, prompts: list[list[dict] | str], spec: SamplingSpec, engine: str = "auto",
                        precision: str = "float32", trust_remote_code: bool = False,
                        progress: bool = False) -> list[list[Completion]]:
    """`spec.n` Completions per prompt from the model in `model_dir`."""
    return open_engine(model_dir, engine, precision, trust_remote_code).complete(prompts, spec, progress)


def rollout(model_dir: str, prompts: list[list[dict] | str], spec: SamplingSpec, engine: str = "auto",
            precision: str = "float32", trust_remote_code: bool = False, progress: bool = False) -> list[list[str]]:
    """`spec.n` completion texts per prompt from the model in `model_dir`."""
    return open_engine(model_dir, engine, precision, trust_remote_code).texts(prompts, spec, progress)
