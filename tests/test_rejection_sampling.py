"""Rejection sampling's selection rules and SFT mixtures, on hand-written samples."""

import pytest

from data_curation.mixture import mix_rows
from data_curation.rejection import Sample, acceptance, select
from data_curation.schema import make_row
from toolkit.rewards.verifiers import score_rows

ROW = make_row(id="q1", question="What is 2 + 3?", answer="5", verifier="math", solution=None, source="s",
               difficulty=2)


def good(answer="5", pad="") -> str:
    return f"<think>\nAdd them{pad}: 2 + 3 = {answer}.\n</think>\n\nThe answer is \\boxed{{{answer}}}."


def scored(texts: list[str], finished: list[bool] | None = None) -> list[Sample]:
    """Samples scored by the real math verifier, as the stage scores them."""
    scores = score_rows([ROW] * len(texts), texts, after_think=True)
    finished = finished or [True] * len(texts)
    return [Sample(t, f, len(t.split()), s) for t, f, s in zip(texts, finished, scores)]


def reasons(removed):
    return sorted(r["removed_reason"] for r in removed)


def test_only_verified_finished_samples_are_kept():
    samples = scored([good(), good("6"), good(pad=" carefully"), "<think>\nstill thinking",
                      "The answer is \\boxed{5}.", good()], finished=[True, True, True, True, True, False])
    kept, removed = select(ROW, samples, "all_correct")
    assert [k["solution"] for k in kept] == [good(), good(pad=" carefully")]
    # no think block: after_think scoring finds no answer region, so it is wrong before it is thinkless
    assert reasons(removed) == ["truncated", "truncated", "wrong", "wrong"]
    assert len(kept) + len(removed) == len(samples)  # every sample lands in exactly one place
    assert all(k["id"].startswith("q1#rs") and k["sample"]["score"] == 1.0 for k in kept)
    truncated = [r["evidence"]["why"] for r in removed if r["removed_reason"] == "truncated"]
    assert sorted(truncated) == ["no end of turn", "thinking never closed"]


def test_require_thinking_when_answers_are_read_anywhere():
    bare = "The answer is \\boxed{5}."
    score = score_rows([ROW], [bare])  # without after_think the bare answer verifies
    assert score == [1.0]
    kept, removed = select(ROW, [Sample(bare, True, 5, 1.0)], "all_correct")
    assert not kept and reasons(removed) == ["no_thinking"]
    assert len(select(ROW, [Sample(bare, True, 5, 1.0)], "all_correct", require_thinking=False)[0]) == 1


def test_an_answer_only_inside_the_thinking_is_wrong():
    sneaky = "<think>\nThe answer is \\boxed{5}.\n</think>\n\nI am not sure."
    kept, removed = select(ROW, scored([sneaky]), "all_correct")
    assert not kept and reasons(removed) == ["wrong"]


def test_shortest_correct_keeps_the_shortest():
    samples = scored([good(pad=" and that is all there is to it"), good(), good(pad=" slowly"), good("4")])
    kept, removed = select(ROW, samples, "shortest_correct")
    assert [k["solution"] for k in kept] == [good()]
    assert reasons(removed) == ["not_selected", "not_selected", "wrong"]
    kept2, _ = select(ROW, samples, "shortest_correct", max_per_prompt=2)
    assert [k["solution"] for k in kept2] == [good(), good(pad=" slowly")]


def test_first_correct_and_max_per_prompt():
    samples = scored([good("7"), good(pad=" a"), good(pad=" b"), good(pad=" c")])
    assert [k["sample"]["index"] for k in select(ROW, samples, "first_correct")[0]] == [1]
    assert [k["sample"]["index"] for k in select(ROW, samples, "all_correct", max_per_prompt=2)[0]] == [1, 2]
    assert len(select(ROW, samples, "all_correct")[0]) == 3


def test_readability_filters_by_name():
    mixed = "<think>\n加法 2 + 3 = 5 这是 答案 很 简单 的 计算\n</think>\n\nThe answer is \\boxed{5}."
    disagree = "<think>\n2 + 3 = 6\n</think>\n\nThe answer is \\boxed{5}."
    samples = scored([mixed, disagree, good()])
    kept, removed = select(ROW, samples, "all_correct", rules=["mixed_language", "answer_disagrees"])
    assert len(kept) == 1 and reasons(removed) == ["filtered:answer_disagrees", "filtered:mixed_language"]
    assert len(select(ROW, samples, "all_correct", rules=[])[0]) == 3  # no filters named, none applied


