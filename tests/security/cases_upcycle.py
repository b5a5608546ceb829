"""Hostile inputs of `convert upcycle`: its options, and the dense Hugging Face directory
it reads with the importer's checks (see hostile.py for the harness). The dense directory
is the tiny run's Mixtral export relabelled as Llama: expert 0 of each layer becomes the
layer's FFN and the other experts' bytes stay, unnamed, in the file."""
import json
import re

from cases_hf import _read_safetensors, _write_safetensors
from hostile import Case


def _dense(world, tmp):
    """A valid dense LlamaForCausalLM directory made from the tiny run's export."""
    hf = world.hf(tmp)
    path = hf / "model.safetensors"
    header, data = _read_safetensors(path)
    dense = {}
    for name, entry in header.items():
        expert = re.fullmatch(r"(.*\.)block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight", name)
        if expert and expert[2] == "0":
            proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}[expert[3]]
            dense[f"{expert[1]}mlp.{proj}.weight"] = entry
        elif not expert and ".block_sparse_moe.gate." not in name:
            dense[name] = entry
    _write_safetensors(path, dense, data)
    config = json.loads((hf / "config.json").read_text())
    for key in ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef",
                "router_jitter_noise", "output_router_logits"):
        config.pop(key, None)
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (hf / "config.json").write_text(json.dumps(config))
    return hf


def _upcycle(*options, edit=None, source=_dense, into_input=False):
    def make(world, tmp):
        hf = source(world, tmp)
        if edit:
            config = json.loads((hf / "config.json").read_text())
            edit(config)
            (hf / "config.json").write_text(json.dumps(config))
        out = hf / "moe" if into_input else tmp / "moe"
        return ["convert", "upcycle", str(hf), str(out), *options]
    return make


def _mistral_window(config):
    config.update(model_type="mistral", sliding_window=4096)


def _from_hf_dense(world, tmp):
    return ["convert", "from-hf", str(_dense(world, tmp)), str(tmp / "imported")]


CASES = [
    Case("upcycle-experts-2-40", "convert upcycle options", "--experts 2^40",
         _upcycle("--experts", str(1 << 40), "--top-k", "2"),
         "--experts: 1099511627776 is out of range [1, 4096]"),
    Case("upcycle-experts-beyond-limit", "convert upcycle options",
         "--experts 1048576 (a 2^20-expert model of the tiny run; recipes hold at most 4096)",
         _upcycle("--experts", str(1 << 20), "--top-k", "2"),
         "--experts: 1048576 is out of range [1, 4096]"),
    Case("upcycle-granularity-indivisible", "convert upcycle options",
         "--granularity 7 for an FFN of 256 rows",
         _upcycle("--experts", "7", "--top-k", "7", "--granularity", "7"),
         "--granularity (7) must divide the dense FFN's intermediate_size"),
    Case("upcycle-top-k-partial-copies", "convert upcycle options",
         "--top-k 2 with --granularity 4 (chosen experts could miss slices)",
         _upcycle("--experts", "8", "--top-k", "2", "--granularity", "4"),
         "--top-k (2) must be a multiple of --granularity (4)"),
    Case("upcycle-moe-directory", "HF config.json (dense)", "a Mixtral directory given to upcycle",
         _upcycle("--experts", "4", "--top-k", "2", source=lambda world, tmp: world.hf(tmp)),
         "model_type is a mixture of experts"),
    Case("upcycle-mistral-window", "HF config.json (dense)", "Mistral with sliding_window 4096",
         _upcycle("--experts", "4", "--top-k", "2", edit=_mistral_window),
         "sliding_window is set"),
    Case("upcycle-llama-rope-scaling", "HF config.json (dense)", "Llama 3's rope_scaling llama3",
         _upcycle("--experts", "4", "--top-k", "2",
                  edit=lambda c: c.update(rope_scaling={"rope_type": "llama3", "factor": 8.0})),
         'rope_scaling.rope_type "llama3"'),
    Case("upcycle-missing-ffn", "HF config.json (dense)",
         "the Mixtral export's config relabelled llama, its expert tensors kept",
         _upcycle("--experts", "4", "--top-k", "2",
                  source=lambda world, tmp: world.hf(tmp),
                  edit=lambda c: c.update(model_type="llama")),
         "missing tensor model.layers.0.mlp.gate_proj.weight"),
    Case("upcycle-into-own-input", "convert output directory", "upcycle with OUT inside HF_DIR",
         _upcycle("--experts", "4", "--top-k", "2", into_input=True),
         "lies inside the input"),
    Case("from-hf-dense-directory", "HF config.json", "a dense Llama directory given to from-hf",
         _from_hf_dense, "model_type is a dense model: switchyard convert upcycle"),
]
