"""Where a step of on-policy distillation (`distill`, `mode: on_policy`: TRL's GKD) spends its time on
this CPU, and what ONNX Runtime GenAI would save if it sampled the student's completions (issue: fast
generation). One run, the profile's student and teacher, qwen3's demo `distill_on` shape: 4 prompts a
step of levels 1-3 in its three modes, 64 new tokens, temperature 0.9.

Per step, each part timed on its own (the first step is a warm-up and not counted):
- the student's HF `generate`, as TRL's GKD trainer calls it (whole distribution, KV cache);
- the same inside `weight_major_linear()`, as the stage's lean GKD trainer calls it
  (stages.distill.lean_gkd_trainer; same prompts, same seed);
- the teacher's forward pass over prompt and completion;
- the student's forward, GKD's loss at qwen3's beta (TRL's `generalized_jsd_loss`), backward and an
  AdamW step;
- ONNX Runtime GenAI sampling the same prompts (`ort_sampler`, the sampler of GRPO's `rollout: ort`);
- writing the student's weights into its graph and loading it again (`WritableConversion.load`),
  which a trainer would pay every step because the student changes every step.
Printed: seconds per part, and the step with ORT (sample + refresh) against the step with HF, plain
and weight-major. `--student`/`--teacher` take model folders (a run's trained models end their
answers sooner than the profile's base models, and both samplers stop a batch when its rows end).

    .venv/bin/python benchmarks/bench_gkd_step.py [--profile demo] [--steps 4] [--student DIR --teacher DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from trl.experimental.gkd import GKDTrainer

from data_curation.sources import load_rows
from pipeline.models.named import resolve_model
from pipeline.recipe import load_recipe
from pipeline.store.home import configure_environment
from toolkit.core.thinking import flag_messages
from toolkit.rollouts import render, thread_budget
from toolkit.rollouts.cpu_decode import weight_major_linear
from toolkit.rollouts.ort import ort_sampler
from toolkit.rollouts.ort_weights import WritableConversion
from toolkit.rollouts.sampling import SamplingSpec

MODES = ["think", "no_think", "default"]  # qwen3's distill_on thinking_modes


def one_step(student, teacher, optimizer, tokenizer, conversion, texts: list[str], tokens: int, seed: int) -> list[float]:
    """Seconds of: HF generate, the teacher's forward, the student's update, ORT sampling, ORT refresh,
    HF generate weight-major."""
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return clock[-1] - clock[-2]

    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    student.eval()
    sample = dict(do_sample=True, temperature=0.9, top_k=0, top_p=1.0, max_new_tokens=tokens,
                  pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    with weight_major_linear():
        student.generate(**batch, **sample)
    weight_major_s = lap()
    torch.manual_seed(seed)
    with torch.no_grad():
        out = student.generate(**batch, **sample)
    generate_s = lap()
    mask = torch.ones_like(out)
    mask[:, :batch["input_ids"].shape[1]] = batch["attention_mask"]
    with torch.no_grad():
        teacher_logits = teacher(input_ids=out, attention_mask=mask).logits
    teacher_s = lap()
    student.train()
    student_logits = student(input_ids=out, attention_mask=mask).logits
    GKDTrainer.generalized_jsd_loss(student_logits, teacher_logits, beta=1.0).backward()  # the trainer's loss, qwen3's beta
    optimizer.step()
    optimizer.zero_grad()
    student_s = lap()
    model = conversion.load(student.state_dict())  # the student moved: its weights into the graph
    refresh_s = lap()
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    ort_sampler(model, tokenizer)(ids, tokens, False, SamplingSpec(max_new_tokens=tokens, temperature=0.9, top_p=1.0,
                                                                     seed=seed))
    return [generate_s, teacher_s, student_s, lap(), refresh_s, weight_major_s]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo", help="whose student and teacher to use")
    ap.add_argument("--steps", type=int, default=4, help="steps timed after one warm-up step")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--student", help="the student's model folder (default: the profile's student)")
    ap.add_argument("--teacher", help="the teacher's model folder (default: the profile's teacher)")
    args = ap.parse_args()
    configure_environment()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stages = {s.name: s for s in load_recipe("qwen3", args.profile).recipe.stages}  # the profile's student, teacher
    student_dir = args.student or str(resolve_model(stages["distill_off"].student))
    teacher_dir = args.teacher or str(resolve_model(stages["query_filter"].model))
    threads = thread_budget()
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    tokenizer.padding_side = "left"
    rows = load_rows("synthetic_math", "train", args.batch * (args.steps + 1), 8, {"difficulties": [1, 2, 3]})
    texts = [render(tokenizer, flag_messages(r["prompt"], MODES[i % 3])) for i, r in enumerate(rows)]
    student = AutoModelForCausalLM.from_pretrained(student_dir)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-6)
    with tempfile.TemporaryDirectory(prefix="bench-gkd-step-") as work:
        started = time.perf_counter()
        conversion = WritableConversion(student_dir, Path(work), threads)
        convert_s = time.perf_counter() - started
        parts = dict.fromkeys(("generate", "teacher", "student", "ort_sample", "ort_refresh", "generate_weight_major"), 0.0)
        for step in range(args.steps + 1):
            seconds = one_step(student, teacher, optimizer, tokenizer, conversion,
                               texts[step * args.batch:(step + 1) * args.batch], args.tokens, step)
            if step:  # the first step warms both engines up
                for key, value in zip(parts, seconds):
                    parts[key] += value / args.steps
    hf_step = parts["generate"] + parts["teacher"] + parts["student"]
    lean_step = parts["generate_weight_major"] + parts["teacher"] + parts["student"]
    ort_step = parts["ort_sample"] + parts["ort_refresh"] + parts["teacher"] + parts["student"]
    print(f"student {student_dir}, teacher {teacher_dir}; {args.batch} prompts a step, {args.tokens} new tokens, "
          f"{threads} threads; mean of {args.steps} steps after a warm-up; ORT conversion once: {convert_s:.1f} s")
    print("| part | seconds a step |")
    print("| --- | --- |")
    for key, value in parts.items():
        print(f"| {key} | {value:.2f} |")
    print(f"step with HF generate {hf_step:.2f} s, weight-major (the stage's) {lean_step:.2f} s, with ORT "
          f"(sample + refresh) {ort_step:.2f} s: ratio ORT/HF {ort_step / hf_step:.2f}, ORT/weight-major "
          f"{ort_step / lean_step:.2f}")


if __name__ == "__main__":
    main()
