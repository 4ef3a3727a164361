from pathlib import Path

from stages.kinds.runtime import StageContext, checkpoint_step, last_checkpoint


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
