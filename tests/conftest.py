"""Test set-up: every test session (every xdist worker) gets its own POSTTRAIN_HOME (and so its own
Prefect home, MLflow store and model cache) before Prefect or MLflow is imported.

`make test` runs two xdist workers (`-n 2 --dist loadgroup --no-loadscope-reorder`; `make test
TEST_WORKERS=0` runs one process), each with an explicit budget of half the cores; tests stay
together by file (their module fixtures run once), heaviest files first so the workers finish
together. Far from 2x: the suite is mostly CPU-bound (each test runs ~1.6x as long beside the other
worker), and every timing check runs on half a machine. Measured (benchmarks/RESULTS.md, "Warm
workers"): serial 28:35, two workers 21:41-24:21 in four green runs, on one idle 2-core machine; CI
took 32:09 serially, over the guide's 30 minutes, so two workers are the default."""

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# Idempotent: test modules import helpers from here, which must not make a second home. Keyed by
# xdist worker: workers inherit the environment of the process that started them.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_HOME_VAR = "POSTTRAIN_TEST_HOME" + (f"_{_WORKER}" if _WORKER else "")
_HOME_MADE_HERE = not os.environ.get(_HOME_VAR)  # a home the caller named is the caller's to keep
_HOME = Path(os.environ.get(_HOME_VAR) or tempfile.mkdtemp(prefix=f"posttrain-tests-{_WORKER}"))
os.environ[_HOME_VAR] = str(_HOME)
if _WORKER:  # the cores split between the workers; stage workers and engines inherit the budget
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = str(_threads)

from pipeline.store.home import configure_environment, home_settings  # noqa: E402

# Set, not defaulted: an xdist worker inherits the controller's values, which would point it at the
# controller's home (its Prefect results, the stage cache, too).
os.environ.update(POSTTRAIN_HOME=str(_HOME), **home_settings(_HOME))

configure_environment()
REPO = Path(__file__).resolve().parent.parent
POSTTRAIN = str(Path(sys.executable).parent / "posttrain")


# Test files by their measured time, heaviest first (make test, 2026-12-02); the rest follow in
# their usual order. Files that share a session fixture run on one worker: the browser test
# launches qwen3 on top of test_named_recipes' run.
HEAVIEST_FILES = ["test_named_recipes", "test_crash_and_concurrency", "test_launcher", "test_rlhf_smoke",
                  "test_fusion_smoke", "test_curation", "test_multi_node", "test_hostile_input",
                  "test_mlflow_outputs", "test_grpo_stage", "test_resume_kinds", "test_work_pools", "test_pipeline_e2e"]
SAME_WORKER = {"test_ui_browser": "test_named_recipes"}


# What a suite writes at its peak: 4.5 GB above the disk's use before it (make test, 2026-12-06, df
# every 5 s), mostly stage outputs in the homes and the killed-upload test's 300 MB file, sent twice
# to an MLflow server. A full disk shows up far from its cause (CI once failed on an MLflow server's
# "too many 500 error responses" with 4.6 GB free), so the suite refuses to start without this much.
SUITE_DISK_BYTES = 6 << 30


def pytest_configure(config):
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free
    if not _WORKER and free < SUITE_DISK_BYTES:
        if _HOME_MADE_HERE:
            shutil.rmtree(_HOME, ignore_errors=True)
        pytest.exit(f"the test suite writes about 5 GB under {tmp} and needs {SUITE_DISK_BYTES >> 30} GiB free "
                    f"there; {free / 2**30:.1f} GiB are (old posttrain homes and pytest-of-* folders are the "
                    f"usual culprits)", returncode=4)