def test_unjudgeable_rows_are_never_kept():
    chat = make_row(id="c", question="Hi", answer=None, verifier="none", solution="Hello", source="general_chat")
    score = score_rows([chat], [good()])
    kept, removed = select(chat, [Sample(good(), True, 5, score[0])], "all_correct")
    assert not kept and reasons(removed) == ["unjudgeable"]


def test_unknown_selection_is_refused():
    with pytest.raises(ValueError, match="shortest_correct"):
        select(ROW, [], "longest")


def test_acceptance_per_source_and_difficulty():
    rows = [ROW, {**ROW, "id": "q2", "difficulty": 3}, {**ROW, "id": "q3", "source": "t", "difficulty": 3}]
    kept = [{"id": "q1#rs0"}, {"id": "q1#rs2"}, {"id": "q3#rs1"}]
    report = acceptance(rows, kept, samples_per_prompt=4)
    assert report["by_source"]["s"] == {"prompts": 2, "samples": 8, "kept": 2, "acceptance": 0.25,
                                        "prompts_with_kept": 1}
    assert report["by_difficulty"]["3"]["kept"] == 1 and report["by_difficulty"]["2"]["acceptance"] == 0.5


def test_mixture_uses_counts_and_weights():
    a = [{"id": f"a{i}"} for i in range(10)]
    b = [{"id": f"b{i}"} for i in range(4)]
    rows, comp = mix_rows([("a", a, 6, None), ("b", b, None, 2.0)], seed=1)
    assert [c["used"] for c in comp] == [6, 8] and len(rows) == 14
    assert len({r["id"] for r in rows if r["id"].startswith("a")}) == 6  # no repeats below the part's size
    assert sorted(r["id"] for r in rows if r["id"].startswith("b")) == sorted([r["id"] for r in b] * 2)
    assert comp[0]["share"] == pytest.approx(6 / 14)
    assert mix_rows([("a", a, 6, None), ("b", b, None, 2.0)], seed=1)[0] == rows
    with pytest.raises(ValueError, match="'empty' has no rows"):
        mix_rows([("empty", [], None, None)])


def test_mixture_ratios_are_shares_of_the_whole():
    """R1's 3:1 reasoning:general: with weights the realised ratio followed the parts' sizes (21.8:1
    at demo sizes); with ratios it is 3:1 whatever the sizes, and no part repeats a row."""
    from stages.sft import SFTConfig

    reasoning = [{"id": f"r{i}"} for i in range(300)]
    general = [{"id": f"g{i}"} for i in range(47)]
    rows, comp = mix_rows([("reasoning", reasoning, None, None, 3), ("general", general, None, None, 1)])
    assert [c["used"] for c in comp] == [141, 47] and comp[0]["share"] == pytest.approx(0.75)
    assert len({r["id"] for r in rows}) == len(rows)  # nothing repeated
    few = [{"id": f"f{i}"} for i in range(12)]
    assert [c["used"] for c in mix_rows([("few", few, None, None, 3), ("general", general, None, None, 1)])[1]] == [12, 4]
    with pytest.raises(ValueError, match="give every part a `ratio`, or none"):
        SFTConfig(name="s", model="m", mix=[{"data": "a.dataset", "ratio": 3}, {"data": "general_chat"}])
    with pytest.raises(ValueError, match="one of count, weight and ratio"):
        SFTConfig(name="s", model="m", mix=[{"data": "a.dataset", "ratio": 3, "weight": 1.0}])


def test_sft_on_a_mixture_logs_the_composition_it_used(tmp_path, tiny_model):
    import json

    from stages import sft
    from stages.runtime import StageContext

    cfg = sft.SFTConfig(name="mixed", model=str(tiny_model), max_steps=2, per_device_batch_size=4, max_length=96,
                        save_steps=2, mix=[{"data": {"source": "synthetic_math", "n": 12}, "count": 20},
                                           {"data": {"source": "general_chat", "n": 10}, "weight": 0.5}])
    inputs = {"model": str(tiny_model), **{k: v.model_dump() for k, v in cfg.data_inputs().items()}}
    out = sft.run(cfg, StageContext.local(tmp_path, inputs, kind="sft"))
    composition = json.loads((tmp_path / "mixture.json").read_text())
    assert [(c["part"], c["available"], c["used"]) for c in composition] == [("synthetic_math", 12, 20),
                                                                           ("general_chat", 10, 5)]
    assert out.metrics["train/rows"] == 25 and out.metrics["mix/1/rows"] == 5
    assert "mixture.json" in out.artifacts and (tmp_path / "model" / "model.safetensors").exists()
