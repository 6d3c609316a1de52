// The three workloads' factories (cv_workload.cpp, llm_workload.cpp, comm_workload.cpp), for
// make_workload only.
#pragma once

#include <memory>

#include "trainscope/train/workload.hpp"

namespace trainscope::train {

std::unique_ptr<Workload> make_cv_workload(const RunEnvironment& env);
std::unique_ptr<Workload> make_llm_workload(const RunEnvironment& env);
std::unique_ptr<Workload> make_comm_workload(const RunEnvironment& env);

} // namespace trainscope::train
