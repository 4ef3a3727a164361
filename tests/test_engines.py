"""Generation engines behind the one rollout interface: CTranslate2 at float32 gives HF's greedy
outputs token for token, precision is refused where an engine cannot run it, `auto` says what it
chose, and a profile sets the engine for every stage and the evaluation."""

import pytest

from data_curation.sources import load_rows
from pipeline.recipe import RecipeError, load_recipe
from tests.conftest import ort_last_logits
from toolkit.core.templates import render_prompt
from toolkit.rollouts import SamplingSpec, engine_problems, open_engine, resolve_engine
from toolkit.rollouts.engines import AUTO_ORT_MIN_BYTES, drain_opened, keep_conversions_in


@pytest.fixture(scope="module")
def prompts():
    return [render_prompt("chat", r) for r in load_rows("synthetic_math", "eval", 24, 0, {})]


def test_ct2_float32_greedy_equals_hf_token_for_token(tiny_model, prompts):
    spec = SamplingSpec(max_new_tokens=24, batch_size=8)
    hf = open_engine(str(tiny_model), "hf").complete(prompts, spec)
    ct2 = open_engine(str(tiny_model), "ct2").complete(prompts, spec)
    same = sum(a[0].text == b[0].text and a[0].tokens == b[0].tokens for a, b in zip(hf, ct2))
    assert same >= 0.95 * len(prompts), same


def test_ort_float32_greedy_equals_hf_token_for_token(tiny_model, prompts):
    """Right padding (see toolkit/rollouts/ort.py): rows of different lengths in one batch of 8."""
    spec = SamplingSpec(max_new_tokens=24, batch_size=8)
    hf = open_engine(str(tiny_model), "hf").complete(prompts, spec)
    ort = open_engine(str(tiny_model), "ort").complete(prompts, spec)
    assert len({len(p[-1]["content"]) for p in prompts[:8]}) > 1
    same = sum(a[0].text == b[0].text and a[0].tokens == b[0].tokens for a, b in zip(hf, ort))
    assert same >= 0.95 * len(prompts), same


def test_ov_float32_greedy_equals_hf_token_for_token(tiny_model, prompts):
    """The exporter runs in its own environment on a config rewritten for transformers 4.x (see
    toolkit/rollouts/ov.py): a RoPE base read wrongly there makes every row differ."""
    spec = SamplingSpec(max_new_tokens=24, batch_size=8)
    hf = open_engine(str(tiny_model), "hf").complete(prompts, spec)
    ov = open_engine(str(tiny_model), "ov").complete(prompts, spec)
    same = sum(a[0].text == b[0].text and a[0].tokens == b[0].tokens for a, b in zip(hf, ov))
    assert same >= 0.95 * len(prompts), same