def pytest_sessionfinish(session, exitstatus):
    """The home this process made goes when its tests pass (a suite's homes came to 3 GB, and a dev
    machine that runs the suite often filled its disk with them); after a failure it stays, to read."""
    if _HOME_MADE_HERE and exitstatus == 0:
        shutil.rmtree(_HOME, ignore_errors=True)
    elif _HOME_MADE_HERE and _HOME.exists():
        print(f"\nposttrain test home kept for inspection: {_HOME}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if not getattr(config.option, "loadgroup", False):  # what an xdist worker of `--dist loadgroup` is told
        return

    def group(item) -> str:
        name = Path(str(item.fspath)).stem
        return SAME_WORKER.get(name, name)

    # What `--dist loadgroup` schedules by is the "@group" suffix of a test's id. pytest-xdist 3.8
    # writes it into `item._nodeid`, which pytest 9.2 no longer reads (`nodeid` is `str(item._id)`),
    # so without our own suffix every test was its own unit and a file's tests spread over both workers.
    from _pytest.nodeid import coerce_node_id

    rank = {name: i for i, name in enumerate(HEAVIEST_FILES)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
        item._id = coerce_node_id(f"{item.nodeid}@{group(item)}")
    items.sort(key=lambda item: rank.get(group(item), len(rank)))  # stable: a file's own order is kept


@pytest.fixture(scope="module")
def prompts():
    """24 held-out math prompts as chat messages: what the engine tests generate from."""
    from data_curation.sources import load_rows
    from toolkit.core.templates import render_prompt

    return [render_prompt("chat", r) for r in load_rows("synthetic_math", "eval", 24, 0, {})]


@pytest.fixture(scope="session")
def home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def tiny_model(home) -> Path:
    from pipeline.models.named import ensure_named_model
    return ensure_named_model("tiny-qwen3")


def in_process(recipe: str) -> list[str]:
    """Overrides that run `recipe`'s one-process stages in the flow's process (launcher mode
    `inprocess`). A worker process spends ~15 s importing torch, transformers and TRL before a
    tiny model's first step; the suite's named recipes run ~50 such stages. DeepSpeed stages keep
    their ranks. Worker processes themselves are tested by the smoke runs, crash and launcher tests;
    the cache key is the same either way, so a later subprocess launch finds these outputs."""
    from pipeline.recipe import load_recipe

    stages = load_recipe(recipe, "tiny").recipe.stages
    return [f"stages.{s.name}.launcher.mode=inprocess" for s in stages if s.launcher.mode == "subprocess"]


def run_named_recipe(name: str) -> dict:
    """One recipe on `tiny` through the real flow, in this process (under prefect_harness)."""
    from pipeline.flow import run_recipe

    result = run_recipe(name, "tiny", in_process(name))
    assert result["status"] == "completed", result
    return result


def padded_pairs_file(path: Path, n: int, seed: int) -> str:
    """Long2short-style pairs from `n` level-1 `synthetic_math` rows (the answer with and without
    padded re-checks), written as JSONL at `path`."""
    from data_curation.report import write_jsonl
    from data_curation.sources import load_rows
    from stages.preference_pairs import padded_pairs

    write_jsonl(path, padded_pairs(load_rows("synthetic_math", "train", n, seed, {"difficulties": [1]}), padding=1))
    return str(path)


@pytest.fixture(scope="session")
def qwen3(prefect_harness, tiny_model) -> dict:
    """The qwen3 run, shared: test_named_recipes checks its stages, the browser test launches the
    same recipe from the Prefect UI on top of it."""
    return run_named_recipe("qwen3")


def cli_env(home: Path | None = None, seeded: bool = True) -> dict:
    """The environment for a `posttrain` subprocess, pointed at `home` when given. A home that does
    not exist yet is made as a fresh home looks after its first run's set-up (`seed_home`), unless
    `seeded` is False (a test of that set-up itself)."""
    env = {**os.environ}
    if home is not None:
        if seeded and not home.exists():
            seed_home(home)
        env.update(POSTTRAIN_HOME=str(home), **home_settings(home))
    return env


def run_cli(*args: str, env_home: Path | None = None, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([POSTTRAIN, *args], cwd=REPO, env=cli_env(env_home), capture_output=True, text=True,
                          timeout=timeout, **kw)


def parent_pid(proc: Path) -> int | None:
    """The parent pid of /proc/<pid> (None when the process is gone)."""
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def paused(stage_dir: Path):
    """The stage's worker (its whole process group) stopped while the block runs, then continued:
    a fault injected in the block lands mid-stage however fast the machine trains, so a test needs
    no long stage to keep the worker busy while it acts."""
    worker = int((stage_dir / "worker.pid").read_text())
    try:
        os.killpg(worker, signal.SIGSTOP)
    except ProcessLookupError:
        raise AssertionError(f"{stage_dir.name}'s worker ended before it could be paused: give it more steps") from None
    try:
        yield
    finally:
        os.killpg(worker, signal.SIGCONT)


def wait_for(predicate, timeout: float, what: str):
    """`predicate()`'s first truthy value, polled every 50 ms: a fast machine runs a tiny stage's steps in
    tens of ms, so a test that acts on a stage's state must act soon after it appears."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def paused_once_training(stages_dir: Path, stage: str, started: float, run: subprocess.Popen, log: Path,
                         timeout_s: float = 240):
    """Wait for `stage`'s worker under `stages_dir` to log a step after `started` (a time.time() taken
    before the run began: an earlier test's killed run leaves its .partial and progress.json in a shared
    home), pause it at once and yield its .partial directory. Polls every 50 ms and pauses before
    anything else: on a fast CI machine a tiny stage's 100 steps took about a second."""
    deadline = time.monotonic() + timeout_s

    def fresh() -> Path | None:
        with contextlib.suppress(FileNotFoundError):  # a progress.json being replaced
            return next((p for p in stages_dir.glob(f"{stage}-*.partial/progress.json") if p.stat().st_mtime >= started),
                        None)
        return None

    while not (found := fresh()):
        assert run.poll() is None, f"the run exited before {stage} trained; log:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{stage} took no step in {timeout_s} s; log:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)
    with paused(found.parent):
        yield found.parent


TINY_MODELS = ("tiny-qwen3", "tiny-qwen3-student")  # what the tiny profile's recipes load


def seed_home(home: Path) -> None:
    """Make `home` as a first run leaves a new home before its first stage: Prefect's database
    created and migrated (~13 s of a temporary server's start on a new home, ~7 s on a migrated
    one) and the tiny models built (~7 s). Copies, so a test may change its home freely. Nothing
    else of the session's home is shared: no runs, stages, MLflow store or caches."""
    template = _fresh_home_template()
    (home / "prefect").mkdir(parents=True)
    _copy_db(template / "prefect.db", home / "prefect" / "prefect.db")
    for name in TINY_MODELS:
        shutil.copytree(template / "models" / name, home / "models" / name)


def _copy_db(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite database, whatever its write-ahead log holds."""
    with sqlite3.connect(src) as source, sqlite3.connect(dst) as target:
        source.backup(target)


def _fresh_home_template() -> Path:
    """The session's template for `seed_home`, made once: a migrated Prefect database (by posttrain's
    own temporary server, as a first run makes it) and the tiny models."""
    template = _HOME / "fresh-home-template"
    if (template / "prefect.db").exists():
        return template
    from pipeline.models.named import ensure_named_model

    work = Path(tempfile.mkdtemp(dir=_HOME, prefix=".fresh-home-"))
    (work / "prefect").mkdir()
    start = "from pipeline.launch.prefect_api import start_temporary_server as s, wait_until_up as w; w(*s())"
    subprocess.run([sys.executable, "-c", start], cwd=REPO, env=cli_env(work, seeded=False), check=True, timeout=300)
    (template / "models").mkdir(parents=True)
    for name in TINY_MODELS:
        shutil.copytree(ensure_named_model(name), template / "models" / name)
    _copy_db(work / "prefect" / "prefect.db", template / ".prefect.db")
    os.replace(template / ".prefect.db", template / "prefect.db")  # last: its presence says the template is whole
    shutil.rmtree(work, ignore_errors=True)
    return template


def ort_last_logits(og_model, ids: list[int]):
    """The next-token logits an ONNX Runtime GenAI model gives after `ids` (engine and GRPO tests)."""
    import numpy as np
    import onnxruntime_genai as og

    params = og.GeneratorParams(og_model)
    params.set_search_options(max_length=len(ids) + 1)
    generator = og.Generator(og_model, params)
    generator.append_tokens(np.array([ids], dtype=np.int32))
    return generator.get_output("logits")[0, -1]
