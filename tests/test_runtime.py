import json
import os
import subprocess
import sys
from pathlib import Path

from stages.contracts import WorkerSpec
from stages.runtime import StageContext, checkpoint_step, last_checkpoint


def test_resume_skips_and_removes_checkpoints_cut_short_mid_save(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step, complete in [(5, True), (10, True), (15, False)]:
        d = ckpts / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x")
        if complete:
            (d / "trainer_state.json").write_text("{}")
    ctx = StageContext.local(tmp_path)
    chosen = last_checkpoint(ctx)
    assert Path(chosen).name == "checkpoint-10" and checkpoint_step(chosen) == 10
    assert not (ckpts / "checkpoint-15").exists()


def test_no_checkpoints_means_fresh_start(tmp_path):
    assert last_checkpoint(StageContext.local(tmp_path)) is None


def test_a_data_stage_worker_imports_neither_torch_nor_mlflow(tmp_path):
    """A stage that trains nothing starts in well under a second: no trainer callback (transformers,
    peft), no torch.distributed, no MLflow (the flow logs its output). The run id is one MLflow has
    never seen, so a worker that still logged would fail here."""
    from data_curation.report import write_jsonl
    from data_curation.sources import load_rows

    rows = tmp_path / "rows.jsonl"
    write_jsonl(rows, load_rows("synthetic_math", n=40))
    out = tmp_path / "out"
    stage = {"name": "decontam", "kind": "decontaminate", "data": {"source": "upstream.dataset"},
             "eval_sets": [{"source": "synthetic_math", "split": "eval", "n": 50}]}
    spec = WorkerSpec(kind="decontaminate", stage=stage, inputs={"data": {"n": None, "path": str(rows)}}, eval=None,
                      output_dir=str(out), mlflow_run_id="0" * 32)
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    code = ("import sys; from pipeline.worker import main; main([sys.argv[1]]); "
            "print(sorted(m for m in ('torch', 'mlflow', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "spec.json")], capture_output=True, text=True,
                          env={**os.environ, "POSTTRAIN_HOME": str(tmp_path / "home"),
                               "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert json.loads((out / "result.json").read_text())["metrics"]["curate/rows_in"] == 40
