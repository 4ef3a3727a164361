"""The structure holds: the cache key's code version follows every module a kind uses (so an edit
is never served stale from cache), each kind is one registry record, and the CLI's curation flags
come from the config models."""

import shutil
from pathlib import Path

from stages.common import GenerationSpec
from stages.registry import SHARED_MODULES, STAGE_KINDS
from toolkit.core import fingerprints
from toolkit.core.fingerprints import code_fingerprint, module_closure

REPO = Path(__file__).resolve().parent.parent


def _tree(tmp_path: Path) -> Path:
    for package in ("stages", "pipeline", "data_curation", "toolkit"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _key(kind: str, root: Path) -> str:
    code_fingerprint.cache_clear()
    return code_fingerprint((STAGE_KINDS[kind].run.__module__, *SHARED_MODULES), root)


def test_editing_any_module_a_kind_uses_changes_its_key(tmp_path):
    root = _tree(tmp_path)
    used = module_closure(("stages.grpo", *SHARED_MODULES), root)
    rel = {str(p.relative_to(root)) for p in used}
    # reached only through imports inside functions and through other modules
    assert {"stages/grpo_trainer.py", "toolkit/rewards/math.py", "toolkit/rewards/harness.py",
            "toolkit/rewards/sandbox.py", "data_curation/sources/synthetic_math.py", "toolkit/core/text.py"} <= rel
    for edited in ["stages/grpo_trainer.py", "toolkit/rewards/math.py", "data_curation/sources/synthetic_math.py",
                   "toolkit/core/text.py", "toolkit/rewards/__init__.py", "toolkit/rewards/harness.py"]:
        before = {k: _key(k, root) for k in ("grpo", "sft")}
        with open(root / edited, "a") as f:
            f.write("\n# edited\n")
        after = {k: _key(k, root) for k in ("grpo", "sft")}
        assert after["grpo"] != before["grpo"], edited
    before = {k: _key(k, root) for k in STAGE_KINDS}
    with open(root / "pipeline" / "cli" / "ui.py", "a") as f:  # no kind imports the UI launcher
        f.write("\n# edited\n")
    with open(root / "stages" / "rl_losses.py", "a") as f:  # only grpo uses the RL losses
        f.write("\n# edited\n")
    after = {k: _key(k, root) for k in STAGE_KINDS}
    assert after["sft"] == before["sft"] and after["dedup"] == before["dedup"]
    assert after["grpo"] != before["grpo"]
    code_fingerprint.cache_clear()


def test_kept_import_scans_follow_the_source_they_were_made_from(tmp_path):
    """Scans kept on disk (for start-up speed) are found by the hash of the source: a file whose
    imports change is scanned again, so the closure and the key still follow the code."""
    root, scans = _tree(tmp_path / "code"), tmp_path / "scans"
    before = fingerprints._scan_dir
    fingerprints.keep_import_scans_in(scans)
    try:
        fingerprints._imports.cache_clear()
        first = module_closure(("stages.sft",), root)
        kept = sorted(scans.iterdir())
        assert len(kept) == len(first) and root / "stages/rl_losses.py" not in first
        fingerprints._imports.cache_clear()  # a new process: every scan read back, none made again
        assert module_closure(("stages.sft",), root) == first and sorted(scans.iterdir()) == kept
        with open(root / "stages/sft.py", "a") as f:
            f.write("\nfrom stages import rl_losses  # noqa\n")
        fingerprints._imports.cache_clear()
        assert root / "stages/rl_losses.py" in module_closure(("stages.sft",), root)
    finally:
        fingerprints.keep_import_scans_in(before)
        fingerprints._imports.cache_clear()


def test_every_kind_is_one_record_with_its_config_and_run():
    assert set(STAGE_KINDS) == {"sft", "grpo", "decontaminate", "dedup", "difficulty_filter", "no_cot_filter",
                                "trace_filter", "rejection_sample", "thinking_fusion", "preference_pairs",
                                "reward_model", "dpo", "merge", "distill"}
    for name, kind in STAGE_KINDS.items():
        assert kind.config.model_fields["kind"].default == name and callable(kind.run) and kind.outputs


def test_curation_flags_come_from_the_config_models():
    import argparse

    from pipeline.cli.args import add_model_arguments
    from pipeline.cli.curate import PIPELINE_ONLY, add_parser
    from stages.curation import CURATION_CONFIGS

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["curate", "decontaminate", "--train", "x.jsonl", "--out", "o", "--eval", "champ",
                              "--mode", "coverage", "--ngram", "13"])
    assert (args.mode, args.ngram) == ("coverage", 13)
    for kind, model in CURATION_CONFIGS.items():
        one = argparse.ArgumentParser()
        add_model_arguments(one, model, skip=PIPELINE_ONLY)
        text = one.format_help()
        if "model" in model.model_fields:  # a sampling filter: its generation settings
            add_model_arguments(one, GenerationSpec, skip=set())
            text = one.format_help()
            assert "--engine" in text and "--precision" in text, kind
        for field in model.model_fields:
            if field not in PIPELINE_ONLY | {"data", "eval_sets", "launcher", "generation"}:
                assert "--" + field.replace("_", "-") in text, (kind, field)


def test_the_readme_example_kind_is_one_module_and_one_registry_line(tmp_path):
    """Copy the code, add the `head` kind exactly as docs/architecture.md writes it, and use it in a recipe."""
    import re
    import subprocess
    import sys

    root = _tree(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "architecture.md").read_text(), re.S)
    module = next(b for b in blocks if b.startswith("# stages/head.py"))
    (root / "stages" / "head.py").write_text(module)
    registry = root / "stages" / "registry.py"
    text = registry.read_text().replace("from stages import ", "from stages import head, ", 1)
    registry.write_text(text.replace("\n]\n", "\n    StageKind(head.HeadConfig, head.run),\n]\n", 1))
    (root / "head.yaml").write_text("name: head\neval: null\nstages:\n  - {name: first, kind: head, "
                                    "data: {source: synthetic_math, n: 10}, n: 3}\n")
    script = ("from pipeline.recipe import load_recipe\n"
              "from stages.registry import STAGE_KINDS\n"
              "from stages.runtime import StageContext\n"
              "import sys\n"
              "stage = load_recipe('head.yaml').recipe.stages[0]\n"
              "data = stage.data.model_dump(mode='json')\n"
              "out = STAGE_KINDS['head'].run(stage, StageContext.local(sys.argv[1], {'data': data}))\n"
              "print(out.outputs, out.metrics)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], cwd=root, capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root),
                                                       "POSTTRAIN_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "{'dataset': 'kept.jsonl'} {'head/rows': 3.0}" in proc.stdout
    assert len((tmp_path / "out" / "kept.jsonl").read_text().splitlines()) == 3


def test_only_the_cli_parses_arguments():
    """Flags are defined once, in pipeline/cli/ (from the config models); a worker or the sandbox
    harness reads the one path or fd its launcher passes, nothing else."""
    import ast

    parsers = set()
    for package in ("pipeline", "stages", "data_curation", "toolkit"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and "argparse" in (
                        [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]):
                    parsers.add(str(path.relative_to(REPO).parent))
    assert parsers == {"pipeline/cli"}