def test_ov_hands_the_exporter_the_rope_base_where_transformers_4_reads_it():
    from toolkit.rollouts.ov import exporter_config

    v5 = {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "hidden_size": 8}
    assert exporter_config(v5) == {**v5, "rope_theta": 100000.0}
    scaled = {"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}}
    assert exporter_config(scaled)["rope_scaling"] == scaled["rope_parameters"]
    assert exporter_config({"rope_theta": 1e4}) == {"rope_theta": 1e4}  # a 4.x config stays as it is


@pytest.mark.parametrize("engine,precision", [("ct2", "int8"), ("ort", "int4"), ("ov", "float32")])
def test_sampling_gives_n_completions_per_prompt_reproducibly(tiny_model, prompts, engine, precision):
    loaded = open_engine(str(tiny_model), engine, precision)
    spec = SamplingSpec(max_new_tokens=12, temperature=1.0, n=3, batch_size=4, seed=7)
    first, again = loaded.texts(prompts[:4], spec), loaded.texts(prompts[:4], spec)
    assert [len(cs) for cs in first] == [3] * 4 and first == again
    assert any(len(set(cs)) > 1 for cs in first)  # a prompt's copies are drawn apart, not alike
    one_by_one = loaded.texts([prompts[0], prompts[0]], SamplingSpec(max_new_tokens=12, temperature=1.0, batch_size=1, seed=7))
    assert one_by_one[0] != one_by_one[1]  # and so is the same prompt in the next batch: no stream used twice
    assert f"{engine} {precision}" in " ".join(drain_opened()) and drain_opened() == []  # what the stage records, once


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


def test_ort_reads_prompts_holding_the_end_token_alike_in_a_batch_and_alone(tiny_model, prompts):
    """The chat template puts the end token (SmolLM2's and tiny-qwen3's pad token) inside every
    prompt; rows of one batch are padded to one width. ORT GenAI would mask a prompt's own end tokens
    if it padded with them: it pads with -1."""
    engine = open_engine(str(tiny_model), "ort")
    eos = engine.tokenizer.eos_token_id
    assert all(eos in engine.tokenizer(engine.tokenizer.apply_chat_template(p, tokenize=False))["input_ids"] for p in prompts[:8])
    spec = SamplingSpec(max_new_tokens=16, batch_size=8)
    batched = [c[0].text for c in engine.complete(prompts[:8], spec)]
    alone = [engine.complete([p], spec)[0][0].text for p in prompts[:8]]
    assert batched == alone


@pytest.mark.parametrize("engine,precision,message", [
    ("hf", "int8", "engine hf does not run int8"),
    ("ct2", "bfloat16", "engine ct2 does not run bfloat16"),
    ("ort", "int8", "engine ort does not run int8"),
    ("ov", "int4", "engine ov does not run int4"),
    ("vllm", "float32", "vLLM rollouts need"),
])
def test_an_engine_is_refused_a_precision_or_machine_it_cannot_run(engine, precision, message):
    assert any(message in p for p in engine_problems(engine, precision))


def test_ov_says_its_exporter_is_missing_before_any_compute(monkeypatch, tmp_path):
    monkeypatch.setenv("POSTTRAIN_OV_EXPORT_PYTHON", str(tmp_path / "nowhere" / "python"))
    assert any("nowhere" in p and "make setup" in p for p in engine_problems("ov", "float32"))


def test_auto_is_the_engine_measured_fastest_here_for_the_precision(tiny_model, tmp_path, monkeypatch):
    assert resolve_engine("auto", "float32", str(tiny_model)) == "hf"  # a conversion would cost more than it saves
    with open(tmp_path / "model.safetensors", "wb") as f:  # a real model's size (sparse: no disk used)
        f.truncate(AUTO_ORT_MIN_BYTES)
    assert resolve_engine("auto", "float32", str(tmp_path)) == "ov"
    bf16 = "ov" if not engine_problems("ov", "bfloat16") else "hf"  # OpenVINO where the CPU computes bfloat16
    assert resolve_engine("auto", "bfloat16", str(tmp_path)) == bf16
    monkeypatch.setenv("POSTTRAIN_OV_EXPORT_PYTHON", str(tmp_path / "nowhere"))  # made with OV_EXPORT=0
    assert resolve_engine("auto", "float32", str(tmp_path)) == "ort"
    assert resolve_engine("auto", "bfloat16", str(tmp_path)) == "hf"
    assert resolve_engine("auto", "int8") == "ct2" and resolve_engine("auto", "int4") == "ort"


def test_a_profile_sets_generation_for_every_stage_and_the_evaluation(tmp_path, monkeypatch):
    import pipeline.recipe as recipe

    (tmp_path / "tiny.yaml").write_text((recipe.PROFILES_DIR / "tiny.yaml").read_text()
                                        + "\ngeneration: {precision: int8}\n")
    monkeypatch.setattr(recipe, "PROFILES_DIR", tmp_path)
    resolved = load_recipe("smoke", "tiny", ["stages.polish.generation.engine=ct2"])
    assert {(s.name, s.generation.engine, s.generation.precision) for s in resolved.recipe.stages} == {
        ("cold_start", "auto", "int8"), ("polish", "ct2", "int8")}  # the stage's own field wins, the rest is the profile's
    assert resolved.recipe.eval.generation.precision == "int8"
    with pytest.raises(RecipeError, match=r"stages\[0\]\.generation: engine hf does not run int8"):
        load_recipe("smoke", "tiny", ["stages.cold_start.generation.engine=hf"])


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
    makes for it. A model whose tokenizer files differ does not take the template."""
    import filecmp

    from toolkit.rollouts import ort, ov

    module = {"ort": ort, "ov": ov}[engine]
    def convert(model_dir):
        return ort.converted(str(model_dir), "float32") if engine == "ort" else ov.converted(str(model_dir))

    def no_converter(*args, **kwargs):
        raise RuntimeError("the converter ran")

    first, other = tmp_path / "first", tmp_path / "other"
    _tiny_with_other_weights(tiny_model, first, seed=1)
    _tiny_with_other_weights(tiny_model, other, seed=2)
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


@pytest.mark.parametrize("engine", ["hf", "ort", "ct2"])
def test_sampling_draws_from_the_whole_distribution_not_the_top_50(tiny_model, engine):
    """Sampled tokens come from the model's distribution after temperature and top_p, as TRL (its
    `top_k=0`), vLLM and the papers sample. HF's generate and ONNX Runtime GenAI keep only the 50
    likeliest tokens unless told otherwise, and GRPO's `rollout: ort` then sampled from another policy
    than the one whose log-probabilities it trains on. On the random tiny model, at temperature 2,
    32 draws that all land in the top 50 of its 642 tokens would mean a top-k cut."""
    import torch

    from toolkit.rollouts import ct2, hf, ort

    model, tokenizer = hf.load_for_generation(str(tiny_model))
    samplers = {"hf": lambda: hf.hf_sampler(model, tokenizer),
                "ort": lambda: ort.ort_sampler(ort.open_model(ort.converted(str(tiny_model), "float32"), 1), tokenizer),
                "ct2": lambda: ct2.ct2_sampler(ct2.open_generator(ct2.converted(str(tiny_model)), "float32", 1),
                                               tokenizer)}
    ids = tokenizer("What is 2 + 3?")["input_ids"]
    rows = samplers[engine]()([ids] * 32, 1, False, SamplingSpec(temperature=2.0, seed=0))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    rank = torch.argsort(torch.argsort(logits, descending=True))
    assert len(logits) > 500 and max(int(rank[row[0]]) for row in rows) >= 50


def test_ort_sampled_rows_left_unfinished_go_on_in_a_generator_of_their_own(tiny_model, monkeypatch):
    """The tail restart (toolkit/rollouts/ort.py, TAIL_SHARE): rows still going once most have ended
    continue in a smaller generator from their prompt and tokens so far. The draw is replaced by a
    deterministic function of each row's logits (the argmax after a fixed random offset per token, as
    a Gumbel draw with its noise frozen: the random tiny model's own argmax is one token everywhere),
    so a restarted row gives the same tokens only if it continues from its own tokens at its own
    positions. Restarting after every step, with a stop token the rows write at different steps, the
    generators hold shrinking subsets of the rows."""
    import copy

    import numpy as np

    from toolkit.rollouts import hf, ort

    offset = []  # drawn once, scaled to the logits (the top two then stay at least 2e-3 apart here)

    def frozen_gumbel(logits, temperature, generator):
        scores = logits.reshape(-1, logits.shape[-1])
        if not offset:
            offset.append(np.random.default_rng(0).standard_normal(scores.shape[-1]).astype(np.float32) * scores.std())
        picked = (scores + offset[0]).argmax(1)
        forced = np.full_like(scores, np.finfo(scores.dtype).min)
        forced[np.arange(len(picked)), picked] = 0.0
        return forced.reshape(logits.shape)

    monkeypatch.setattr(ort, "forced_draw", frozen_gumbel)
    monkeypatch.setattr(ort, "TAIL_MIN_STEPS", 1)
    _, tokenizer = hf.load_for_generation(str(tiny_model))
    model = ort.open_model(ort.converted(str(tiny_model), "float32"), 1)
    seqs = [tokenizer(f"What is {a} + {b * 7}? Think.")["input_ids"] for a, b in zip(range(3, 60, 7), range(8))]
    spec = SamplingSpec(temperature=1.0, seed=0)
    monkeypatch.setattr(ort, "TAIL_SHARE", 10**9)  # never restarts
    reference = ort.ort_sampler(model, tokenizer)(seqs, 20, False, spec)
    assert tokenizer.eos_token_id not in {t for row in reference for t in row}
    first_at = {}  # token -> the steps at which rows first write it
    for row in reference:
        for step, token in enumerate(row):
            first_at.setdefault(token, set()).add(step) if token not in row[:step] else None
    stop = max(first_at, key=lambda t: len(first_at[t]))

    stops_there = copy.deepcopy(tokenizer)  # the tokenizer, with that token as its end token
    stops_there.eos_token = tokenizer.convert_ids_to_tokens(stop)
    assert stops_there.eos_token_id == stop
    expected = ort.ort_sampler(model, stops_there)(seqs, 20, False, spec)
    monkeypatch.setattr(ort, "TAIL_SHARE", 1)  # restarts after every step
    assert ort.ort_sampler(model, stops_there)(seqs, 20, False, spec) == expected
    assert len({len(row) for row in expected}) >= 3, expected  # rows ended at three or more steps


def test_ort_draws_the_whole_distribution_as_softmax_at_the_temperature():
    """ORT's top_p-1 sampling is drawn from the logits ORT computes and forced into its greedy search:
    the forced scores single out the drawn token, and 20000 draws land on each token as often as
    softmax(logits / T) says (hand-made logits; 4 standard errors is under 0.015)."""
    import numpy as np
    import torch

    from toolkit.rollouts.ort import forced_draw

    logits = np.array([[2.0, 1.0, 0.0, -1.0, -np.inf]], dtype=np.float32).repeat(20000, 0)
    forced = forced_draw(logits, 0.5, torch.Generator().manual_seed(0))
    drawn = forced.argmax(1)
    assert ((forced == 0).sum(1) == 1).all() and (forced[np.arange(len(drawn)), drawn] == 0).all()
    want = torch.softmax(torch.tensor(logits[0]) / 0.5, -1).numpy()
    assert np.abs(np.bincount(drawn, minlength=5) / len(drawn) - want).max() < 0.015
    assert (drawn != 4).all()


class _WordTokenizer:
    """Words as tokens, for the scripted vLLM stand-in below."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": text.split()}


