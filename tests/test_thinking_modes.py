"""Thinking modes without training: the Qwen3 layouts rendered byte for byte by every named model's
chat template, the last-flag rule, and the fusion set's construction."""

import pytest

from data_curation.fusion import build_fusion
from data_curation.sources import load_rows
from pipeline.models.builds import SMOLLM2_CHAT_TEMPLATE, build_tiny_tokenizer
from toolkit.core.thinking import (
    EMPTY_THINK,
    STOP_THINKING,
    flag_of,
    governing_mode,
    no_thinking_response,
    response_only,
    thinking_response,
)

# RECIPES.md, Qwen3 stage 3, verbatim.
THINKING = ("<|im_start|>user\n{query} /think<|im_end|>\n<|im_start|>assistant\n<think>\n{thinking}\n</think>\n\n"
            "{response}<|im_end|>")
NON_THINKING = "<|im_start|>user\n{query} /no_think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n{response}<|im_end|>"
SMOLLM2_SYSTEM_PREFIX = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def tokenizer(request):
    tok = build_tiny_tokenizer()
    if request.param == "smollm2":
        tok.chat_template = SMOLLM2_CHAT_TEMPLATE
    tok.prefix = SMOLLM2_SYSTEM_PREFIX if request.param == "smollm2" else ""
    return tok


def _render(tok, messages, **kw) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_stop_thinking_string_is_pinned():
    assert STOP_THINKING == ("\n\nConsidering the limited time by the user, I have to give the solution based on "
                             "the thinking directly now.\n</think>\n\n")


def test_both_layouts_render_byte_exactly(tokenizer):
    q, t, r = "What is 2 + 3?", "2 + 3 = 5.", "The answer is 5."
    think = [{"role": "user", "content": f"{q} /think"}, {"role": "assistant", "content": thinking_response(t, r)}]
    plain = [{"role": "user", "content": f"{q} /no_think"}, {"role": "assistant", "content": no_thinking_response(r)}]
    assert _render(tokenizer, think) == tokenizer.prefix + THINKING.format(query=q, thinking=t, response=r) + "\n"
    assert _render(tokenizer, plain) == tokenizer.prefix + NON_THINKING.format(query=q, response=r) + "\n"


def test_enable_thinking_false_ends_the_prompt_with_the_empty_block(tokenizer):
    messages = [{"role": "user", "content": "Hi!"}]
    thinking = _render(tokenizer, messages, add_generation_prompt=True)
    plain = _render(tokenizer, messages, add_generation_prompt=True, enable_thinking=False)
    assert thinking.endswith("<|im_start|>assistant\n") and plain == thinking + EMPTY_THINK


def test_history_keeps_only_the_response_of_earlier_turns(tokenizer):
    messages = [{"role": "user", "content": "Q1 /think"},
                {"role": "assistant", "content": thinking_response("secret reasoning", "R1")},
                {"role": "user", "content": "Q2 /no_think"},
                {"role": "assistant", "content": no_thinking_response("R2")}]
    full = _render(tokenizer, messages)
    assert "secret reasoning" not in full
    assert "<|im_start|>assistant\nR1<|im_end|>\n<|im_start|>user\nQ2 /no_think" in full
    assert full.endswith("<|im_start|>assistant\n" + EMPTY_THINK + "R2<|im_end|>\n")
    # the prompt is an exact prefix of the conversation: SFT masks it by length
    assert full.startswith(_render(tokenizer, messages[:3], add_generation_prompt=True))


def test_last_flag_governs():
    user = lambda c: {"role": "user", "content": c}
    assert governing_mode([user("hi")]) == "think"  # thinking is the default
    assert governing_mode([user("a /no_think")]) == "no_think"
    assert governing_mode([user("a /no_think"), {"role": "assistant", "content": "x"}, user("b /think")]) == "think"
    assert governing_mode([user("a /think"), {"role": "assistant", "content": "x"}, user("b /no_think")]) == "no_think"
    assert governing_mode([user("a /no_think"), {"role": "assistant", "content": "x"}, user("b")]) == "no_think"
    assert governing_mode([{"role": "system", "content": "Be brief. /no_think"}, user("b")]) == "no_think"
    assert governing_mode([{"role": "system", "content": "/no_think"}, user("b /think")]) == "think"
    # an assistant cannot switch the mode; a user's flag counts wherever it stands in the turn (users
    # type them anywhere; Qwen3's data only ever puts them last, so nothing it was trained on changes)
    assert governing_mode([user("a"), {"role": "assistant", "content": "/no_think"}, user("b")]) == "think"
    assert flag_of("what does /no_think mean?") == "no_think"


