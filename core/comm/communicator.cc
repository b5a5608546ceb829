#include "core/comm/communicator.h"

#include <chrono>
#include <string>

namespace switchyard {
namespace {

int64_t sum_of(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) {
    SY_CHECK_MSG(c >= 0, "negative row count");
    total += c;
  }
  return total;
}

// A group of one's collectives: `out` becomes `in` (any devices), nothing to do in place.
void copy_unless_same(const Tensor& in, Tensor& out) {
  if (in.raw_data() != out.raw_data()) out.copy_from(in);
}

}  // namespace

void Communicator::check_tensor(const Tensor& tensor) const {
  SY_CHECK_MSG(tensor.defined(), "collective on an undefined tensor");
  // A group of one moves nothing between processes: its tensors may live anywhere.
  if (size() == 1) return;
  const Device& own = tensor_device();
  if (!own.is_cuda()) {
    SY_CHECK_MSG(!tensor.device().is_cuda(), "CPU communicator given a CUDA tensor");
    return;
  }
  // Collectives never move data between devices behind the caller's back.
  if (!tensor.device().is_cuda() || tensor.device().index() != own.index()) {
    const std::string message =
        "communicator on " + own.name() + " given a tensor on " + tensor.device().name();
    internal::check_failed(__FILE__, __LINE__, "tensor.device() == tensor_device()",
                           message.c_str());
  }
}

void Communicator::all_reduce_sum(Tensor& tensor) {
  check_tensor(tensor);
  SY_CHECK_MSG(tensor.dtype() == DType::kF32, "all_reduce_sum needs an f32 tensor");
  if (size() == 1) return;
  all_reduce_sum_f32(tensor.data<float>(), tensor.numel());
}

void Communicator::all_reduce_sum(double* values, int64_t n) {
  SY_CHECK(n >= 0 && (values != nullptr || n == 0));
  if (size() == 1) return;
  all_reduce_sum_f64(values, n);
}

void Communicator::all_reduce_sum(int64_t* values, int64_t n) {
  SY_CHECK(n >= 0 && (values != nullptr || n == 0));
  if (size() == 1) return;
  all_reduce_sum_i64(values, n);
}

void Communicator::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  check_tensor(in);
  check_tensor(out);
  SY_CHECK_MSG(in.dtype() == DType::kF32 && out.dtype() == DType::kF32,
               "reduce_scatter_sum needs f32 tensors");
  SY_CHECK_MSG(in.numel() == size() * out.numel(),
               "reduce_scatter_sum input must hold size() * out.numel() elements");
  if (size() == 1) {
    copy_unless_same(in, out);
    return;
  }
  reduce_scatter_sum_f32(in.data<float>(), out.data<float>(), out.numel());
}

void Communicator::all_gather(const Tensor& in, Tensor& out) {
  check_tensor(in);
  check_tensor(out);
  SY_CHECK_MSG(in.dtype() == out.dtype(), "all_gather dtypes differ");
  SY_CHECK_MSG(out.numel() == size() * in.numel(),
               "all_gather output must hold size() * in.numel() elements");
  if (size() == 1) {
    copy_unless_same(in, out);
    return;
  }
  all_gather_impl(in, out);
}

void Communicator::all_to_all_v(const Tensor& send, const std::vector<int64_t>& send_rows,
                                Tensor& recv, const std::vector<int64_t>& recv_rows) {
  check_tensor(send);
  check_tensor(recv);
  SY_CHECK_MSG(send.dtype() == recv.dtype(), "all_to_all_v dtypes differ");
  SY_CHECK_MSG(send.rank() >= 1 && recv.rank() >= 1, "all_to_all_v needs tensors with rows");
  SY_CHECK_MSG(send.row_size() == recv.row_size(), "all_to_all_v row sizes differ");
  SY_CHECK_MSG(
      static_cast<int>(send_rows.size()) == size() && static_cast<int>(recv_rows.size()) == size(),
      "all_to_all_v needs one row count per rank");
  SY_CHECK_MSG(sum_of(send_rows) == send.rows(), "send_rows do not add up to send's rows");
  SY_CHECK_MSG(sum_of(recv_rows) == recv.rows(), "recv_rows do not add up to recv's rows");
  if (size() == 1) {
    SY_CHECK_MSG(send_rows[0] == recv_rows[0], "all_to_all_v counts disagree with the peer's");
    copy_unless_same(send, recv);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  all_to_all_v_impl(send, send_rows, recv, recv_rows);
  all_to_all_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<int64_t> Communicator::all_to_all_counts(const std::vector<int64_t>& send_counts) {
  SY_CHECK_MSG(static_cast<int>(send_counts.size()) == size(),
               "all_to_all_counts needs one count per rank");
  if (size() == 1) return send_counts;
  return all_to_all_counts_impl(send_counts);
}

void Communicator::broadcast(Tensor& tensor, int root) {
  check_tensor(tensor);
  SY_CHECK_MSG(root >= 0 && root < size(), "broadcast root out of range");
  if (size() == 1) return;
  broadcast_impl(tensor, root);
}

void Communicator::exchange(std::vector<Message>& messages) {
  for (const Message& message : messages) {
    check_tensor(message.tensor);
    SY_CHECK_MSG(message.peer >= 0 && message.peer < size() && message.peer != rank(),
                 "point-to-point message to itself or outside the group");
  }
  if (!messages.empty()) exchange_impl(messages);
}

void Communicator::exchange_impl(std::vector<Message>&) {
  SY_CHECK_MSG(false, "this communicator has no point-to-point messages");
}

}  // namespace switchyard
