"""Generation engines behind the one rollout interface: CTranslate2, ONNX Runtime GenAI and OpenVINO at
float32 give HF's greedy outputs token for token, sampling draws n reproducible completions from the
whole distribution, precision is refused where an engine cannot run it, `auto` says what it chose,
and a profile sets the engine for every stage and the evaluation. Conversions into the engines'
formats: tests/test_engine_conversions.py."""

import pytest

from pipeline.recipe import RecipeError, load_recipe
from toolkit.rollouts import SamplingSpec, engine_problems, open_engine, resolve_engine
from toolkit.rollouts.engines import AUTO_ORT_MIN_BYTES, drain_opened


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
    counted as thinking; one that ends its turn inside the thinking is finished. The ids are every
    token spent, the inserted string's and the end token included, as the token-level engines give
    them (evaluation's lengths and length rewards read them)."""
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
    assert never[0].ids == ["a"] * 4 + STOP_THINKING.split() + ["final", eos]
    assert closes[0].text == f" x y {THINK_END} final"
    assert (closes[0].budget_hit, closes[0].thinking_tokens, closes[0].tokens, closes[0].finished) == (False, 2, 5, True)
    assert closes[0].ids == ["x", "y", THINK_END, "final", eos]
    assert ends[0].text == " q"
    assert (ends[0].budget_hit, ends[0].thinking_tokens, ends[0].tokens, ends[0].finished) == (False, 2, 2, True)
    assert ends[0].ids == ["q", eos]
    plain = generate_vllm(llm, ["never|"], SamplingSpec(max_new_tokens=6))[0][0]
    assert (plain.text, plain.ids, plain.finished, plain.budget_hit) == (" a a a a a a", ["a"] * 6, False, False)


def test_hf_decodes_few_rows_weight_major_with_the_same_greedy_outputs(tiny_model, prompts, monkeypatch):
    """toolkit.rollouts.cpu_decode: float32 linears of at most 64 rows without gradients run as
    (W @ x.T).T, everything else as torch runs it; HF's greedy outputs are the same both ways."""
    import contextlib

    import torch
    import torch.nn.functional as F

    import toolkit.rollouts.hf
    from toolkit.rollouts.cpu_decode import weight_major_linear

    w, b = torch.randn(48, 32), torch.randn(48)
    few, many = torch.randn(4, 1, 32), torch.randn(5, 13, 32)  # 4 rows (a decode step), 65 (a prefill)
    torch_many, torch_bf16 = F.linear(many, w, b), F.linear(few.bfloat16(), w.bfloat16())
    with weight_major_linear() as mode:
        with torch.no_grad():
            assert torch.equal(F.linear(few, w, b), (w @ few[:, 0].t()).t()[:, None] + b)
            assert torch.equal(F.linear(many, w, b), torch_many)
            assert torch.equal(F.linear(few.bfloat16(), w.bfloat16()), torch_bf16)
        assert F.linear(few, w.requires_grad_()).requires_grad  # training: torch's own linear, with its graph
    assert mode.served == 1

    modes = []

    def counted():
        modes.append(weight_major_linear())
        return modes[-1]

    spec = SamplingSpec(max_new_tokens=24, batch_size=8)
    monkeypatch.setattr(toolkit.rollouts.hf, "weight_major_linear", counted)
    weight_major = open_engine(str(tiny_model), "hf").complete(prompts, spec)
    assert modes and all(m.served > 0 for m in modes)
    monkeypatch.setattr(toolkit.rollouts.hf, "weight_major_linear", contextlib.nullcontext)
    plain = open_engine(str(tiny_model), "hf").complete(prompts, spec)
    assert [(a[0].text, a[0].tokens) for a in weight_major] == [(a[0].text, a[0].tokens) for a in plain]
