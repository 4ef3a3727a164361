"""Conversions into the CPU engines' formats: made once per model and kept by the cache's pruning;
made from a checked template of the architecture (ONNX Runtime GenAI's builder, optimum-intel's
OpenVINO export) byte for byte as the converter makes them; GRPO's policy weights written into an
ONNX Runtime graph in place; the RoPE config the OpenVINO exporter reads."""

import pytest

from tests.conftest import ort_last_logits
from toolkit.rollouts.engines import keep_conversions_in


def test_ov_hands_the_exporter_the_rope_base_where_transformers_4_reads_it():
    from toolkit.rollouts.ov import exporter_config

    v5 = {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "hidden_size": 8}
    assert exporter_config(v5) == {**v5, "rope_theta": 100000.0}
    scaled = {"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}}
    assert exporter_config(scaled)["rope_scaling"] == scaled["rope_parameters"]
    assert exporter_config({"rope_theta": 1e4}) == {"rope_theta": 1e4}  # a 4.x config stays as it is


@pytest.mark.parametrize("engine,marker", [("ct2", "model.bin"), ("ort", "genai_config.json"), ("ov", "openvino_model.xml")])
def test_a_conversion_is_made_once_per_model(tiny_model, tmp_path, engine, marker):
    from toolkit.rollouts import ct2, ort, ov

    convert = {"ct2": lambda: ct2.converted(str(tiny_model)), "ort": lambda: ort.converted(str(tiny_model), "float32"),
               "ov": lambda: ov.converted(str(tiny_model))}[engine]
    keep_conversions_in(tmp_path)
    try:
        first = convert()
        stamp = (first / marker).stat().st_mtime_ns
        assert convert() == first and (first / marker).stat().st_mtime_ns == stamp
        # the ORT builder's float32 output, checked, is a template; ov's export of the tiny model folds its
        # unit norms away and is none (test_ov_takes_no_template_from_an_export_that_folded_a_weight_away)
        templates = [".templates"] if engine == "ort" else []
        assert sorted(p.name for p in (tmp_path / engine).iterdir()) == sorted([first.name, *templates])  # no temp folder
    finally:
        keep_conversions_in(None)


def test_a_conversion_cache_keeps_the_four_most_recently_used(tmp_path):
    import os

    from toolkit.core.files import prune_least_recent

    for age, name in enumerate(["e", "d", "c", "b", "a"]):  # "a" is the oldest
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (1000 - age, 1000 - age))
    (tmp_path / ".x.partial").mkdir()  # another process's conversion in progress
    prune_least_recent(tmp_path, keep=tmp_path / "a", kept=4)  # "a" was just made or used
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.partial", "a", "c", "d", "e"]


def test_ort_takes_a_policys_new_weights_in_place_and_gives_its_logits(tiny_model, prompts, tmp_path):
    """GRPO's `rollout: ort`: the trainer's weights written into the built graph's data file (no
    rebuild) give the logits HF gives for the same weights, and not the old weights' logits."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.rollouts.ort_weights import WritableConversion

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
           for p in prompts[:4]]
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    conversion = WritableConversion(str(tiny_model), tmp_path, 1)
    before = [ort_last_logits(conversion.load(), row) for row in ids]
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=noise) * 0.1)
    updated = conversion.load(policy.state_dict())
    for row, old in zip(ids, before):
        new = ort_last_logits(updated, row)
        with torch.no_grad():
            hf = policy(torch.tensor([row])).logits[0, -1].numpy()
        np.testing.assert_allclose(new, hf, atol=1e-4)
        assert np.abs(new - old).max() > 1e-2


def test_ort_refuses_weights_laid_out_other_than_its_graph(tiny_model, tmp_path):
    """The in-place layout is checked against the builder's own output before any step: a weight that
    maps to other bytes (here: a norm changed after the conversion was built) is named."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit.rollouts.ort_weights import WritableConversion

    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    weights = {k: v.clone() for k, v in policy.state_dict().items()}
    weights["model.norm.weight"] += 1
    with pytest.raises(ValueError, match="different bytes: \\['model.layers.2.final_norm_layernorm.weight'\\]"):
        WritableConversion(str(tiny_model), tmp_path, 1, starting=weights)
    del weights["model.layers.0.self_attn.q_norm.weight"]
    with pytest.raises(ValueError, match="not mapped: \\['model.layers.0.attn.q_norm.layernorm.weight'\\]"):
        WritableConversion(str(tiny_model), tmp_path, 1, starting=weights)


