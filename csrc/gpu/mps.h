// Ranks sharing a GPU, and the CUDA Multi-Process Service (MPS).
//
// Processes that share a GPU without MPS are time-sliced: each has its own
// GPU context, and the GPU switches between them, so every wait one rank's
// stream makes on another's work (the CUDA-IPC ring's events, the host
// ring's copies) costs a context switch. Under MPS the processes' work goes
// through one server context and runs without those switches. The runtime
// therefore warns, once per host, when ranks share a GPU and no MPS control
// daemon is there. No CUDA here: the emulation build and the tests call it.
#pragma once

#include <string>
#include <vector>

#include "gpu/backend_select.h"

namespace tfring {
namespace gpu {

// Where the CUDA driver looks for the MPS control daemon: the directory of
// its pipes and sockets, $CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps.
std::string mpsPipeDirectory();

// Whether an MPS control daemon is there: the driver connects to the
// `control` pipe in that directory when CUDA initializes, and runs without
// MPS when it is missing. A named pipe or a socket of that name counts.
bool mpsControlPresent(const std::string& pipe_dir);

// The warning the lowest rank of a host gives when two or more of that
// host's ranks share a GPU and MPS is not running; "" when none is due for
// `rank` (other ranks, GPUs not shared, MPS present). `ranks` is indexed by
// place in the communicator (the facts every rank gathered before choosing
// the backend); the warning names each as `labels` does.
std::string sharedGpuMpsWarning(const std::vector<RankGpu>& ranks, int rank, bool mps_present,
                                const std::string& pipe_dir,
                                const RankLabels& labels = RankLabels());

}  // namespace gpu
}  // namespace tfring
