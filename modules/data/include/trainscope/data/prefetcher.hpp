// Prefetcher<T>: worker threads build items 0..count-1 (a batch, or an LLM iteration's
// micro-batches) into a ring of `depth` slots while the training thread computes, so that the
// training thread's "data" phase is only the wait for an item that is, in the steady state,
// already built. Items come out in index order whatever the worker count; an exception thrown while
// building item k is rethrown by the next() that would have returned k, and by every later call.
// One implementation for every workload's loader (data::Loader for images, the LLM's text batches).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace trainscope::data {

namespace detail {
// Worker threads run LibTorch ops (gather, transforms, collation) on one intra-op thread each, so
// that `workers` loader threads never oversubscribe the rank's cores (defined in loader.cpp).
void limit_intra_op_threads_of_this_thread();
} // namespace detail

template <class T> class Prefetcher {
  public:
    // build(k) makes item k; it is called concurrently from `workers` threads (0: on the calling
    // thread inside next(), no prefetching). depth >= 1 items are built ahead.
    Prefetcher(std::int64_t count, int workers, int depth, std::function<T(std::int64_t)> build)
        : count_(count), depth_(depth < 1 ? 1 : depth), build_(std::move(build)),
          ring_(static_cast<std::size_t>(depth_)) {
        const std::int64_t threads = std::min<std::int64_t>(workers, count_);
        for (std::int64_t t = 0; t < threads; ++t)
            threads_.emplace_back([this] { work(); });
    }
    ~Prefetcher() { // stops and joins the workers, also in the middle of the items
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        work_cv_.notify_all();
        // A worker in the middle of build() finishes that one item, then sees stop_.
        for (auto& t : threads_)
            t.join();
    }
    Prefetcher(const Prefetcher&) = delete;
    Prefetcher& operator=(const Prefetcher&) = delete;

    std::int64_t count() const { return count_; }

    // The next item in order; nullopt after the last one.
    std::optional<T> next() {
        if (failed_) std::rethrow_exception(failed_);
        if (next_pop_ >= count_) return std::nullopt;
        const std::int64_t k = next_pop_;
        if (threads_.empty()) {
            try {
                T item = build_(k);
                ++next_pop_;
                return item;
            } catch (...) {
                failed_ = std::current_exception();
                throw;
            }
        }
        Slot slot;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            Slot& s = ring_[static_cast<std::size_t>(k % depth_)];
            ready_cv_.wait(lock, [&s] { return s.ready; });
            slot = std::move(s);
            s = Slot{};
            ++next_pop_;
            if (slot.error) {
                // Stop building: nothing can go on past an item that failed.
                failed_ = slot.error;
                stop_ = true;
            }
        }
        work_cv_.notify_all();
        if (slot.error) std::rethrow_exception(slot.error);
        return std::move(slot.item);
    }

  private:
    struct Slot {
        std::optional<T> item;
        std::exception_ptr error;
        bool ready = false;
    };

    void work() {
        detail::limit_intra_op_threads_of_this_thread();
        std::unique_lock<std::mutex> lock(mutex_);
        while (true) {
            // Claim the next item once its ring slot is free (k < next_pop_ + depth).
            work_cv_.wait(lock, [this] {
                return stop_ || next_build_ >= count_ || next_build_ < next_pop_ + depth_;
            });
            if (stop_ || next_build_ >= count_) return;
            const std::int64_t k = next_build_++;
            lock.unlock();
            Slot result;
            try {
                result.item = build_(k);
            } catch (...) {
                result.error = std::current_exception();
            }
            lock.lock();
            result.ready = true;
            ring_[static_cast<std::size_t>(k % depth_)] = std::move(result);
            ready_cv_.notify_all();
        }
    }

    std::int64_t count_;
    int depth_;
    std::function<T(std::int64_t)> build_;
    std::mutex mutex_;
    std::condition_variable work_cv_;  // workers: a slot became free, or stop
    std::condition_variable ready_cv_; // next(): an item became ready
    std::vector<Slot> ring_;           // item k lives in ring_[k % depth]
    std::int64_t next_build_ = 0;      // next index a worker claims
    std::int64_t next_pop_ = 0;        // next index next() returns
    bool stop_ = false;
    std::exception_ptr failed_; // sticky after the first error
    std::vector<std::thread> threads_;
};

} // namespace trainscope::data
