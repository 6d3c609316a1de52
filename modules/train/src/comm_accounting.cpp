// DeferredComm and put_comm (see comm_accounting.hpp).
#include "trainscope/train/comm_accounting.hpp"

#include <iterator>

namespace trainscope::train {

void put_comm(const dist::ParallelComm& c, IterationValues& v) {
    v.comm_bytes = c.bytes;
    v.comm_collective_s = c.collective_s;
    v.comm_uncompressed_bytes = c.uncompressed_bytes;
    v.comm_error_norm = c.error_norm;
    v.bucket_s = c.bucket_s;
}

dist::ParallelComm DeferredComm::take(dist::DataParallelism& parallel, std::int64_t iteration) {
    dist::PendingParallelComm p = parallel.take_iteration_comm();
    dist::ParallelComm known = p.known;
    if (p.resolve) pending_[iteration] = std::move(p);
    return known;
}

std::optional<dist::ParallelComm> DeferredComm::resolve(std::int64_t iteration) {
    const auto it = pending_.find(iteration);
    if (it == pending_.end()) return std::nullopt;
    dist::ParallelComm c = it->second.resolve();
    pending_.erase(pending_.begin(), std::next(it));
    return c;
}

} // namespace trainscope::train
