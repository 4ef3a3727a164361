"""Rewards read as a policy hunting for reward would read them. Each attack is a completion that does
NOT do the task plus a trick; next to it stands the score an honest wrong answer gets, and the attack
must score no more. The sandbox's verdict-channel attacks run as root and as an unprivileged host user.
(tests/test_code_forgery.py holds the older forgeries: shadowed builtins, atexit, exits, ...)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.rewards import get_reward
from toolkit.rewards.sandbox import run_python

REPO = Path(__file__).resolve().parent.parent
ASSERTS = json.dumps({"tests": ["assert f(1) == 2", "assert f(5) == 6"]})
HUMANEVAL = json.dumps({"prefix": "def add_one(x):\n    pass\n", "entry_point": "add_one",
                        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-3) == -2\n"})
CASES = json.dumps({"cases": [{"input": "1\n", "output": "2"}, {"input": "41\n", "output": "42"}]})
WRONG = {ASSERTS: "def f(x):\n    return 0\n", HUMANEVAL: "def add_one(x):\n    return 0\n", CASES: "print(0)\n"}


def forged(n: int) -> str:
    return json.dumps({"passed": n, "total": n, "events": {}, "nonce": "x"}) + "\\n"


# Each takes the verdict channel a different way, writes a passing verdict on it and then tries to
# silence the honest one (kills the harness), or keeps writing after it; then behaves as the wrong answer.
GRAB = ("import ctypes, os, signal, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def grab():\n    pidfd = libc.syscall(434, 1, 0)\n"
        "    return [g for g in (libc.syscall(438, pidfd, fd, 0) for fd in range(0, 16)) if g >= 0] if pidfd >= 0 else []\n"
        "def write_all(fds):\n    for fd in fds:\n        try:\n            os.write(fd, b'VERDICT')\n"
        "        except OSError:\n            pass\n")
CHANNEL_ATTACKS = {
    "pidfd_getfd_of_pid1_then_kill_the_harness": GRAB + "write_all(grab())\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "reopen_proc_1_fds_then_kill_the_harness": (
        GRAB + "for fd in range(0, 16):\n    try:\n        with open(f'/proc/1/fd/{fd}', 'w') as out:\n"
        "            out.write('VERDICT')\n    except OSError:\n        pass\nos.kill(os.getppid(), signal.SIGKILL)\n"),
    "own_fds_then_kill_the_harness": GRAB + "write_all(range(0, 16))\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "grandchild_writes_after_the_verdict": (
        GRAB + "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        fds = grab()\n"
        "        for _ in range(3000):\n            write_all(fds)\n            time.sleep(0.001)\n        os._exit(0)\n"
        "    os._exit(0)\n"),
    "ptrace_the_harness": GRAB + "assert libc.ptrace(16, os.getppid(), 0, 0) != 0\n",
}


def completion(code: str) -> str:
    return f"<think>plan</think>\n```python\n{code}\n```"


def attack(spec: str, trick: str) -> str:
    return completion(trick.replace("VERDICT", forged(3)) + WRONG[spec])


@pytest.fixture(scope="module")
def code_reward():
    return get_reward("code_exec", timeout_s=4)


@pytest.mark.parametrize("spec", [ASSERTS, HUMANEVAL, CASES], ids=["asserts", "humaneval", "cases"])
@pytest.mark.parametrize("name", sorted(CHANNEL_ATTACKS))
def test_the_verdict_channel_cannot_be_reached(code_reward, name, spec):
    honest_wrong = code_reward(completions=[completion(WRONG[spec])], answer=[spec])[0]
    assert honest_wrong == 0.0
    assert code_reward(completions=[attack(spec, CHANNEL_ATTACKS[name])], answer=[spec]) == [honest_wrong]


AS_USER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from toolkit.rewards import get_reward
from tests.test_reward_attacks import ASSERTS, CASES, CHANNEL_ATTACKS, HUMANEVAL, attack
reward = get_reward("code_exec", timeout_s=4)
print(json.dumps({f"{name}/{i}": reward(completions=[attack(spec, trick)], answer=[spec])[0]
                  for name, trick in CHANNEL_ATTACKS.items() for i, spec in enumerate([ASSERTS, HUMANEVAL, CASES])}))
"""