def test_response_only_drops_the_thinking():
    assert response_only(thinking_response("t", "R")) == "R"
    assert response_only(no_thinking_response("R")) == "R"
    assert response_only("plain answer") == "plain answer"


def test_fusion_rows_follow_the_layouts_and_the_last_flag_rule():
    thinking = load_rows("synthetic_math", "train", 120, 0, {})
    plain = load_rows("general_chat", "train", 40, 0, {}) + load_rows("synthetic_math", "train", 60, 1, {})
    broken = [{**thinking[0], "id": "no-think-block", "solution": "just an answer"}]
    rows, removed, comp = build_fusion(thinking + broken, plain, think_flag_share=0.5, system_flag_share=0.2,
                                       multi_turn_share=0.3, seed=0)
    assert [r["id"] for r in removed] == ["no-think-block"] and removed[0]["removed_reason"] == "no_thinking"
    assert comp["rows"] == len(rows) == 220 and comp["think"] == 120 and comp["no_think"] == 100
    for r in rows:
        assert governing_mode(r["prompt"]) == r["mode"]
        if r["mode"] == "no_think":
            assert r["solution"].startswith(EMPTY_THINK) and r["solution"][len(EMPTY_THINK):].strip()
            assert "<think>" not in r["solution"][len(EMPTY_THINK):]
        else:
            assert r["solution"].startswith("<think>\n") and "\n</think>\n\n" in r["solution"]
            assert not r["solution"].startswith(EMPTY_THINK)
        for m in r["prompt"]:
            if m["role"] == "assistant":
                assert "<think>" not in m["content"]  # history carries responses only
    multi = [r for r in rows if sum(m["role"] == "user" for m in r["prompt"]) > 1]
    assert len(multi) == comp["multi_turn"] and 0.2 < len(multi) / len(rows) < 0.4
    for r in multi:  # the earlier turn carries the opposite flag; the last one still wins
        first = flag_of(r["prompt"][0]["content"])
        assert first is not None and first != r["mode"]
    unflagged = [r for r in rows if all(flag_of(m["content"]) is None for m in r["prompt"])]
    assert unflagged and all(r["mode"] == "think" for r in unflagged) and len(unflagged) == comp["think_unflagged"]
    system = [r for r in rows if r["prompt"][0]["role"] == "system"]
    assert system and len(system) == comp["system_flag"]
    assert build_fusion(thinking + broken, plain, 0.5, 0.2, 0.3, seed=0)[0] == rows  # seeded


def test_cut_thought_rows_end_their_thinking_with_the_stop_string_and_train_only_the_answer():
    """cut_thinking_share (ours): each chosen thinking row comes back once more with its thinking cut
    after a word and closed by the stop-thinking string, as a budget leaves it, then the same response;
    the cut part is the row's no-loss prefix. Share 0 builds the report's rows, none of them cut. With
    cut_answer="working" the same rows and cuts, each cut row's answer the thought's equations left, then
    the response."""
    from data_curation.fusion import NO_LOSS_PREFIX
    from toolkit.core.text import split_thinking
    from toolkit.core.thinking import STOP_THINKING

    thinking = load_rows("synthetic_math", "train", 60, 0, {})
    plain = load_rows("general_chat", "train", 20, 0, {})
    plain_rows = build_fusion(thinking, plain, 0.5, 0.2, 0.3, seed=0)[0]
    assert not any(NO_LOSS_PREFIX in r for r in plain_rows)
    rows, _, comp = build_fusion(thinking, plain, 0.5, 0.2, 0.3, seed=0, cut_thinking_share=0.5)
    full = {r["id"]: r for r in plain_rows}
    cut = [r for r in rows if NO_LOSS_PREFIX in r]
    assert len(cut) == comp["think_cut"] and 15 < len(cut) < 45 and comp["think"] == 60 + len(cut)
    kept = {(r["id"], r["solution"]) for r in rows if NO_LOSS_PREFIX not in r}
    assert kept == {(r["id"], r["solution"]) for r in plain_rows}  # every row of the report's, as it was
    for r in cut:
        original = full[r["id"].replace("#cut#think", "#think")]
        prefix = r[NO_LOSS_PREFIX]
        assert r["mode"] == "think" and governing_mode(r["prompt"]) == "think"
        assert r["solution"].startswith(prefix) and prefix.endswith(STOP_THINKING) and prefix.startswith("<think>\n")
        thought = prefix[len("<think>\n"):-len(STOP_THINKING)]
        whole, response = split_thinking(original["solution"])
        assert thought and whole.startswith(thought) and len(thought) < len(whole)
        assert whole[len(thought)].isspace()  # cut between words
        assert r["solution"][len(prefix):] == response
    worked = build_fusion(thinking, plain, 0.5, 0.2, 0.3, seed=0, cut_thinking_share=0.5, cut_answer="working")[0]
    assert [r["solution"] for r in worked if NO_LOSS_PREFIX not in r] == [r["solution"] for r in rows
                                                                          if NO_LOSS_PREFIX not in r]
    assert [r[NO_LOSS_PREFIX] for r in worked if NO_LOSS_PREFIX in r] == [r[NO_LOSS_PREFIX] for r in cut]
    for r, plain_cut in zip([r for r in worked if NO_LOSS_PREFIX in r], cut, strict=True):
        answer, response = r["solution"][len(r[NO_LOSS_PREFIX]):], plain_cut["solution"][len(plain_cut[NO_LOSS_PREFIX]):]
        working, _, rest = answer.rpartition("\n\n")
        assert rest == response and working and all("=" in line for line in working.splitlines())
        whole = split_thinking(full[r["id"].replace("#cut#think", "#think")]["solution"])[0]
        assert whole.rstrip().endswith(working.splitlines()[-1])  # the thought's last equation, restated


