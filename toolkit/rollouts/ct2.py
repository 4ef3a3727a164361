"""CTranslate2 as a token sampler: a C++ inference engine for causal LMs (Llama, Qwen2/3 and more)
with int8 kernels for this CPU (AVX-512 VNNI). It installs from PyPI as one wheel, converts an HF
checkpoint in seconds with no other tool, and takes token ids in and gives token ids out, so the
budget logic and the tokenizer stay HF's. At float32 ONNX Runtime GenAI (ort.py) is faster; int8
is this engine's.

A model is converted once, in float32, into a cache keyed by its weights' checksum and the engine's
version (`keep_conversions_in`; the worker points it at `$POSTTRAIN_HOME/cache/ct2`); the compute
precision (float32, or int8 with float32 activations) is chosen when it is loaded. In float32 its
greedy outputs equal HF's token for token on 64/64 base-SmolLM2 prompts and 197/200 of a trained
one (benchmarks/RESULTS.md); int8 changes them, which is why it is a visible setting.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from toolkit.core.files import publish_dir, weights_fingerprint
from toolkit.core.loading import whole_model
from toolkit.rollouts.sampling import THINK_END, SamplingSpec, TokenSampler, cut_at_stop, think_end_id

COMPUTE_TYPES = {"float32": "float32", "int8": "int8_float32"}
_CACHE: list[Path] = []


def keep_conversions_in(directory: Path | None) -> None:
    """Where converted models are kept across processes; unset, each process converts into a temp dir."""
    _CACHE[:] = [Path(directory)] if directory else []


def ct2_unavailable() -> str | None:
    import importlib.util

    if importlib.util.find_spec("ctranslate2") is None:
        return "engine ct2 needs the ctranslate2 package (a dependency: run `make setup`)"
    return None


def converted(model_dir: str, trust_remote_code: bool = False) -> Path:
    """The model's CTranslate2 conversion, made once (a temp folder renamed into place, so two
    processes converting at once both end with a whole one)."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    root = _CACHE[0] if _CACHE else Path(tempfile.mkdtemp(prefix="posttrain-ct2-"))
    key = hashlib.sha256(f"{weights_fingerprint(Path(model_dir))}|{ctranslate2.__version__}".encode()).hexdigest()[:20]

    def build(out: Path) -> None:
        with whole_model():  # the converter loads the HF model: on this rank alone, even inside a ZeRO-3 run
            TransformersConverter(model_dir, trust_remote_code=trust_remote_code).convert(str(out), force=True)

    return publish_dir(root / key, "model.bin", build)


def load_ct2(model_dir: str, precision: str, threads: int, trust_remote_code: bool = False):
    return open_generator(converted(model_dir, trust_remote_code), precision, threads)


def open_generator(conversion: Path, precision: str, threads: int):
    """A generator on a conversion already made (no weights hashed again)."""
    import ctranslate2

    return ctranslate2.Generator(str(conversion), device="cpu", compute_type=COMPUTE_TYPES[precision],
                                 intra_threads=threads, inter_threads=1)


def ct2_sampler(generator, tokenizer) -> TokenSampler:
    """Rows are sampled independently (`n` copies of a prompt are `n` rows). A single-token
    `</think>` is an end token; a split one (SmolLM2) is watched for in a per-token callback that
    stops its row, as HF's stop strings do."""

    def sample(seqs: list[list[int]], max_new_tokens: int, stop_at_think_end: bool,
               spec: SamplingSpec) -> list[list[int]]:
        stops = [tokenizer.eos_token_id]
        callback, stop_string = None, False
        if stop_at_think_end:
            if (think_end := think_end_id(tokenizer)) is not None:
                stops.append(think_end)
            else:
                stop_string = True
                tails: dict[int, list[int]] = {}

                def callback(step) -> bool:
                    tail = tails.setdefault(step.batch_id, [])
                    tail.append(step.token_id)
                    return tokenizer.decode(tail[-8:]).rstrip().endswith(THINK_END)
        sampling = (dict(sampling_topk=0, sampling_topp=spec.top_p, sampling_temperature=spec.temperature)
                    if spec.temperature > 0 else dict(sampling_topk=1))
        results = generator.generate_batch(
            [tokenizer.convert_ids_to_tokens(s) for s in seqs], max_length=max_new_tokens,
            include_prompt_in_result=False, end_token=stops, return_end_token=True, callback=callback, **sampling)
        return [cut_at_stop(tokenizer, r.sequences_ids[0], set(stops), stop_string) for r in results]

    return sample