class _ScriptedLLM:
    """vLLM's offline `LLM.generate` as generate_vllm relies on it (vLLM cannot run on this machine;
    benchmarks/gpu_generation.py runs the real engine on a GPU). Each output carries its
    text, token ids and why it ended: a stop string ends it with finish_reason "stop", stop_reason the
    string and (include_stop_str_in_output) the string kept; the end-of-turn token with stop_reason
    None and its text left out; max_tokens with "length". The scripted model's tokens are words."""

    EOS = "<eos>"

    def __init__(self, script):
        self.script = script

    def get_tokenizer(self):
        return _WordTokenizer()

    def generate(self, texts, params):
        from types import SimpleNamespace as NS

        def sample(text):
            words, out_text = [], ""
            for word in self.script(text):
                words.append(word)
                if word == self.EOS:
                    return NS(text=out_text, token_ids=words, finish_reason="stop", stop_reason=None)
                out_text += " " + word
                if stop := next((s for s in params.stop if out_text.endswith(s)), None):
                    return NS(text=out_text, token_ids=words, finish_reason="stop", stop_reason=stop)
                if len(words) == params.max_tokens:
                    return NS(text=out_text, token_ids=words, finish_reason="length", stop_reason=None)
            raise AssertionError("the script ran out")

        return [NS(outputs=[sample(t) for _ in range(params.n)]) for t in texts]