def _tiny_with_other_weights(tiny_model, out, seed: int):
    """The tiny model with every weight moved by its own noise (norms too: an export folds a norm of
    exactly ones away, and stores equal ones once), saved with the tiny model's other files."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=noise))
    model.save_pretrained(out)
    for f in tiny_model.iterdir():
        if not (out / f.name).exists():
            shutil.copy(f, out / f.name)


@pytest.mark.parametrize("engine", ["ort", "ov"])
def test_a_conversion_made_from_a_template_is_the_converters_byte_for_byte(tiny_model, tmp_path, monkeypatch, engine):
    """A second model of a converted architecture (here: the tiny model with other weights) gets its
    float32 conversion by copying the first's and writing its own weights in, without the converter
    (ONNX Runtime GenAI's builder, optimum-intel's exporter); every file equals what the converter
    makes for it. The first is a named model as posttrain builds it (with its `posttrain_model.json`
    marker), the second a trained one (without it, and for OpenVINO with `use_cache` false where the
    first has it true, as a trainer saves it: the key leaves the value out and the copy's config
    carries the model's own), as a recipe's base and first stage are. A model whose tokenizer files
    differ does not take the template."""
    import filecmp
    import json

    from toolkit.rollouts import ort, ov

    module = {"ort": ort, "ov": ov}[engine]
    def convert(model_dir):
        return ort.converted(str(model_dir), "float32") if engine == "ort" else ov.converted(str(model_dir))

    def no_converter(*args, **kwargs):
        raise RuntimeError("the converter ran")

    first, other = tmp_path / "first", tmp_path / "other"
    _tiny_with_other_weights(tiny_model, first, seed=1)
    _tiny_with_other_weights(tiny_model, other, seed=2)
    assert (first / "posttrain_model.json").exists()
    (other / "posttrain_model.json").unlink()
    if engine == "ov":
        config = json.loads((other / "config.json").read_text())
        assert config["use_cache"] is True
        (other / "config.json").write_text(json.dumps({**config, "use_cache": False}, indent=2))
    keep_conversions_in(tmp_path / "by-converter")
    try:
        converters = convert(other)
        keep_conversions_in(tmp_path / "templated")
        convert(first)  # the converter's, checked: the template
        with monkeypatch.context() as patched:
            patched.setattr(module.subprocess, "run", no_converter)
            templated = convert(other)
        names = sorted(p.name for p in converters.iterdir())
        assert names == sorted(p.name for p in templated.iterdir()) and len(names) >= 4
        assert filecmp.cmpfiles(converters, templated, names, shallow=False)[0] == names

        _tiny_with_other_weights(tiny_model, other, seed=3)  # new weights, and now a chat template of its own
        (other / "chat_template.jinja").write_text((other / "chat_template.jinja").read_text() + "\n")
        with monkeypatch.context() as patched:
            patched.setattr(module.subprocess, "run", no_converter)
            with pytest.raises(RuntimeError, match="the converter ran"):
                convert(other)
    finally:
        keep_conversions_in(None)


def test_ov_takes_no_template_from_an_export_that_folded_a_weight_away(tiny_model):
    """The tiny model's norms are exactly ones, and the exporter drops a multiplication by ones: its
    export holds no constant for them, so it cannot take another model's norms and is no template."""
    from toolkit.rollouts import ov
    from toolkit.rollouts.ov_layout import exported_weights, weight_layout

    with pytest.raises(ValueError, match="norm.weight in 0 constants"):
        weight_layout(ov.converted(str(tiny_model)), exported_weights(str(tiny_model)))


def test_a_models_weights_are_hashed_once_per_process_until_they_change(tmp_path, monkeypatch):
    """Engines find their conversion by the weights' checksum at every open: hashed once while the
    files keep their names, sizes and times, and again as soon as one is rewritten."""
    import os

    from toolkit.core import files

    hashed = []
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda p, *a: hashed.append(p) or real(p, *a))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 64)
    first = files.weights_fingerprint(tmp_path)
    assert files.weights_fingerprint(tmp_path) == first and len(hashed) == 1
    weights.write_bytes(b"b" * 64)  # same size; a later modification time
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1_000_000))
    assert files.weights_fingerprint(tmp_path) != first and len(hashed) == 2
