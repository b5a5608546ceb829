// Checks on CUDA runtime, cuBLAS and cuBLASLt calls. A failure is an engine bug or a
// broken device, never a user error, so it aborts with file:line like SY_CHECK.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/runtime/check.h"

#define SY_CUDA_CHECK(expr)                                                   \
  do {                                                                        \
    const cudaError_t sy_cuda_err_ = (expr);                                  \
    if (sy_cuda_err_ != cudaSuccess)                                          \
      ::switchyard::internal::check_failed(__FILE__, __LINE__, #expr,         \
                                           cudaGetErrorString(sy_cuda_err_)); \
  } while (0)

#define SY_CUBLAS_CHECK(expr)                                                         \
  do {                                                                                \
    const cublasStatus_t sy_cublas_status_ = (expr);                                  \
    if (sy_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::switchyard::internal::check_failed(__FILE__, __LINE__, #expr,                 \
                                           cublasGetStatusString(sy_cublas_status_)); \
  } while (0)

#define SY_CUBLASLT_CHECK(expr)                                                           \
  do {                                                                                    \
    const cublasStatus_t sy_cublaslt_status_ = (expr);                                    \
    if (sy_cublaslt_status_ != CUBLAS_STATUS_SUCCESS)                                     \
      ::switchyard::internal::check_failed(__FILE__, __LINE__, #expr,                     \
                                           cublasLtGetStatusString(sy_cublaslt_status_)); \
  } while (0)

// After a kernel launch: a bad launch configuration fails here at once; a fault inside
// the kernel is sticky and fails the next checked call on the device.
#define SY_CUDA_CHECK_LAUNCH() SY_CUDA_CHECK(cudaGetLastError())
