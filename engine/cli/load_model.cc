#include "engine/cli/load_model.h"

#include "absl/strings/str_cat.h"
#include "checkpoint/weights.h"
#include "engine/runtime/status_macros.h"
#include "kernels/threads.h"

namespace switchyard {

absl::Status load_model(const std::string& dir, LoadedModel& out) {
  SY_ASSIGN_OR_RETURN(out.recipe, load_weights_recipe(dir));
  SY_ASSIGN_OR_RETURN(out.tokenizer, load_weights_tokenizer(dir, out.recipe));
  set_cpu_threads(out.recipe.runtime().threads());
  out.model = std::make_unique<Transformer>(out.recipe, out.params);
  SY_RETURN_IF_ERROR(check_fits(cpu_device(),
                                static_cast<double>(out.params.allocation_bytes(DType::kF32)),
                                absl::StrCat("the parameters of ", dir, "/model.safetensors")));
  out.params.allocate(cpu_device());
  return load_weights(dir, out.params);
}

}  // namespace switchyard
