"""Each RLHF and distillation kind resumes from its last checkpoint after its worker is SIGKILLed
(the SFT and GRPO kinds have their own resume tests in test_launcher and test_grpo_stage). The
worker runs as the flow runs it (`run_worker`, its own process group); the kill takes the group."""

import json
import os
import signal
import threading
import time

import pytest

from pipeline.launch.workers import StageFailed, run_worker
from stages.launch import LaunchSpec
from stages.runtime import checkpoint_step, saved_checkpoints
from tests.conftest import padded_pairs_file
from tests.test_launcher import _alive

pytestmark = pytest.mark.slow

MAX_STEPS = 40
DATA = {"source": "synthetic_math", "n": 48, "params": {"difficulties": [1]}}
TRAINING = {"max_steps": MAX_STEPS, "save_steps": 2, "per_device_batch_size": 4, "max_length": 160,
            "learning_rate": 1e-3}


def _stage(kind: str, tiny: str, student: str, pairs: str) -> tuple[str, object, dict]:
    if kind == "reward_model":
        from stages.reward_model import RewardModelConfig

        cfg = RewardModelConfig(name="rm", model=tiny, pairs={"path": pairs}, **TRAINING)
        return "reward_model", cfg, {"model": tiny, "pairs": {"path": pairs}}
    if kind == "dpo":
        from stages.dpo import DPOConfig

        cfg = DPOConfig(name="dpo", model=tiny, pairs={"path": pairs}, length_probe=0, **TRAINING)
        return "dpo", cfg, {"model": tiny, "pairs": {"path": pairs}}
    from stages.distill import DistillConfig

    mode = kind.removeprefix("distill_")
    # 120 tokens: sampling from the random tiny model's whole distribution, about one trace in seven ends
    # (so is kept) by then; at 24 none did once sampling stopped being cut to the top 50 tokens
    extra = {"teacher_temperature": 0.8, "teacher_max_new_tokens": 120, "verify": False} if mode == "off_policy" \
        else {"max_new_tokens": 12}
    cfg = DistillConfig(name=kind, mode=mode, student=student, teacher=tiny, data=DATA, probe_prompts=0,
                        **extra, **TRAINING)
    return "distill", cfg, {"student": student, "teacher": tiny, "data": DATA}


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> str:
    return padded_pairs_file(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", 96, 0)


@pytest.mark.parametrize("kind", ["reward_model", "dpo", "distill_off_policy", "distill_on_policy"])
def test_a_killed_stage_resumes_from_its_last_checkpoint(kind, tmp_path, tiny_model, pairs_file):
    from pipeline.models.named import ensure_named_model

    name, cfg, inputs = _stage(kind, str(tiny_model), str(ensure_named_model("tiny-qwen3-student")), pairs_file)
    out = tmp_path / "out"
    out.mkdir()
    spec = out / "spec.json"
    spec.write_text(json.dumps({"kind": name, "stage": cfg.model_dump(mode="json"), "eval": None,
                                "output_dir": str(out), "inputs": inputs}))
    failures: list[BaseException] = []

    def first_run():
        try:
            run_worker(spec, LaunchSpec(), tmp_path / "first.log", env={})
        except StageFailed as e:
            failures.append(e)

    runner = threading.Thread(target=first_run)
    runner.start()
    def whole_checkpoints() -> list[int]:
        # HF writes trainer_state.json last and not atomically: a checkpoint killed mid-write is
        # removed on resume (stages.runtime.last_checkpoint), so the kill waits for one that parses
        return [checkpoint_step(str(p)) for p in saved_checkpoints(out / "checkpoints")[0]]

    deadline = time.time() + 300
    while not whole_checkpoints():  # polled often: a tiny model's steps take a fraction of a second
        assert time.time() < deadline and runner.is_alive(), f"{kind} made no complete checkpoint"
        time.sleep(0.02)
    traces = out / "teacher_traces.json"
    traces_before = traces.read_text() if traces.exists() else None
    worker = int((out / "worker.pid").read_text())
    os.killpg(worker, signal.SIGKILL)  # the worker's whole process group, as an OOM kill would
    runner.join(timeout=60)
    assert failures and not _alive(worker), "the worker finished before the kill: raise MAX_STEPS"
    assert not (out / "result.json").exists()
    saved = max(whole_checkpoints())
    assert saved < MAX_STEPS

    run_worker(spec, LaunchSpec(), tmp_path / "rerun.log", env={})
    metrics = json.loads((out / "result.json").read_text())["metrics"]
    assert metrics["train/resumed_from_step"] == saved
    assert metrics["train/global_step"] == MAX_STEPS
    assert (out / "model" / "model.safetensors").exists()
    assert f"resuming from {out / 'checkpoints' / f'checkpoint-{saved}'}" in (tmp_path / "rerun.log").read_text()
    if name == "distill" and cfg.mode == "off_policy":
        # sampled at temperature 0.8: sampling again would train the second half on other traces
        assert traces_before is not None and traces.read_text() == traces_before
        assert "distill/traces_kept" in metrics


def test_a_stage_that_initialises_weights_is_reproducible(tmp_path, tiny_model, pairs_file, monkeypatch):
    """A reward model's score head starts random: two workers with the same config train the same
    model. Fresh interpreters, as two flows' workers are (workers forked from one flow's warm server
    share its RNG state): qwen3's demo reward model came out different in two runs from the same
    pairs and config before the worker seeded itself."""
    import hashlib

    monkeypatch.setenv("POSTTRAIN_WARM_WORKERS", "0")
    digests = []
    for attempt in ("first", "second"):
        name, cfg, inputs = _stage("reward_model", str(tiny_model), "", pairs_file)
        out = tmp_path / attempt
        out.mkdir()
        spec = out / "spec.json"
        spec.write_text(json.dumps({"kind": name, "stage": {**cfg.model_dump(mode="json"), "max_steps": 4},
                                    "eval": None, "output_dir": str(out), "inputs": inputs}))
        run_worker(spec, LaunchSpec(), tmp_path / f"{attempt}.log", env={})
        digests.append(hashlib.sha256((out / "model" / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]
