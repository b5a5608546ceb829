"""One training-step configuration on Switchyard and on PyTorch, measured in the same run.

Runs, in order and on the same thread count:
  1. sgemm_peak: the OpenBLAS sgemm GFLOP/s that engine MFU is reported against
     (measured before and after the training runs, the better of the two kept);
  2. the engine (`switchyard train recipes/tiny.textproto --set ...` for the shape below),
     timing the steps after the warmup from the "elapsed_s" field of metrics.jsonl;
  3. transformers' MixtralForCausalLM with the same shape in float32, timing full
     training steps (forward with labels and router aux loss, backward, gradient
     clipping, AdamW step, zero_grad) on a batch of random tokens.
Prints tokens/s for both, their ratio, and the engine MFU; optionally writes JSON.

Run with the project Python environment, e.g.
  ~/.cache/switchyard/pyenv/bin/python bench/train_step.py \
      --switchyard build/engine/cli/switchyard --sgemm-peak build/bench/sgemm_peak
"""

import argparse
import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from transformers import MixtralConfig, MixtralForCausalLM

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "tiny.textproto"

# Training hyperparameters shared by both sides (those of recipes/tiny.textproto).
LR = 3e-3
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
AUX_LOSS_COEF = 0.01
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
VOCAB = 1024  # the tiny recipe's tokenizer

# Arguments that are paths rather than part of the measured configuration.
NON_SHAPE_ARGS = {"switchyard", "sgemm_peak", "json"}


def add_shape_args(p):
    """The model and batch shape that engine_overrides() turns into recipe overrides."""
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--ffn", type=int, default=1024, help="expert FFN hidden size")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4, help="sequences per step")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--switchyard", required=True, help="path to the switchyard binary")
    p.add_argument("--sgemm-peak", required=True, help="path to the sgemm_peak binary")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads for both")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    add_shape_args(p)
    p.add_argument("--rounds", type=int, default=3,
                   help="alternate engine and PyTorch runs this many times; the best of each counts")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    p.add_argument("--breakdown", action="store_true",
                   help="then one more engine run with --op-times: its table of where a step "
                        "went, each kind's GFLOP/s against the sgemm peak")
    return p.parse_args()


def engine_overrides(args):
    """--set overrides that give recipes/tiny.textproto the benchmark shape."""
    fields = {
        "model.vocab_size": VOCAB,
        "model.hidden_size": args.hidden,
        "model.num_layers": args.layers,
        "model.num_heads": args.heads,
        "model.num_kv_heads": args.kv_heads,
        "moe.num_experts": args.experts,
        "moe.top_k": args.top_k,
        "moe.expert_ffn_hidden_size": args.ffn,
        "train.seq_len": args.seq,
        "train.global_batch_size": args.batch,
        "train.micro_batch_size": args.batch,
        "train.steps": args.warmup + args.steps,
        "train.log_interval": 1,
        "train.eval_interval": 0,
        "optimizer.warmup_steps": 0,
        # Hold out no validation data, so the run ends without an evaluation pass.
        "data.val_fraction": 0,
        "runtime.device": "cpu",
        "runtime.threads": args.threads,
    }
    flags = []
    for path, value in fields.items():
        flags += ["--set", f"{path}={value}"]
    return flags


