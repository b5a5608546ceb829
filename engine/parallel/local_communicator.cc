#include "engine/parallel/local_communicator.h"

#include <cstring>

namespace switchyard {

void LocalCommunicator::reduce_scatter_sum_f32(const float* in, float* out, int64_t out_n) {
  if (in != out) std::memmove(out, in, static_cast<size_t>(out_n) * sizeof(float));
}

void LocalCommunicator::all_gather_impl(const Tensor& in, Tensor& out) {
  if (in.raw_data() != out.raw_data()) std::memmove(out.raw_data(), in.raw_data(), in.nbytes());
}

void LocalCommunicator::all_to_all_v_impl(const Tensor& send, const std::vector<int64_t>& send_rows,
                                          Tensor& recv, const std::vector<int64_t>& recv_rows) {
  SY_CHECK_MSG(send_rows[0] == recv_rows[0], "all_to_all_v counts disagree with the peer's");
  if (send.raw_data() != recv.raw_data()) {
    std::memmove(recv.raw_data(), send.raw_data(), send.nbytes());
  }
}

}  // namespace switchyard
