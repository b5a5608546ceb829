// Choosing the device a job runs on (runtime.device) and its peak arithmetic rate.
#pragma once

#include <string>

#include "core/runtime/device.h"
#include "core/runtime/tensor.h"

namespace switchyard {

// Whether this build has the CUDA backend.
bool built_with_cuda();
// Visible CUDA devices: 0 without the CUDA backend, a driver or a GPU.
int visible_gpus();

// The device for runtime.device = `wanted`: "cpu", "cuda", or "" (CUDA when this build
// has it and a GPU is visible, else the CPU). On CUDA each process of a node takes GPU
// local_rank modulo the GPUs it sees (index 0 under a launcher that shows each rank its
// own GPU); ranks left sharing one are refused when their groups are made (use_nccl).
// Returns null and sets *error (one line) when the choice cannot be honoured. The device
// lives for the whole process.
Device* select_device(const std::string& wanted, int local_rank, std::string* error);

// The working precision of weights and activations for runtime.precision = `wanted`:
// "fp32", "bf16", or "" (bf16 on a GPU; fp32 on the CPU, where bf16 runs every op in f32
// on widened copies and only costs time). The recipe's validation rejects other values.
DType working_dtype(const std::string& wanted, const Device& device);
// The same for a run on a GPU (`on_gpu`) or the CPU, before any device is opened.
DType working_dtype(const std::string& wanted, bool on_gpu);

// Peak dense bf16 FLOP/s of `device` from its multiprocessor count and clock, for the
// MFU the progress line shows: tensor-core FLOPs per clock per multiprocessor by
// architecture (Hopper 4096, Ampere A100 2048, Ada and consumer Ampere 1024). 0 for
// the CPU and for architectures outside that list.
double bf16_peak_flops(Device& device);

// The GPU's model as cudaGetDeviceProperties names it ("NVIDIA H100 80GB HBM3"); "" for
// the CPU.
std::string gpu_model_name(Device& device);

}  // namespace switchyard
