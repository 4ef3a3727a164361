from data_curation.schema import check_row
from data_curation.sources import load_rows
from toolkit.core.text import question_text
from toolkit.rewards import get_reward
from toolkit.rewards.format import is_well_formed


def test_rows_follow_the_schema_and_solutions_verify():
    rows = load_rows("synthetic_math", "train", 100, seed=3)
    accuracy = get_reward("accuracy_math")
    for row in rows:
        check_row(row, row["id"])
        assert is_well_formed(row["solution"])
    assert accuracy(completions=[r["solution"] for r in rows], answer=[r["answer"] for r in rows]) == [1.0] * 100
    assert {r["difficulty"] for r in rows} == {1, 2, 3, 4, 5}


def test_deterministic_by_seed():
    assert load_rows("synthetic_math", "train", 50, seed=7) == load_rows("synthetic_math", "train", 50, seed=7)
    assert load_rows("synthetic_math", "train", 50, seed=7) != load_rows("synthetic_math", "train", 50, seed=8)


def test_eval_split_never_overlaps_train_whatever_the_seeds():
    train = {question_text(r) for s in (0, 1, 2) for r in load_rows("synthetic_math", "train", 1500, seed=s)}
    held_out = {question_text(r) for s in (0, 5) for r in load_rows("synthetic_math", "eval", 200, seed=s)}
    assert len(held_out) > 300 and not train & held_out


def test_difficulty_selection():
    rows = load_rows("synthetic_math", "train", 30, params={"difficulties": [4]})
    assert {r["difficulty"] for r in rows} == {4}
    assert all(question_text(r).startswith("Solve for x") for r in rows)
