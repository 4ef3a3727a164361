"""Preference pairs, model merging and the tokenizer check of distillation, without training."""

import json

import pytest
import torch

from data_curation.preferences import load_pairs, pairs_from_samples
from data_curation.rejection import Sample
from data_curation.schema import make_row
from data_curation.sources.files import BadRow
from stages.merge import MergeConfig, merge_tensors
from stages.preference_pairs import corrupted_pairs, padded_pairs
from toolkit.rewards.verifiers import score_rows

ROW = make_row(id="q", question="What is 2 + 3?", answer="5", verifier="math", solution=None, source="s")


def answer(value: str, pad: str = "") -> str:
    return f"<think>\n2 + 3 = {value}{pad}\n</think>\n\nThe answer is \\boxed{{{value}}}."


def samples(texts, tokens) -> list[Sample]:
    scores = score_rows([ROW] * len(texts), texts, after_think=True)
    return [Sample(t, True, n, s) for t, n, s in zip(texts, tokens, scores)]


def test_quality_pairs_put_correct_over_wrong():
    pairs = pairs_from_samples(ROW, samples([answer("5"), answer("6"), answer("5", " ok"), answer("7")],
                                            [10, 10, 12, 10]), "quality")
    assert len(pairs) == 4 and all("\\boxed{5}" in p["chosen"] and "\\boxed{5}" not in p["rejected"] for p in pairs)
    assert {p["reason"] for p in pairs} == {"correct vs wrong"}


def test_long2short_pairs_follow_kimi():
    texts = [answer("5", " long" * 20), answer("5"), answer("5", " a bit"), answer("9"), answer("9", " hmm"),
             answer("8", "!")]
    pairs = pairs_from_samples(ROW, samples(texts, [30, 10, 14, 10, 12, 8]), "long2short", length_ratio=1.5)
    assert all(p["chosen"] == answer("5") for p in pairs)  # the shortest correct answer
    # negatives: correct and >= 1.5x longer, or wrong and longer; not 14 < 1.5 * 10, not the wrong
    # answers as short (10) or shorter (8) than the chosen one, which would teach length backwards
    assert sorted(p["rejected"] for p in pairs) == sorted([texts[0], texts[4]])
    assert {p["reason"] for p in pairs} == {"shortest correct vs 3.0x longer", "shortest correct vs longer wrong"}
    assert not pairs_from_samples(ROW, samples([answer("8")], [5]), "long2short")  # nothing correct, no pairs


def test_synthetic_pairs():
    row = make_row(id="r", question="What is 38 + 44?", answer="82", verifier="math",
                   solution="<think>\n38 + 44 = 82.\n</think>\n\nThe answer is \\boxed{82}.", source="s")
    (bad,) = corrupted_pairs([row])
    assert bad["chosen"] == row["solution"] and "\\boxed{82}" not in bad["rejected"]
    assert score_rows([row, row], [bad["chosen"], bad["rejected"]]) == [1.0, 0.0]
    (padded,) = padded_pairs([row], padding=2)
    assert padded["rejected"].count("Let me check that again.") == 2 and padded["rejected"].endswith("\\boxed{82}.")
    assert len(padded["rejected"]) > 2 * len(padded["chosen"])


def test_local_preference_files_name_bad_rows(tmp_path):
    good = {"question": "Hi", "better": "Hello!", "worse": "go away"}
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "worse": "Hello!"}) + "\n")
    columns = {"prompt": "question", "chosen": "better", "rejected": "worse"}
    with pytest.raises(BadRow, match=r"prefs.jsonl:2: chosen and rejected are the same"):
        load_pairs(str(path), columns)
    path.write_text(json.dumps(good) + "\n{oops\n")
    with pytest.raises(BadRow, match=r"prefs.jsonl:2: malformed row"):
        load_pairs(str(path), columns)
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "Hi"}],
                                "chosen": [{"role": "assistant", "content": "Hello!"}], "rejected": "no"}) + "\n")
    (pair,) = load_pairs(str(path))
    assert pair["prompt"][-1]["content"] == "Hi" and pair["chosen"] == "Hello!"


def test_linear_slerp_and_ties_merges():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert torch.allclose(merge_tensors([a, b], "linear", [3.0, 1.0]), torch.tensor([0.75, 0.25]))
    mid = merge_tensors([a, b], "slerp", [1, 1], t=0.5)
    assert torch.allclose(mid, torch.tensor([2 ** -0.5, 2 ** -0.5]), atol=1e-6)  # stays on the unit circle
    assert torch.allclose(merge_tensors([a, a * 2], "slerp", [1, 1], t=0.5), a * 1.5)  # parallel: lerp
    base = torch.zeros(4)
    x, y = torch.tensor([1.0, -1.5, 0.1, 2.0]), torch.tensor([3.0, 1.0, -0.1, 2.0])
    ties = merge_tensors([x, y], "ties", [1.0, 1.0], base=base, density=0.5)
    # trimmed to the top half: x -> [0, -1.5, 0, 2], y -> [3, 0, 0, 2]; signs elected by mass; agreeing
    # values averaged (zeros do not vote)
    assert torch.allclose(ties, torch.tensor([3.0, -1.5, 0.0, 2.0]))
    assert torch.allclose(merge_tensors([x, y], "ties", [1.0, 1.0], base=base + 1, density=1.0, scale=0.5),
                          1 + 0.5 * torch.tensor([2.0, -2.5, -1.0, 1.0]))


def test_merge_config_rules():
    with pytest.raises(ValueError, match="slerp merges exactly two"):
        MergeConfig(name="m", models=["a", "b", "c"], method="slerp")
    with pytest.raises(ValueError, match="ties needs `base`"):
        MergeConfig(name="m", models=["a", "b"], method="ties")
    with pytest.raises(ValueError, match="2 weights for 3 models"):
        MergeConfig(name="m", models=["a", "b", "c"], weights=[1, 1])
    assert MergeConfig(name="m", models=["x.model", "y"]).model_inputs() == {"models.0": "x.model", "models.1": "y"}
