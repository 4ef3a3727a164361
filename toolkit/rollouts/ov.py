"""OpenVINO GenAI as a token sampler: Intel's continuous-batching pipeline (paged attention, a
request leaves the batch the step it ends) over OpenVINO's CPU plugin, which runs float32, or
bfloat16 on AMX where the CPU has it (`INFERENCE_PRECISION_HINT`).

Conversion: optimum-intel's exporter traces the HF model into OpenVINO's IR with a stateful KV cache.
optimum-intel 2.2 pins transformers < 5.6 and posttrain runs transformers 5, so the exporter runs in an
environment of its own (`make setup` makes `.venv-ov-export` from `infra/ov-export.lock`; another one
can be named with POSTTRAIN_OV_EXPORT_PYTHON), in a child process, once per architecture: a later
model of the same architecture gets a copy of a checked export with its own weights written in
(toolkit.rollouts.ov_layout). The conversion is kept by the weights' checksum and the two packages'
versions (`keep_conversions_in`; as ORT's, the four most recently used are kept).
transformers 4.x reads the RoPE base from a top-level `rope_theta` that transformers 5 saves inside
`rope_parameters`; without it the exporter builds the graph with 4.x's default base (10,000 instead
of SmolLM2's 100,000) and no greedy completion matched HF's (0 of 16). The exporter is therefore
handed the model folder with `rope_theta` (and `rope_scaling`) copied to where 4.x reads them.

The IR holds float32 weights; bfloat16 is chosen when the pipeline is compiled, so one conversion
serves both precisions. Token ids go in and come out, so the IR needs no tokenizer of its own.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from toolkit.core.files import process_temp_dir, publish_kept, weights_fingerprint
from toolkit.rollouts.ov_layout import from_template, record_template
from toolkit.rollouts.sampling import THINK_END, SamplingSpec, TokenSampler, cut_at_stop, think_end_id

EXPORT_PYTHON_ENV = "POSTTRAIN_OV_EXPORT_PYTHON"
EXPORT_VENV = Path(__file__).resolve().parents[2] / ".venv-ov-export"
EXPORTER = "optimum-intel 2.2.0"  # pinned in infra/ov-export.lock; part of the conversion's key
HINTS = {"float32": "f32", "bfloat16": "bf16"}
KEPT_CONVERSIONS = 4  # each is the model's size (0.5 GB for SmolLM2); one still wanted is exported again
_CACHE: list[Path] = []
_FAILED: dict[str, str] = {}  # conversion key -> why the exporter failed, in this process


def keep_conversions_in(directory: Path | None) -> None:
    _CACHE[:] = [Path(directory)] if directory else []


def export_python() -> Path:
    return Path(os.environ.get(EXPORT_PYTHON_ENV) or EXPORT_VENV / "bin" / "python")


def ov_unavailable() -> str | None:
    import importlib.util

    if importlib.util.find_spec("openvino_genai") is None:
        return "engine ov needs the openvino-genai package (a dependency: run `make setup`)"
    if not export_python().exists():
        return (f"engine ov converts models with optimum-intel in its own environment, {export_python()} "
                f"is missing (`make setup` makes it; or set {EXPORT_PYTHON_ENV})")
    return None


def ov_precision_problem(precision: str) -> str | None:
    """bfloat16 only where the CPU computes it (AMX, AVX-512 BF16): elsewhere OpenVINO would take the
    hint silently and run float32 under the bfloat16 name."""
    if precision != "bfloat16" or ov_unavailable() or _cpu_computes_bf16():
        return None
    return "engine ov runs bfloat16 only on a CPU that computes it (AMX or AVX-512 BF16); this one does not"


@functools.cache
def _cpu_computes_bf16() -> bool:  # asked by every `auto` at bfloat16: a Core once per process
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def exporter_config(config: dict) -> dict:
    """The model's config as transformers 4.x reads it: the RoPE settings at the top level."""
    rope = config.get("rope_parameters") or {}
    out = dict(config)
    if "rope_theta" in rope:
        out.setdefault("rope_theta", rope["rope_theta"])
    if rope.get("rope_type", "default") != "default":
        out.setdefault("rope_scaling", rope)
    return out


