// EventPool: a cache of reusable device events for the NCCL backend, so that ordering and timing a
// collective creates no CUDA event per operation (cudaEventCreate is a driver call whose cost
// showed as latency at the comm benchmark's small sizes). Generic over the handle type and free
// of CUDA, so that its bookkeeping is tested on CPU (dist_mpi_tests).
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace trainscope::dist {

// Thread-safe: gradient hooks launch collectives from autograd's threads. A released event may
// still be pending on a stream: re-recording it later is safe (CUDA's cudaEventRecord replaces
// the event's state; stream waits already enqueued keep the state they captured), so a holder
// releases an event as soon as it no longer queries it itself.
template <class Event> class EventPool {
  public:
    using Create = std::function<Event()>;
    using Destroy = std::function<void(Event)>;

    EventPool(Create create, Destroy destroy)
        : create_(std::move(create)), destroy_(std::move(destroy)) {}
    // Destroys the cached events, unless abandon() was called.
    ~EventPool() {
        if (abandoned_) return;
        for (Event e : idle_)
            destroy_(e);
    }
    EventPool(const EventPool&) = delete;
    EventPool& operator=(const EventPool&) = delete;

    // A cached event, or a new one when none is idle.
    Event acquire() {
        {
            std::lock_guard<std::mutex> lock(m_);
            if (!idle_.empty()) {
                Event e = idle_.back();
                idle_.pop_back();
                return e;
            }
            ++created_;
        }
        return create_(); // outside the lock: a driver call
    }
    // Back into the cache; after abandon() the event is dropped untouched.
    void release(Event e) {
        std::lock_guard<std::mutex> lock(m_);
        if (!abandoned_) idle_.push_back(e);
    }
    // After the communicator was aborted: its events may belong to work that never completes, so
    // none is handed out, queried or destroyed again (the few left behind die with the process,
    // which is being ended).
    void abandon() {
        std::lock_guard<std::mutex> lock(m_);
        abandoned_ = true;
        idle_.clear();
    }
    bool abandoned() const {
        std::lock_guard<std::mutex> lock(m_);
        return abandoned_;
    }
    std::size_t created() const { // events created so far
        std::lock_guard<std::mutex> lock(m_);
        return created_;
    }
    std::size_t idle() const { // cached, ready to be handed out
        std::lock_guard<std::mutex> lock(m_);
        return idle_.size();
    }

  private:
    Create create_;
    Destroy destroy_;
    mutable std::mutex m_;
    std::vector<Event> idle_;
    std::size_t created_ = 0;
    bool abandoned_ = false;
};

} // namespace trainscope::dist
