import json
import os
import subprocess
import sys

from tests.conftest import REPO


def test_tiny_model_builds_deterministically(tiny_model, tmp_path):
    first = json.loads((tiny_model / "posttrain_model.json").read_text())["sha256"]
    env = {**os.environ, "POSTTRAIN_HOME": str(tmp_path)}
    code = ("from pipeline.models.named import ensure_named_model; import json; "
            "print(json.loads((ensure_named_model('tiny-qwen3') / 'posttrain_model.json').read_text())['sha256'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == first


def test_tiny_model_chat_template_keeps_think_and_masks_prompt(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    prompt = [{"role": "user", "content": "What is 2 + 3?"}]
    full = prompt + [{"role": "assistant", "content": "<think>\n2 + 3 = 5.\n</think>\n\n\\boxed{5}"}]
    p = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    f = tok.apply_chat_template(full, tokenize=False)
    assert f.startswith(p)  # TRL's completion-only loss relies on this prefix property
    assert "<think>" in tok.convert_ids_to_tokens(tok(f)["input_ids"])
    assert tok.eos_token == "<|im_end|>"
