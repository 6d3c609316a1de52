#include "mpi_progress.hpp"

namespace trainscope::dist::detail {

MpiSerializer g_mpi_serializer;

void MpiWork::wait_done(std::unique_lock<std::mutex>& lock) {
    const auto finished = [&] { return done_; };
    if (timeout_s_ <= 0) {
        cv_.wait(lock, finished);
        return;
    }
    if (cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), finished)) return;
    lock.unlock();
    const std::string why = core::peer_timeout_message(what_, timeout_s_);
    if (state_) state_->mark_broken(why);
    throw core::PeerTimeoutError(why);
}

void progress_loop(std::shared_ptr<ProgressState> s) {
    for (;;) {
        Task task;
        {
            std::unique_lock<std::mutex> lock(s->m);
            s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
            if (s->queue.empty()) return; // stop requested and nothing left
            task = std::move(s->queue.front());
            s->queue.pop_front();
            s->running = true;
        }
        std::exception_ptr error;
        const auto t0 = Clock::now();
        try {
            if (!s->usable()) throw s->broken_error(); // never start what no peer will match
            std::lock_guard<std::mutex> mpi(mpi_serializer().mpi);
            task.run();
        } catch (...) {
            error = std::current_exception();
        }
        mpi_serializer().finished(); // done with MPI
        const double seconds = seconds_since(t0);
        {
            std::lock_guard<std::mutex> lock(s->m);
            s->running = false;
        }
        s->cv.notify_all();
        // The closure's tensors (a staged copy of the input, say) are released before the waiter
        // resumes: released after finish(), they lived on for a moment the waiter could not
        // predict, and the host tensor counter's end-of-iteration reading varied by that copy.
        std::shared_ptr<MpiWork> work = std::move(task.work);
        task.run = nullptr;
        work->finish(error, seconds);
    }
}

} // namespace trainscope::dist::detail