def test_vllm_budgets_count_and_continue_as_the_token_level_engines(monkeypatch):
    """The two-phase budget on vLLM's text interface gives what sampling.complete gives on HF, ORT
    and CTranslate2: a sequence that spends its budget gets the stop-thinking string and then its
    answer; one that closes its thinking goes on to its answer without it, its own `</think>` not
    counted as thinking; one that ends its turn inside the thinking is finished. Tokens count every
    token spent, the inserted string's included."""
    import sys
    from types import SimpleNamespace

    from toolkit.rollouts.sampling import STOP_THINKING, THINK_END
    from toolkit.rollouts.vllm import generate_vllm

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(
        **{"stop": (), **kw})))
    eos = _ScriptedLLM.EOS
    thinking = {"never|": ["a"] * 50, "closes|": ["x", "y", THINK_END], "ends|": ["q", eos]}

    def script(text):
        prompt, _, so_far = text.partition("|")
        return ["final", eos] if THINK_END in so_far else thinking[prompt + "|"]

    llm, stop_words = _ScriptedLLM(script), len(STOP_THINKING.split())
    spec = SamplingSpec(max_new_tokens=64, thinking_budget=4, answer_max_new_tokens=8, n=2)
    never, closes, ends = generate_vllm(llm, ["never|", "closes|", "ends|"], spec)
    assert len(never) == len(closes) == len(ends) == 2
    assert never[0].text == " a a a a" + STOP_THINKING + " final"
    assert (never[0].budget_hit, never[0].thinking_tokens, never[0].tokens, never[0].finished) == (
        True, 4, 4 + stop_words + 2, True)
    assert closes[0].text == f" x y {THINK_END} final"
    assert (closes[0].budget_hit, closes[0].thinking_tokens, closes[0].tokens, closes[0].finished) == (False, 2, 5, True)
    assert ends[0].text == " q"
    assert (ends[0].budget_hit, ends[0].thinking_tokens, ends[0].tokens, ends[0].finished) == (False, 2, 2, True)
    plain = generate_vllm(llm, ["never|"], SamplingSpec(max_new_tokens=6))[0][0]
    assert (plain.text, plain.tokens, plain.finished, plain.budget_hit) == (" a a a a a a", 6, False, False)
