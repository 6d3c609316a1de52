// Host reads of device values: every place the harness copies a device result to the host goes
// through read_to_host, which counts it. On a GPU each such read synchronises the host with the
// device (the copy waits for the queued kernels), so the count per iteration is the number of
// host syncs the harness itself adds; /iterations/host_syncs records it, and the tests assert that
// the step of an fp32/bf16 run needs none. Counted on every device (a CPU run shows the same
// count a GPU run would), so the CPU test suite guards the GPU path.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace trainscope::train {

// The tensor's values on the host: one counted read (a copy even when it is already there).
torch::Tensor read_to_host(const torch::Tensor& t);
// One counted read of a single value.
double read_scalar(const torch::Tensor& t);
// Reads so far in this process (all threads).
std::int64_t host_syncs();

} // namespace trainscope::train
