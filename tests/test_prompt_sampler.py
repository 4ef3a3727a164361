"""Prompt samplers: random passes, easy-to-hard curriculum, Kimi's prioritized sampling, and state
that survives a save/load so a resumed run draws what the uninterrupted one would have."""

from collections import Counter

import pytest

from stages.prompt_sampler import PromptSampler


def test_random_covers_every_prompt_once_per_pass():
    s = PromptSampler("random", 10, seed=3)
    first, second = s.next_batch(10), s.next_batch(10)
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert first != second  # a fresh shuffle each pass
    assert PromptSampler("random", 10, seed=3).next_batch(10) == first  # deterministic by seed


def test_batches_straddle_passes():
    s = PromptSampler("random", 5, seed=0)
    a, b = s.next_batch(3), s.next_batch(3)
    assert len(set(a + b[:2])) == 5 and s.passes == 2


def test_curriculum_goes_easy_to_hard_and_shuffles_ties():
    difficulty = [3, 1, 2, 1, 3, 2, 1]
    s = PromptSampler("curriculum", 7, seed=0, difficulty=difficulty)
    order = s.next_batch(7)
    assert [difficulty[i] for i in order] == [1, 1, 1, 2, 2, 3, 3]
    orders = {tuple(PromptSampler("curriculum", 7, seed=k, difficulty=difficulty).next_batch(3)) for k in range(20)}
    assert len(orders) > 1  # ties at the easy end come in different orders for different seeds
    with pytest.raises(ValueError, match="difficulty"):
        PromptSampler("curriculum", 7)


def test_a_curriculum_shorter_than_its_data_still_ends_on_the_hard_prompts():
    difficulty = [i % 50 for i in range(100)]  # 50 levels, two prompts each
    s = PromptSampler("curriculum", 100, seed=0, difficulty=difficulty)
    s.pace(10)  # the stage draws 10 prompts in all
    drawn = [difficulty[i] for i in s.next_batch(5) + s.next_batch(5)]
    # one prompt from each tenth of the easy-to-hard order: levels 0-4, then 5-9, ..., then 45-49
    assert [d // 5 for d in drawn] == list(range(10))
    assert [difficulty[i] for i in s.next_batch(4)] == [0, 0, 1, 1]  # past the stage's count: a full pass
    unpaced = PromptSampler("curriculum", 100, seed=0, difficulty=difficulty)
    assert max(difficulty[i] for i in unpaced.next_batch(10)) == 4  # the easiest tenth only
    enough = PromptSampler("curriculum", 100, seed=0, difficulty=difficulty)
    enough.pace(300)  # a stage that draws more than one pass: unchanged
    assert enough.next_batch(10) == PromptSampler("curriculum", 100, seed=0, difficulty=difficulty).next_batch(10)
    with pytest.raises(ValueError, match="before its first batch"):
        s.pace(10)


def test_prioritized_follows_one_minus_success():
    s = PromptSampler("prioritized", 3, seed=0)
    s.update([0] * 10, [1.0] * 10)        # solved: weight 0
    s.update([1] * 10, [1.0, 0.0] * 5)    # half solved: weight 0.5
    # prompt 2 unseen: weight 1
    counts = Counter(i for _ in range(3000) for i in s.next_batch(1))
    assert counts[0] == 0
    assert counts[2] / counts[1] == pytest.approx(2.0, rel=0.15)


def test_prioritized_without_replacement_inside_a_batch_and_uniform_when_all_solved():
    s = PromptSampler("prioritized", 6, seed=1)
    assert len(set(s.next_batch(6))) == 6
    s.update(list(range(6)), [1.0] * 6)
    assert len(s.next_batch(4)) == 4  # everything solved: falls back to uniform instead of failing


def test_unjudged_outcomes_are_not_counted():
    s = PromptSampler("prioritized", 2)
    s.update([0, 0, 1], [None, float("nan"), 0.25])
    assert s.attempts.tolist() == [0, 1] and s.success_rate().tolist() == [0.0, 0.25]


@pytest.mark.parametrize("kind, stage_prompts", [("random", None), ("curriculum", None), ("curriculum", 12),
                                                  ("prioritized", None)])
def test_state_round_trip_continues_the_same_schedule(kind, stage_prompts):
    difficulty = [i % 4 for i in range(20)]
    a = PromptSampler(kind, 20, seed=7, difficulty=difficulty)
    if stage_prompts:
        a.pace(stage_prompts)  # its first pass (12 prompts) ends inside the round trip's draws
    for _ in range(3):
        batch = a.next_batch(6)
        a.update(batch, [float(i % 3 == 0) for i in batch])
    import json
    state = json.loads(json.dumps(a.state_dict()))  # as it travels through the checkpoint file
    b = PromptSampler(kind, 20, seed=999, difficulty=difficulty)
    b.load_state_dict(state)
    for _ in range(4):
        batch = a.next_batch(6)
        assert b.next_batch(6) == batch
        outcome = [float(i % 2 == 0) for i in batch]
        a.update(batch, outcome)
        b.update(batch, outcome)


def test_a_checkpoint_from_before_pacing_keeps_the_stages_count():
    old = PromptSampler("curriculum", 20, seed=7, difficulty=[i % 4 for i in range(20)])
    old.next_batch(6)
    state = old.state_dict()
    del state["stage_prompts"], state["drawn"]  # as written before pacing existed
    resumed = PromptSampler("curriculum", 20, seed=7, difficulty=[i % 4 for i in range(20)])
    resumed.pace(12)
    resumed.load_state_dict(state)
    assert resumed.stage_prompts == 12 and resumed.next_batch(6) == old.next_batch(6)


def test_state_for_other_data_is_refused():
    state = PromptSampler("random", 5).state_dict()
    with pytest.raises(ValueError, match="data changed"):
        PromptSampler("random", 6).load_state_dict(state)