def converted(model_dir: str) -> Path:
    """The model's OpenVINO IR (float32 weights), published with publish_kept: made from the checked
    template of its architecture where there is one (toolkit.rollouts.ov_layout), else exported."""
    import openvino

    root = _CACHE[0] if _CACHE else process_temp_dir("posttrain-ov-")
    converter = f"openvino {openvino.__version__}|{EXPORTER}"
    key = hashlib.sha256(f"{weights_fingerprint(Path(model_dir))}|{openvino.__version__}|{EXPORTER}".encode()).hexdigest()[:20]
    if key in _FAILED:
        raise ValueError(_FAILED[key])
    exported_here = []

    def build(out: Path) -> None:
        if from_template(model_dir, out, root, converter):
            return
        exported_here.append(out)
        source = out.parent / "source"  # the model folder as the exporter reads it: links and a config
        source.mkdir()
        for item in Path(model_dir).iterdir():
            if item.name != "config.json":
                (source / item.name).symlink_to(item.resolve())
        config = json.loads((Path(model_dir) / "config.json").read_text())
        (source / "config.json").write_text(json.dumps(exporter_config(config), indent=1))
        cmd = [str(export_python()), "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(source),
               "--task", "text-generation-with-past", "--weight-format", "fp32", str(out)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0 or not (out / "openvino_model.xml").exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            _FAILED[key] = f"optimum-intel could not export {model_dir}: " + " | ".join(tail)
            raise ValueError(_FAILED[key])

    final = publish_kept(root / key, "openvino_model.xml", build, KEPT_CONVERSIONS)
    if exported_here:  # the exporter's own output: a template for models like this one
        record_template(model_dir, final, converter)
    return final


def open_pipeline(conversion: Path, precision: str, threads: int):
    """A continuous-batching pipeline on the conversion, computing at `precision`. The scheduler's
    defaults stand: its KV cache grows with the rows in flight (none is reserved up front)."""
    import openvino_genai as og

    return og.ContinuousBatchingPipeline(str(conversion), og.SchedulerConfig(), "CPU", properties={
        "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": HINTS[precision]})


def ov_sampler(pipeline, tokenizer) -> TokenSampler:
    """Every row is a request of its own (`n` copies of a prompt are `n` requests), all handed to the
    pipeline at once: it schedules them in one running batch, and a row that ends stops costing
    compute. Each row gets a seed of its own: the spec's seed and the row's place among all the rows
    this sampler has drawn (the same seed would draw `n` copies of a prompt alike, and the same seeds
    in every batch would reuse one stream), so a new sampler per `complete` call makes its draws
    reproducible, as ORT's. Sampled draws come from the whole distribution after temperature and top_p (the
    pipeline's top_k is off by default), by the pipeline's own generator: the law is HF's, the
    stream is another. `</think>` stops a row as a token, or (split, as in SmolLM2) as a stop string."""
    import numpy as np
    import openvino as ov
    import openvino_genai as og

    eos = tokenizer.eos_token_id
    think_end = think_end_id(tokenizer)
    rows_drawn = [0]

    def sample(seqs: list[list[int]], max_new_tokens: int, stop_at_think_end: bool,
               spec: SamplingSpec) -> list[list[int]]:
        if not seqs:
            return []
        first_row, rows_drawn[0] = rows_drawn[0], rows_drawn[0] + len(seqs)
        stops = {eos} | ({think_end} if stop_at_think_end and think_end is not None else set())
        stop_string = stop_at_think_end and think_end is None
        configs = []
        for row in range(len(seqs)):
            config = og.GenerationConfig()
            config.max_new_tokens = max_new_tokens
            config.stop_token_ids = stops
            if stop_string:
                config.stop_strings = {THINK_END}
                config.include_stop_str_in_output = True
            config.do_sample = spec.temperature > 0
            if config.do_sample:
                config.temperature, config.top_p = spec.temperature, spec.top_p
                config.rng_seed = spec.seed * 1_000_003 + first_row + row
            configs.append(config)
        results = pipeline.generate([ov.Tensor(np.array([s], dtype=np.int64)) for s in seqs], configs)
        return [cut_at_stop(tokenizer, list(r.m_generation_ids[0]), stops, stop_string) for r in results]

    return sample


def main() -> None:
    """`python -m toolkit.rollouts.ov MODEL_DIR`: convert a model (a check of the export environment)."""
    print(converted(sys.argv[1]))


if __name__ == "__main__":
    main()
