"""Helpers on a training run's directory shared by the layout tests."""
import shutil


def rewind(run_dir, step):
    """Makes step_<step> the newest checkpoint, as if the run had stopped there."""
    checkpoints = run_dir / "checkpoints"
    for entry in checkpoints.iterdir():
        if entry.name.startswith("step_") and int(entry.name[5:]) > step:
            shutil.rmtree(entry)
    (checkpoints / "latest").write_text(f"step_{step}\n")