def test_a_cut_answer_writes_out_the_equations_from_the_line_the_cut_fell_in():
    from data_curation.fusion import working_left

    thought = "Multiplication comes first.\nFirst, 2 * 11 = 22.\nThen 26 + 22 = 48."
    assert working_left(thought, thought.index("comes") + 5) == "First, 2 * 11 = 22.\nThen 26 + 22 = 48."
    assert working_left(thought, thought.index("11 =") + 2) == "First, 2 * 11 = 22.\nThen 26 + 22 = 48."
    assert working_left(thought, thought.index("Then") + 4) == "Then 26 + 22 = 48."
    assert working_left("A plan.\nCheck: 14 words.", 7) == ""  # no equation left: the response alone


def test_hard_switch_rows_are_unflagged_twins_of_no_think_rows_with_the_empty_block_untrained():
    """hard_switch_share (ours): each chosen non-thinking row comes back once more, single-turn and
    with no flag anywhere, its completion the /no_think twin's, the empty think block its no-loss
    prefix: the layout of `enable_thinking=False` (budget 0), which renders that block into the
    prompt. Share 0 builds the report's rows; with both shares, the cut rows are as without switches."""
    from data_curation.fusion import NO_LOSS_PREFIX
    from toolkit.core.thinking import EMPTY_THINK, flag_of

    thinking = load_rows("synthetic_math", "train", 60, 0, {})
    plain = load_rows("general_chat", "train", 20, 0, {}) + load_rows("synthetic_math", "train", 40, 1, {})
    report = build_fusion(thinking, plain, 0.5, 0.2, 0.3, seed=0)[0]
    assert build_fusion(thinking, plain, 0.5, 0.2, 0.3, seed=0, hard_switch_share=0.0)[0] == report
    rows, _, comp = build_fusion(thinking, plain, 0.5, 0.2, 0.3, seed=0, hard_switch_share=0.5)
    switched = [r for r in rows if "#switch" in r["id"]]
    assert len(switched) == comp["no_think_switch"] and 15 < len(switched) < 45
    assert comp["no_think"] == 60 + len(switched) and comp["think_unflagged"] == sum(  # switch rows not among them
        1 for r in rows if r["mode"] == "think" and not any(flag_of(m["content"]) for m in r["prompt"]))
    assert {(r["id"], r["solution"]) for r in rows if "#switch" not in r["id"]} == {(r["id"], r["solution"]) for r in report}
    twins, originals = {r["id"]: r for r in report}, {r["id"]: r for r in plain}
    for r in switched:
        twin = twins[r["id"].replace("#switch#no_think", "#no_think")]
        assert r["mode"] == "no_think" and r[NO_LOSS_PREFIX] == EMPTY_THINK
        assert [m["role"] for m in r["prompt"]] == ["user"] and not flag_of(r["prompt"][0]["content"])
        assert r["solution"] == twin["solution"] and r["solution"].startswith(EMPTY_THINK)
        asked = [m for m in originals[r["id"].split("#")[0]]["prompt"] if m["role"] != "system"]
        assert r["prompt"] == asked  # the question as it was, with no flag added
    both = build_fusion(thinking, plain, 0.5, 0.2, 0.3, seed=0, cut_thinking_share=0.5, hard_switch_share=0.5)[0]
    cut = build_fusion(thinking, plain, 0.5, 0.2, 0.3, seed=0, cut_thinking_share=0.5)[0]
    assert {r["id"]: r[NO_LOSS_PREFIX] for r in both if "#cut" in r["id"]} == {
        r["id"]: r[NO_LOSS_PREFIX] for r in cut if "#cut" in r["id"]}


