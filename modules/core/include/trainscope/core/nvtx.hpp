// NVTX ranges in the "trainscope" domain, so an `nsys profile` timeline shows trainscope's phases
// and collectives by name. Header-only (the CUDA toolkit's nvtx3); without CUDA every call compiles
// to nothing. Without a tool attached an NVTX call is one branch on an uninitialised pointer.
// In core (no LibTorch, no MPI) so that phases (prof) and bucket collectives (dist) share it.
#pragma once

#include "trainscope/core/build_config.hpp"

#if TRAINSCOPE_HAVE_CUDA
#include <nvtx3/nvtx3.hpp>
#endif

namespace trainscope::nvtx {

#if TRAINSCOPE_HAVE_CUDA

// nvtx3 domain tag: ranges appear under "trainscope" in Nsight Systems.
struct Domain {
    static constexpr const char* name{"trainscope"};
};

// A range open for the lifetime of the object, on the calling thread (push/pop semantics).
class ScopedRange {
  public:
    explicit ScopedRange(const char* message) noexcept : range_(message) {}
    ScopedRange(const ScopedRange&) = delete;
    ScopedRange& operator=(const ScopedRange&) = delete;

  private:
    nvtx3::scoped_range_in<Domain> range_;
};

// A start/end range that may end on another thread or outside the scope that opened it, e.g. an
// asynchronous bucket allreduce launched in a backward hook and waited for later. Movable; ends at
// end() or destruction, whichever comes first.
class Range {
  public:
    Range() = default;
    explicit Range(const char* message) noexcept
        : handle_(nvtx3::start_range_in<Domain>(message)), open_(true) {}
    Range(Range&& o) noexcept : handle_(o.handle_), open_(o.open_) { o.open_ = false; }
    Range& operator=(Range&& o) noexcept {
        if (this != &o) {
            end();
            handle_ = o.handle_;
            open_ = o.open_;
            o.open_ = false;
        }
        return *this;
    }
    Range(const Range&) = delete;
    Range& operator=(const Range&) = delete;
    ~Range() { end(); }
    void end() noexcept {
        if (open_) nvtx3::end_range_in<Domain>(handle_);
        open_ = false;
    }

  private:
    nvtx3::range_handle handle_{};
    bool open_ = false;
};

// An instantaneous marker (e.g. "profiler window start").
inline void mark(const char* message) noexcept {
    nvtx3::mark_in<Domain>(message);
}

#else

class ScopedRange {
  public:
    explicit ScopedRange(const char*) noexcept {}
    ScopedRange(const ScopedRange&) = delete;
    ScopedRange& operator=(const ScopedRange&) = delete;
};

class Range {
  public:
    Range() = default;
    explicit Range(const char*) noexcept {}
    void end() noexcept {}
};

inline void mark(const char*) noexcept {}

#endif

} // namespace trainscope::nvtx
