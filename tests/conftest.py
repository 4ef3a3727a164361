"""Test set-up: every test session gets its own POSTTRAIN_HOME (and so its own Prefect home, MLflow
store and model cache) before Prefect or MLflow is imported."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Idempotent: test modules import helpers from here, which must not make a second home.
_HOME = Path(os.environ.get("POSTTRAIN_TEST_HOME") or tempfile.mkdtemp(prefix="posttrain-tests-"))
os.environ["POSTTRAIN_TEST_HOME"] = str(_HOME)
os.environ["POSTTRAIN_HOME"] = str(_HOME)
os.environ["PREFECT_HOME"] = str(_HOME / "prefect")
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pipeline.store.home import configure_environment  # noqa: E402

configure_environment()
REPO = Path(__file__).resolve().parent.parent
POSTTRAIN = str(Path(sys.executable).parent / "posttrain")


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


@pytest.fixture(scope="session")
def qwen3(prefect_harness, tiny_model) -> dict:
    """The qwen3 run, shared: test_named_recipes checks its stages, the browser test launches the
    same recipe from the Prefect UI on top of it."""
    return run_named_recipe("qwen3")


def cli_env(home: Path | None = None) -> dict:
    """The environment for a `posttrain` subprocess, pointed at `home` when given."""
    env = {**os.environ}
    if home is not None:
        env.update(POSTTRAIN_HOME=str(home), PREFECT_HOME=str(home / "prefect"),
                   PREFECT_LOCAL_STORAGE_PATH=str(home / "prefect" / "storage"),
                   MLFLOW_TRACKING_URI=f"sqlite:///{home / 'mlflow.db'}")
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