def test_a_flag_is_recognised_anywhere_in_the_turn_and_the_last_one_wins():
    from toolkit.core.thinking import flag_of, governing_mode

    assert flag_of("/no_think what is 2+2?") == "no_think"
    assert flag_of("what is /think 2+2?") == "think"
    assert flag_of("/think first, then /no_think please") == "no_think"  # the last in the turn
    assert flag_of("what is 2+2? /no_think") == "no_think"  # Qwen3's own place, as before
    assert flag_of("use /thinking or a/think or /no_thinking") is None  # words of their own only
    assert governing_mode([{"role": "user", "content": "/no_think hi"}, {"role": "assistant", "content": "hello"},
                           {"role": "user", "content": "and now? /think"}]) == "think"


def test_distillation_keeps_teacher_traces_that_follow_their_flag_and_checks_answers_in_the_chosen_modes():
    """Off-policy distillation with `verify`: a trace that breaks its flag is never kept; answers are
    checked in `verify_modes` only (Qwen3 on demo checks /think's: its teacher's /no_think answers,
    mostly wrong, left the student 3 /no_think rows of 96 and it never learnt the flag)."""
    from stages.distill import DistillConfig, keeps_trace

    thought, empty = "<think>\n12 + 11 = 23.\n</think>\n\n\\boxed{23}", f"{EMPTY_THINK}\\boxed{{24}}"
    base = {"name": "distill", "student": "student", "teacher": "teacher", "data": {"source": "synthetic_math"},
            "thinking_modes": ["think", "no_think"]}
    every = DistillConfig(**base)
    think_only = DistillConfig(**base, verify_modes=["think"])
    assert keeps_trace(every, "think", thought, 1.0) and not keeps_trace(every, "think", thought, 0.0)
    assert not keeps_trace(every, "no_think", empty, 0.0) and keeps_trace(think_only, "no_think", empty, 0.0)
    assert not keeps_trace(think_only, "think", thought, 0.0)
    # the layout is checked in every mode: a thought under /no_think, an empty block under /think,
    # the empty block followed by a second one
    for cfg in (every, think_only):
        assert not keeps_trace(cfg, "no_think", thought, 1.0) and not keeps_trace(cfg, "think", empty, 1.0)
        assert not keeps_trace(cfg, "no_think", f"{EMPTY_THINK}23.\n</think>\n\n\\boxed{{23}}", 1.0)
    # unflagged prompts have no layout to follow; without verify everything is kept
    assert keeps_trace(DistillConfig(**{**base, "thinking_modes": ["default"]}), "default", "\\boxed{23}", 1.0)
    assert keeps_trace(DistillConfig(**base, verify=False), "no_think", thought, 0.0)
    # unchecked modes only beside a kept checked trace of the same prompt: q2's /think answer is
    # wrong, so its /no_think trace goes too; with every mode checked there is nothing to pair
    from stages.distill import select_traces
    traces = [("q1", "think", thought, True, 1.0), ("q1", "no_think", empty, True, 0.0),
              ("q2", "think", thought, True, 0.0), ("q2", "no_think", empty, True, 0.0),
              ("q3", "think", thought, False, 1.0), ("q3", "no_think", empty, True, 0.0)]
    assert select_traces(think_only, traces) == [0, 1]
    assert select_traces(every, traces) == [0]
    assert select_traces(DistillConfig(**base, verify_modes=[]), traces) == [0, 1, 2, 3, 5]  # layouts only
    with pytest.raises(ValueError, match="verify_modes"):
        DistillConfig(**{**base, "thinking_modes": ["think"]}, verify_modes=["no_think"])