def run_json(cmd):
    """Runs cmd and returns the last stdout line that parses as a JSON object."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON line in the output of {cmd}")


def measure_sgemm_peak(args):
    return run_json([args.sgemm_peak, str(args.threads)])["sgemm_gflops"]


def engine_flops_per_token(args):
    cmd = [args.switchyard, "train", str(RECIPE), "--dry-run"] + engine_overrides(args)
    return run_json(cmd)["train_flops_per_token"]


def measure_engine(args):
    """Engine tokens/s over the timed steps, from the cumulative elapsed_s of each step."""
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as run_dir:
        cmd = [args.switchyard, "train", str(RECIPE), "--run-dir", run_dir]
        subprocess.run(cmd + engine_overrides(args), check=True, capture_output=True, cwd=REPO)
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    elapsed = {}
    for line in lines:
        m = json.loads(line)
        if "elapsed_s" in m:
            elapsed[m["step"]] = m["elapsed_s"]
    last = args.warmup + args.steps
    seconds = elapsed[last] - elapsed[args.warmup]
    return args.steps * args.batch * args.seq / seconds


def engine_breakdown(args, sgemm_gflops):
    """The table `train --op-times` ends with, for the benchmark shape and the sgemm peak."""
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-") as run_dir:
        cmd = [args.switchyard, "train", str(RECIPE), "--run-dir", run_dir, "--op-times",
               "--peak-gflops", str(sgemm_gflops)]
        out = subprocess.run(cmd + engine_overrides(args), check=True, capture_output=True,
                             text=True, cwd=REPO).stdout
    table = out[out.index("where a step went"):]
    return "\n".join(line for line in table.splitlines() if not line.startswith("saved "))


def mixtral_config(args, vocab):
    """transformers' MixtralConfig for the shape in args (this script's shape flags) and
    the hyperparameters above; bench/gpu_pytorch_step.py builds its model from it too."""
    return MixtralConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=args.seq,
        rms_norm_eps=NORM_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=False,
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
        output_router_logits=True,
        router_aux_loss_coef=AUX_LOSS_COEF,
        use_cache=False,
    )


def pytorch_model(args):
    return MixtralForCausalLM(mixtral_config(args, VOCAB)).float().train()


def training_step(model, optimizer, tokens, precision=contextlib.nullcontext()):
    """One full training step on a batch of tokens: the forward pass (under `precision`,
    e.g. an autocast context) with labels, so the loss includes the router aux loss, the
    backward pass, gradient clipping, the optimizer step and zero_grad."""
    with precision:
        loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def implementations(model):
    """The attention and experts implementations transformers picked for the model."""
    return {
        "attention": model.config._attn_implementation,
        "experts": getattr(model.config, "_experts_implementation", "eager"),
    }


def measure_pytorch(args):
    """PyTorch tokens/s over the timed steps and the implementations transformers picked."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = pytorch_model(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq))

    for _ in range(args.warmup):
        training_step(model, optimizer, tokens)
    start = time.perf_counter()
    for _ in range(args.steps):
        training_step(model, optimizer, tokens)
    seconds = time.perf_counter() - start
    return args.steps * args.batch * args.seq / seconds, implementations(model)


def main():
    args = parse_args()
    sgemm_before = measure_sgemm_peak(args)
    flops_per_token = engine_flops_per_token(args)
    # Alternating rounds, best of each side: a burst of load from elsewhere on the
    # machine then costs one round of one side rather than decide the ratio.
    engine_tps = pytorch_tps = 0.0
    for _ in range(args.rounds):
        engine_tps = max(engine_tps, measure_engine(args))
        tps, implementations = measure_pytorch(args)
        pytorch_tps = max(pytorch_tps, tps)
    # Measured again at the end: a peak taken while something else held a core would
    # inflate MFU, so the better of the two counts.
    sgemm_gflops = max(sgemm_before, measure_sgemm_peak(args))
    engine_mfu = engine_tps * flops_per_token / (sgemm_gflops * 1e9)
    pytorch_mfu = pytorch_tps * flops_per_token / (sgemm_gflops * 1e9)

    shape = (
        f"hidden {args.hidden}, layers {args.layers}, heads {args.heads} (kv {args.kv_heads}), "
        f"{args.experts} experts top-{args.top_k}, expert ffn {args.ffn}, "
        f"seq {args.seq}, batch {args.batch}"
    )
    print(f"shape: {shape}")
    print(f"threads {args.threads}, {args.warmup} warmup + {args.steps} timed steps, "
          f"best of {args.rounds} alternating rounds, "
          f"torch {torch.__version__} (attention {implementations['attention']}, "
          f"experts {implementations['experts']})")
    print(f"sgemm peak: {sgemm_gflops:.1f} GFLOP/s; "
          f"train FLOPs/token: {flops_per_token / 1e6:.1f} M")
    print(f"{'':<10}{'tokens/s':>10}{'MFU':>8}   (MFU: train FLOPs/token x tokens/s / sgemm peak)")
    print(f"{'engine':<10}{engine_tps:>10.1f}{engine_mfu:>8.1%}")
    print(f"{'pytorch':<10}{pytorch_tps:>10.1f}{pytorch_mfu:>8.1%}")
    print(f"ratio engine/pytorch: {engine_tps / pytorch_tps:.2f}")
    if args.breakdown:
        print(engine_breakdown(args, sgemm_gflops))

    if args.json:
        result = {
            "config": {k: v for k, v in vars(args).items() if k not in NON_SHAPE_ARGS},
            "torch": torch.__version__,
            "pytorch_implementations": implementations,
            "sgemm_gflops": sgemm_gflops,
            "train_flops_per_token": flops_per_token,
            "engine_tokens_per_s": engine_tps,
            "pytorch_tokens_per_s": pytorch_tps,
            "ratio_engine_over_pytorch": engine_tps / pytorch_tps,
            "engine_mfu": engine_mfu,
            "pytorch_mfu": pytorch_mfu,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