def test_the_verdict_channel_cannot_be_reached_as_an_unprivileged_host_user(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the suite already runs as an unprivileged user: the test above is that half")
    if not all(os.stat(p).st_mode & 0o005 == 0o005 for p in (REPO, Path(sys.executable).resolve().parent)):
        pytest.skip("the repository or the interpreter is not readable by other users, so no other user can run it")
    tmp_path.chmod(0o777)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(["setpriv", "--reuid", "54321", "--regid", "54321", "--clear-groups", sys.executable, "-c",
                          AS_USER, str(REPO)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    scores = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(scores) == 3 * len(CHANNEL_ATTACKS) and set(scores.values()) == {0.0}, scores


# Exceptions from model code that would steer the tests' own control flow.
STEERING = json.dumps({"tests": ["assert all(map(f, [1, 2, 3]))", "assert not any(map(f, [-1, -2]))",
                                 "try:\n    assert f(4)\nexcept BaseException:\n    pass"]})


@pytest.mark.parametrize("exc", ["StopIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit",
                                 "type('Odd', (BaseException,), {})", "AssertionError"])
def test_an_exception_raised_by_model_code_fails_the_test(code_reward, exc):
    honest_wrong = code_reward(completions=[completion("def f(x):\n    return False")], answer=[STEERING])[0]
    raising = completion(f"def f(x):\n    raise {exc}()")
    assert honest_wrong == pytest.approx(2 / 3)  # the second test and the lax third pass an honest wrong answer
    assert code_reward(completions=[raising], answer=[STEERING]) == [0.0]
    assert code_reward(completions=[completion("def f(x):\n    return x > 0")], answer=[STEERING]) == [1.0]


def test_names_the_tests_need_come_from_the_tests_not_the_completion(code_reward):
    fraction = json.dumps({"tests": ["assert f(1) == Fraction(1, 2)"], "entry_point": "f"})
    forger = completion("Fraction = lambda a, b: 0\ndef f(x):\n    return 0")
    assert code_reward(completions=[forger], answer=[fraction]) == [None]  # a data error, whoever answers
    guessed = json.dumps({"tests": ["assert f(1) == inf", "assert f(2) == inf"]})  # no entry point, two candidates
    assert code_reward(completions=[completion("inf = 0\ndef f(x):\n    return 0")], answer=[guessed]) == [None]
    imported = json.dumps({"prefix": "from fractions import Fraction\n", "tests": ["assert f(1) == Fraction(1, 2)"]})
    assert code_reward(completions=[forger], answer=[imported]) == [0.0]
    honest = completion("from fractions import Fraction\ndef f(x):\n    return Fraction(x, 2)")
    assert code_reward(completions=[honest], answer=[imported]) == [0.0]  # a Fraction cannot cross: plain data only
    assert code_reward(completions=[completion("def f(x):\n    return 0.5")], answer=[imported]) == [1.0]


# The sandbox's limits hold for the sandbox as a whole.
def test_memory_is_limited_for_the_whole_sandbox_not_per_process():
    code = ("import os\ngot = 0\nfor _ in range(6):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
            "    if pid == 0:\n        try:\n            b = bytearray(400 << 20)\n            os._exit(7)\n"
            "        except MemoryError:\n            os._exit(0)\n"
            "    got += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7\n"
            "print(got)")
    result = run_python(code, timeout_s=10, memory_mb=1024)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) * 400 <= 1024  # 4 x 400 MB reached 1.6 GB when the limit was per process
    forks = run_python("import os\nn = 0\nfor _ in range(50):\n    try:\n        os.fork() or os._exit(0)\n"
                       "        n += 1\n    except OSError:\n        break\nprint(n)", timeout_s=10, max_procs=4)
    assert forks.returncode == 0 and int(forks.stdout) <= 50  # children exit at once, so slots are reused...
    held = run_python("import os, time\nn = 0\nfor _ in range(10):\n    try:\n        pid = os.fork()\n"
                      "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
                      "    n += 1\nprint(n)", timeout_s=10, max_procs=4)
    assert int(held.stdout) == 3  # ...but at most 4 at once, the first included


@pytest.mark.parametrize("path", ["/work/big", "/tmp/big", "/big", "/dev/shm/big", "/dev/big"])
def test_disk_is_limited_for_the_whole_sandbox(path):
    code = (f"import os\nwritten = 0\ntry:\n    for i in range(20):\n        with open('{path}' + str(i), 'wb') as f:\n"
            "            f.write(b'x' * (8 << 20))\n        written += 8\nexcept OSError:\n    pass\nprint(written)")
    result = run_python(code, timeout_s=10, tmpfs_mb=64)
    assert result.returncode == 0 and int(result.stdout) <= 64, (result.stdout, result.stderr)


def test_output_is_read_with_a_bounded_reader():
    result = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", timeout_s=10)
    assert result.output_overflow and result.returncode is None and not result.timed_out
    assert len(result.stdout) + len(result.stderr) <= (1 << 20) + (1 << 16)
    flood = completion("import sys\nsys.stderr.write('y' * (200 << 20))\n" + WRONG[ASSERTS])
    reward = get_reward("code_exec", timeout_s=4)
    assert reward(completions=[flood], answer=[ASSERTS]) == [0.0]
    io_flood = completion("print('2 ' * (50 << 20))")
    assert reward(completions=[io_flood], answer=[CASES]) == [0.0]


# Rewards a policy could max without doing the task. Each row: (reward, params, attack, honest wrong
# answer, gold / prompt column); the attack must score no more than the honest wrong answer.
NO_THINK = [{"role": "user", "content": "What is 3 + 4? /no_think"}]
THINK = [{"role": "user", "content": "What is 3 + 4?"}]
TEXT_ATTACKS = {
    "no_think_then_a_second_think_block": (
        "thinking_flag", {}, "<think>\n\n</think>\n\n<think>3 plus 4 is 7</think> 7", "<think>3 plus 4</think> 7", NO_THINK),
    # qwen3's eleventh demo run: the empty block, the working, a lone second `</think>`, the answer
    "no_think_then_working_and_a_lone_close": (
        "thinking_flag", {}, "<think>\n\n</think>\n\n3 + 4 = 7.\n\n</think>\n\n7", "<think>3 plus 4</think> 7", NO_THINK),
    "after_think_reads_past_a_lone_close": (
        "accuracy_math", {"after_think": True}, "<think>\n\n</think>\n\n3 + 4 = 7.\n\n</think>\n\n\\boxed{7}",
        "<think>so</think> \\boxed{8}", "7"),
    "after_think_reads_a_second_block": (
        "accuracy_math", {"after_think": True}, "<think>\n\n</think>\n\n<think>so</think> \\boxed{7}",
        "<think>so</think> \\boxed{8}", "7"),
    # qwen3's general RL on demo paid this in full: a thought that stopped without closing its block
    "think_block_left_open": ("thinking_flag", {}, "<think>\nThe answer is 7.", "7", THINK),
    "format_tags_out_of_order": ("format_tags", {}, "</think> 7 <think>", "no tags at all, 7", "7"),
    "format_tags_answer_inside_out": (
        "format_tags", {"answer_tags": True}, "</answer></think>7<answer><think>", "7", "7"),
    "cosine_length_boxed_in_the_thinking": (
        "cosine_length", {"answer_tags": True, "max_len": 200}, "<think>\\boxed{7}</think> <answer>8</answer>",
        "<think>abcdefghi</think> <answer>8</answer>", "7"),  # same length: the cosine pays for length
    "ifeval_lowercase_without_case": ("ifeval_constraints", {}, "中文回答", "This Has Capitals",
                                      json.dumps([{"type": "lowercase"}])),
    "ifeval_uppercase_without_case": ("ifeval_constraints", {}, "中文回答", "this has none",
                                      json.dumps([{"type": "uppercase"}])),
    "ifeval_keyword_inside_a_word": ("ifeval_constraints", {}, "we concatenate strings", "we join strings",
                                     json.dumps([{"type": "keywords", "words": ["cat"]}])),
    "ifeval_json_as_a_quoted_string": ("ifeval_constraints", {}, '"json"', "not json",
                                       json.dumps([{"type": "json"}])),
    "ifeval_forbidden_word_in_cyrillic": ("ifeval_constraints", {}, "I like t\u0435a", "I like tea",
                                          json.dumps([{"type": "forbidden_words", "words": ["tea"]}])),
    "ifeval_forbidden_word_zero_width": ("ifeval_constraints", {}, "I like te\u200ba", "I like tea",
                                         json.dumps([{"type": "forbidden_words", "words": ["tea"]}])),
    # qwen3's general RL on demo paid this in full and taught /no_think a stray `</think>` (RESULTS.md)
    "ifeval_checked_past_a_lone_close": (
        "ifeval_constraints", {}, "<think>\n\n</think>\n\n- a\n- b\n- c\n\n</think>\n\ni hope this helps.",
        "<think>\n\n</think>\n\n- a\n- b\n\ni hope this helps.",
        json.dumps([{"type": "bullets", "count": 3}, {"type": "ends_with", "text": "i hope this helps."}])),
    "ifeval_keyword_in_unclosed_thinking": ("ifeval_constraints", {}, "<think>tea, tea and tea", "<think>so</think> coffee",
                                            json.dumps([{"type": "keywords", "words": ["tea"]}])),
    "code_read_past_a_lone_close": (
        "code_exec", {"timeout_s": 4}, "<think>```python\ndef f(x):\n    return x + 1\n```</think> so </think> done",
        completion(WRONG[ASSERTS]), ASSERTS),
    "ifeval_language_hidden_in_code": (
        "ifeval_constraints", {}, "`we reason in English here and add much more text to fill the line` 好",
        "we reason in English here", json.dumps([{"type": "language", "language": "zh"}])),
}
ENGLISH = "first we add the two numbers and then we check the result carefully"
CHINESE = "我们先把两个数相加然后仔细检查结果"
HIDDEN = {  # English reasoning under a zh target, hidden where the counter did not look
    "inline_code": f"`{ENGLISH}` 好",
    "dollar_math": f"${ENGLISH}$ 好",
    "unclosed_fence": f"好\n```\n{ENGLISH}",
    "latex_commands": " ".join(f"\\{w}" for w in ENGLISH.split()) + " 好",
    "call_shaped": f"f({ENGLISH}) 好",
    "chained_short_spans": " ".join(f"`{a} {b}`" for a, b in zip(ENGLISH.split()[::2], ENGLISH.split()[1::2])) + " 好",
}


def judge(name: str, params: dict, text: str, column) -> float | None:
    reward = get_reward(name, **params)
    prompt = column if isinstance(column, list) else "q"
    return reward(prompts=[prompt], completions=[text], answer=[column if isinstance(column, str) else None])[0]


@pytest.mark.parametrize("case", sorted(TEXT_ATTACKS))
def test_text_rewards_pay_nothing_for_the_trick(case):
    name, params, trick, honest_wrong, column = TEXT_ATTACKS[case]
    honest = judge(name, params, honest_wrong, column)
    assert judge(name, params, trick, column) <= honest, (case, honest)


def test_a_think_block_left_open_earns_the_flag_only_where_the_token_limit_cut_it():
    flags = get_reward("thinking_flag", 8)  # a stage's max completion length of 8 tokens
    texts = ["<think>\nThe answer is 7.", "<think>\n3 plus 4 is 7, so", "<think>\n3 plus 4\n</think>\n\n7"]
    ids = [[1] * 5, [1] * 8, [1] * 6]  # stopped early, cut at the limit, closed
    assert flags(prompts=[THINK] * 3, completions=texts, completion_ids=ids) == [0.0, 1.0, 1.0]
    unknown_limit = get_reward("thinking_flag")
    assert unknown_limit(prompts=[THINK] * 3, completions=texts, completion_ids=ids) == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="max_len"):
        get_reward("thinking_flag", max_len=0)


@pytest.mark.parametrize("where", sorted(HIDDEN))
def test_reasoning_hidden_from_the_language_counter_counts(where):
    reward = get_reward("language_consistency", language="zh", thinking_only=False)
    assert reward(completions=[f"{ENGLISH} 好"]) == [pytest.approx(1 / 14)]  # English reasoning, in the open
    hidden = reward(completions=[HIDDEN[where]])[0]
    assert hidden is not None and hidden <= 0.2, (where, hidden)  # it was 1.0 (or None: nothing counted)
    if ENGLISH in HIDDEN[where]:  # and Chinese reasoning under an en target, hidden the same way
        reverse = get_reward("language_consistency", language="en", thinking_only=False)
        assert reverse(completions=[HIDDEN[where].replace(ENGLISH, CHINESE).replace("好", "ok")])[0] <= 0.2, where


def test_real_code_and_math_stay_neutral():
    reward = get_reward("language_consistency", language="zh", thinking_only=False)
    text = f"{CHINESE}，计算 $x^2 + 1 = 5$，用 `print(x)` 和 f(x)，得到 \\frac{{1}}{{2}}。"
    assert reward(completions=[text]) == [1.0]


def test_the_language_counter_is_linear():
    import time

    from toolkit.core.language import consistency

    for unit in ("\\(", "```", "$", "f(", "`"):
        started = time.perf_counter()
        consistency(unit * (80_000 // len(unit)), "en")
        assert time.perf_counter() - started < 2.0, unit  # it took ~10 s when quadratic


def test_an_unknown_constraint_is_refused_even_when_the_answer_cannot_be_read():
    reward = get_reward("ifeval_constraints")
    with pytest.raises(ValueError, match="unknown constraint types"):
        reward(completions=["<think>never closed"], answer=[json.dumps([{"type": "rhymes"}])])


def test_an_empty_constraint_list_is_unjudged_not_a_pass():
    reward = get_reward("ifeval_constraints")
    assert reward(completions=["anything"], answer=["[]"]) == [None]


def test_a_batch_of_adversarial_math_answers_costs_one_budget():
    reward = get_reward("accuracy_math", timeout_s=1.5, workers=2)  # its own pool: others count timeouts too
    tower = "\\boxed{2^{2^{2^{100}}}}"  # sympy works on it past any timeout
    honest = ["\\boxed{7}"] * 4
    scores = reward(completions=honest + [tower] * 4, answer=["7"] * 8)
    assert scores == [1.0] * 4 + [0.0] * 4
    # two workers, four towers: without the budget the batch waits two full timeouts; with it, about one
    assert reward.counters["budget_cuts"] >= 1 and reward.counters["timeouts"] >= 1
    assert reward(completions=["\\boxed{" + "9" * 100_000 + "}"], answer=["7"]) == [0.0]  # refused before sympy


# Validation refuses reward setups that can never be earned, naming the YAML path.
R1_ZERO = "stages.zero_rl.rewards=[{name: accuracy_math, params: {answer_tags: true}}, {name: format_think, params: " \
          "{answer_tags: true}}, %s]"
UNEARNABLE = {
    "accuracy_weight_zero": ("stages.zero_rl.rewards=[{name: accuracy_math, weight: 0, params: {answer_tags: true}}]",
                             r"stages\[0\]\.rewards\[0\]\.weight: reward accuracy_math .* would ignore"),
    "accuracy_weight_negative": ("stages.zero_rl.rewards=[{name: accuracy_math, weight: -1, params: {answer_tags: true}}]",
                                 r"stages\[0\]\.rewards\[0\]\.weight: .* would punish"),
    "start_step_past_max_steps": (R1_ZERO % "{name: repetition, start_step: 100000}",
                                  r"stages\[0\]\.rewards\[2\]\.start_step: .* never count"),
    "only_code_on_math_data": (R1_ZERO % "{name: repetition, only: [code]}",
                               r"stages\[0\]\.rewards\[2\]\.only: .* holds only \['math'\] rows"),
    "code_exec_on_math_data": (R1_ZERO % "{name: code_exec}", r"stages\[0\]\.rewards\[2\]\.name: reward code_exec judges"),
    "cosine_length_with_answer_tags": (R1_ZERO % "{name: cosine_length}",
                                       r"stages\[0\]\.rewards\[2\]\.params: reward cosine_length's correctness check"),
    "length_kimi_reads_elsewhere": (R1_ZERO % "{name: length_kimi, params: {answer_tags: true, after_think: true}}",
                                    r"stages\[0\]\.rewards\[2\]\.params: reward length_kimi judges correctness with"),
}


@pytest.mark.parametrize("case", sorted(UNEARNABLE))
def test_validation_refuses_rewards_that_cannot_be_earned(case):
    from pipeline.recipe import RecipeError, load_recipe

    override, message = UNEARNABLE[case]
    with pytest.raises(RecipeError, match=message):
        load_recipe("r1_zero", "tiny", [override])


def test_a_length_reward_that_reads_the_answer_where_accuracy_does_validates():
    from pipeline.recipe import load_recipe

    load_recipe("r1_zero", "tiny", [R1_ZERO % "{name: cosine_length, params: {answer_tags: true}}"])


def test_a_reward_models_answer_view_is_never_read_past_a_stray_close():
    from toolkit.rewards.model_scored import scoped

    # qwen3's demo reward model paid 0.145 more for this than for the answer alone (RESULTS.md)
    assert scoped("<think>\n\n</think>\n\nThe answer is 5.</think>\n\nThe answer is 5.", "answer") is None
    assert scoped("<think>\nplan</think>\n\nThe answer is 5.", "answer") == "The answer is 5."
    assert scoped("It is 5.", "answer") == "It is 5."  # no thinking tags: the whole text is the answer
    assert scoped("<think>\nplan, never closed", "answer") is None


def test_a_response_the_reward_model_cannot_read_scores_no_more_than_any_it_can(tmp_path, tiny_model):
    """A real (random-headed) reward model: an answer it cannot read gets min(0, the batch's lowest),
    so a broken layout never beats a scored answer, whichever sign the model's scores take."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=1)
    rm.config.pad_token_id = tokenizer.pad_token_id
    rm.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    reward = get_reward("reward_model", model=str(tmp_path / "rm"), scope="answer")
    readable = ["<think>a</think> It is 5.", "<think>b</think> It is 6, I think.", "The answer is 7."]
    unreadable = ["<think>a</think> It is 5.</think> It is 5.", "<think>never closed, 5"]
    values = reward(prompts=["q"] * 5, completions=readable + unreadable)
    assert values[3] == values[4] == min(0.0, *values[:3])
    assert reward.counters["unscored"] == 2


def test_a_reward_model_is_applied_with_the_scope_it_was_trained_on(tmp_path):
    from pipeline.recipe import RecipeError, load_recipe
    from stages.reward_model import scoped_pairs
    from toolkit.rewards.model_scored import SCOPE_FILE

    with pytest.raises(RecipeError, match=r"stages\[8\]\.rewards\[3\]\.params\.scope: reward_model applies "
                                          r"rm_helpful\.model to the 'answer' view"):
        load_recipe("r1", "tiny", ["stages.rm_helpful.scope=full"])
    thinking_only = {"id": "p", "chosen": "<think>short</think> 5", "rejected": "<think>long long</think> 5"}
    summary = {"id": "q", "chosen": "<think>a</think> The answer is 5.", "rejected": "<think>a</think> It is 6."}
    kept, dropped = scoped_pairs([thinking_only, summary], "answer")
    assert dropped == 1 and kept[0]["chosen"] == "The answer is 5."  # trained on what it will score
    assert scoped_pairs([thinking_only, summary], "full") == ([thinking_only, summary], 0)
    (tmp_path / SCOPE_FILE).write_text(json.dumps({"scope": "full"}))
    with pytest.raises(ValueError, match="trained on the 'full' view"):
        get_reward("reward_model", model=str(tmp_path), scope="answer")(prompts=["q"], completions=["x"])
