// Test tool for the interop tests: loads a recipe and weights (registry names), runs one
// forward and backward on the given tokens, and writes logits, losses, the multi-token
// prediction loss and every parameter gradient to a safetensors file that the Python side
// compares.
//   model_io_tool RECIPE WEIGHTS.safetensors BATCH.safetensors OUT.safetensors
// BATCH holds `ids` and `targets`, (batch, seq) i32.
#include <cstdio>

#include "checkpoint/safetensors.h"
#include "core/config/recipe.h"
#include "core/runtime/status_macros.h"
#include "engine/model/transformer.h"

namespace switchyard {
namespace {

absl::Status run(const char* recipe_path, const char* weights_path, const char* batch_path,
                 const char* out_path) {
  SY_ASSIGN_OR_RETURN(config::Recipe recipe, config::load_recipe(recipe_path, {}));
  ParamStore params;
  Transformer model(recipe, params);
  params.allocate(cpu_device());
  SY_ASSIGN_OR_RETURN(auto weights, read_safetensors(weights_path));
  for (Param& p : params.params()) {
    auto it = weights.find(p.name);
    if (it == weights.end()) return absl::NotFoundError("missing weight " + p.name);
    if (it->second.shape() != p.shape) return absl::InvalidArgumentError("shape of " + p.name);
    p.value.copy_from(it->second);
  }
  SY_ASSIGN_OR_RETURN(auto batch, read_safetensors(batch_path));
  Rng rng(recipe.train().seed());
  Tensor logits;
  LossParts loss = model.forward(cpu_device(), batch.at("ids"), batch.at("targets"),
                                 /*training=*/false, rng, &logits);
  model.backward(cpu_device(), 1.0f);

  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("logits", logits);
  Tensor losses = Tensor::empty({4});
  losses.data<float>()[0] = static_cast<float>(loss.total);
  losses.data<float>()[1] = static_cast<float>(loss.cross_entropy);
  losses.data<float>()[2] = static_cast<float>(loss.aux_loss);
  losses.data<float>()[3] = static_cast<float>(loss.z_loss);
  out.emplace_back("losses", losses);
  Tensor mtp = Tensor::empty({1});
  mtp.data<float>()[0] = static_cast<float>(loss.mtp_loss);
  out.emplace_back("mtp_loss", mtp);
  for (const Param& p : params.params()) out.emplace_back("grad:" + p.name, p.grad);
  return write_safetensors(out_path, out);
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: model_io_tool RECIPE WEIGHTS BATCH OUT\n");
    return 2;
  }
  absl::Status s = switchyard::run(argv[1], argv[2], argv[3], argv[4]);
  if (!s.ok()) {
    std::fprintf(stderr, "model_io_tool: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
