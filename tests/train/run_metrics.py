"""What a run's metrics.jsonl says, for the tests that compare runs."""
import json


def losses(run_dir):
    """step -> (loss, grad_norm, aux_loss) and eval step -> val_loss, from metrics.jsonl."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "loss" in m:
            out[("train", m["step"])] = (m["loss"], m["grad_norm"], m["aux_loss"])
        elif "val_loss" in m:
            out[("val", m["step"])] = m["val_loss"]
    return out
