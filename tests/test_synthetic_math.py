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


def test_rechecks_lengthen_the_thinking_and_keep_questions_answers_and_verdicts():
    from toolkit.core.text import split_thinking

    plain = load_rows("synthetic_math", "train", 40, seed=2, params={"difficulties": [1, 3]})
    long = load_rows("synthetic_math", "train", 40, seed=2, params={"difficulties": [1, 3], "rechecks": 2})
    accuracy = get_reward("accuracy_math")
    assert [question_text(r) for r in long] == [question_text(r) for r in plain]
    assert accuracy(completions=[r["solution"] for r in long], answer=[r["answer"] for r in long]) == [1.0] * 40
    for short_row, long_row in zip(plain, long):
        thinking, answer = split_thinking(long_row["solution"])
        short_thinking, short_answer = split_thinking(short_row["solution"])
        assert answer == short_answer and is_well_formed(long_row["solution"])
        assert thinking == "\n".join([short_thinking] + ["Let me check that again.\n" + short_thinking] * 2)
    spread = load_rows("synthetic_math", "train", 40, seed=2, params={"difficulties": [1, 3], "rechecks": [0, 3]})
    assert [question_text(r) for r in spread] == [question_text(r) for r in plain]
    counts = [r["solution"].count("Let me check that again.") for r in spread]
    assert set(counts) == {0, 1, 2, 3}  # each row draws its own count: a long thinker of varied length
    assert counts == [r["solution"].count("Let me check that again.") for r in
                      load_rows("synthetic_math", "train", 40, seed=2, params={"difficulties": [1, 3], "rechecks": [0, 3]})]


def test_bad_parameter_values_are_refused_before_any_row_is_read():
    import pytest

    from data_curation.sources import check_data_spec

    assert check_data_spec("synthetic_math", {"difficulties": [1, 3], "rechecks": 2}) == []
    assert check_data_spec("synthetic_math", {"rechecks": [1, 3]}) == []
    for params, field in (({"rechecks": -1}, "rechecks"), ({"rechecks": "2"}, "rechecks"),
                          ({"rechecks": [3, 1]}, "rechecks"), ({"rechecks": [0, 9]}, "rechecks"),
                          ({"difficulties": [6]}, "difficulties"), ({"difficulties": 3}, "difficulties"),
                          ({"difficulties": [{"a": 1}]}, "difficulties")):
        (path, message), = check_data_spec("synthetic_math", params)
        assert path == ("params", field) and field in message
        with pytest.raises(ValueError, match=field):
            load_rows("synthetic_math", "train", 2, params=params)


def test_the_reworded_held_out_set_shares_no_wording_with_synthetic_math():
    """math_reworded asks the same kinds of problem in phrasings synthetic_math never uses: no
    question opens with the same three words as any synthetic_math question, train or eval."""
    import pytest

    reworded = load_rows("math_reworded", "eval", 200)
    assert len({question_text(r) for r in reworded}) == 200 and {r["difficulty"] for r in reworded} == {1, 2, 3, 4, 5}
    for row in reworded:
        check_row(row, row["id"])
    assert load_rows("math_reworded", "all", 200) == reworded == load_rows("math_reworded", "eval", 200)
    openings = {tuple(question_text(r).split()[:3]) for split in ("train", "eval") for s in (0, 1)
                for r in load_rows("synthetic_math", split, 1500, seed=s)}
    assert not [q for r in reworded if tuple((q := question_text(r)).split()[:3]) in openings]
    accuracy = get_reward("accuracy_math")
    assert accuracy(completions=[f"The answer is \\boxed{{{r['answer']}}}." for r in reworded],
                    answer=[r["answer"] for r in reworded]) == [1.0] * 200
    with pytest.raises(ValueError, match="held-out only"):
        load_rows("math_reworded", "train", 10)
    from data_curation.sources import check_data_spec  # and a recipe that trains on it is refused at validation

    assert check_data_spec("math_reworded", {}, "train") == [
        (("split",), "math_reworded has no 'train' split (it has eval, all): it is held-out only")]
    assert check_data_spec("math_reworded", {}, "eval") == []
