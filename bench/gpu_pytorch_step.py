"""The training step of bench/gpu_step.cc in PyTorch on the GPU, for the comparison.

transformers' MixtralForCausalLM with the same shape and hyperparameters as the engine's
benchmark (bench/train_step.py's config and step: forward with labels and router aux
loss, backward, clipping at 1.0, AdamW, zero_grad), in eager mode under bf16 autocast or
in fp32 (the engine computes in fp32). The parameters and AdamW state stay fp32 either
way. Times warm-up steps, then timed steps between torch.cuda.synchronize() calls, and
prints tokens/s, MFU when given the FLOPs per token and the peak (scripts/gpu_check.sh
passes the engine's, so both MFUs compare directly), then one JSON line. Exits 77
without a GPU. Needs only torch and transformers:

  python3 bench/gpu_pytorch_step.py --preset coarse --precision bf16
"""

import argparse
import contextlib
import json
import sys
import time

import torch
import transformers
from transformers import MixtralForCausalLM

from train_step import BETAS, LR, WEIGHT_DECAY, implementations, mixtral_config, training_step

# Expert layouts (experts, top-k, expert FFN size), as in bench/gpu_step.cc.
PRESETS = {"coarse": (8, 2, 2816), "fine": (64, 8, 512)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=PRESETS, default="coarse",
                   help="coarse: 8 experts top-2, ffn 2816; fine: 64 experts top-8, ffn 512")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                   help="bf16: autocast over the forward pass; fp32: none")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--experts", type=int, help="default: the preset's")
    p.add_argument("--top-k", type=int, help="default: the preset's")
    p.add_argument("--ffn", type=int, help="expert FFN hidden size; default: the preset's")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--experts-impl",
                   help="transformers' experts implementation (eager, grouped_mm, ...); "
                        "default: the one transformers picks")
    p.add_argument("--flops-per-token", type=float, help="train FLOPs per token (gpu_step's)")
    p.add_argument("--peak-tflops", type=float, help="bf16 peak for MFU (gpu_step's)")
    p.add_argument("--measured-peak-tflops", type=float,
                   help="measured bf16 GEMM peak (gpu_ops's), for a second MFU")
    args = p.parse_args()
    experts, top_k, ffn = PRESETS[args.preset]
    args.experts = args.experts or experts
    args.top_k = args.top_k or top_k
    args.ffn = args.ffn or ffn
    return args


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        sys.exit(77)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = MixtralForCausalLM(mixtral_config(args, args.vocab)).float().train()
    if args.experts_impl:
        model.set_experts_implementation(args.experts_impl)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS,
                                  weight_decay=WEIGHT_DECAY, fused=True)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    precision = (torch.autocast("cuda", dtype=torch.bfloat16) if args.precision == "bf16"
                 else contextlib.nullcontext())

    for _ in range(args.warmup):
        training_step(model, optimizer, tokens, precision)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        training_step(model, optimizer, tokens, precision)
    torch.cuda.synchronize()
    tokens_per_s = args.steps * args.batch * args.seq / (time.perf_counter() - start)

    result = {
        "bench": "gpu_pytorch_step",
        "preset": args.preset,
        "precision": args.precision,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "implementations": implementations(model),
        "tokens_per_s": tokens_per_s,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
    }
    print(f"pytorch step, preset {args.preset} ({args.experts} experts top-{args.top_k}, "
          f"expert ffn {args.ffn}), {args.precision}: torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {result['implementations']}")
    print(f"{args.warmup} warm-up + {args.steps} timed steps; tokens/s {tokens_per_s:.0f}; "
          f"peak memory {result['peak_memory_bytes'] / 1e9:.2f} GB")
    if args.flops_per_token:
        achieved = tokens_per_s * args.flops_per_token
        result["achieved_tflops"] = achieved / 1e12
        line = f"achieved {achieved / 1e12:.2f} TFLOP/s (the engine's FLOPs/token)"
        for key, peak in (("mfu", args.peak_tflops), ("mfu_measured", args.measured_peak_tflops)):
            if peak:
                result[key] = achieved / (peak * 1e12)
                line += f"; MFU {100 * result[key]:.2f}% of {peak:.0f} TFLOP/s"
        print(line)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
