// Typed errors: every failure a user can cause or fix has its own type, a message that names the
// option/file/value and the fix, and a distinct process exit code (documented in the README).
#pragma once

#include <stdexcept>
#include <string>

namespace trainscope::core {

enum class ErrorKind {
    Config = 2,      // bad option, value or combination of options
    Input = 3,       // missing, unreadable or corrupt input (dataset, checkpoint, ...)
    Output = 4,      // output file cannot be created or written
    Distributed = 5, // MPI/NCCL/device-binding failures, a peer rank failed, a stalled iteration
    Numerical = 6,   // non-finite loss or gradients with run.nonfinite=abort
    Internal = 70,   // a bug in trainscope (EX_SOFTWARE)
};

const char* to_string(ErrorKind kind);

class Error : public std::runtime_error {
  public:
    Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
    ErrorKind kind() const { return kind_; }
    int exit_code() const { return static_cast<int>(kind_); }
    // True when every rank raised this error together (e.g. after dist::agree_on_errors), so the
    // ranks can finalize MPI cleanly instead of aborting the world.
    bool collective() const { return collective_; }
    void set_collective(bool collective) { collective_ = collective; }

  private:
    ErrorKind kind_;
    bool collective_ = false;
};

struct ConfigError : Error {
    explicit ConfigError(const std::string& m) : Error(ErrorKind::Config, m) {}
};
struct InputError : Error {
    explicit InputError(const std::string& m) : Error(ErrorKind::Input, m) {}
};
struct OutputError : Error {
    explicit OutputError(const std::string& m) : Error(ErrorKind::Output, m) {}
};
struct DistributedError : Error {
    explicit DistributedError(const std::string& m) : Error(ErrorKind::Distributed, m) {}
};
// A wait for the peers that exceeded dist.timeout (core::wait_for_peers and the communicators):
// the peers cannot be reached, so nothing may try to agree with them about it (agree_on_errors
// rethrows it at once) and the job is aborted.
struct PeerTimeoutError : DistributedError {
    explicit PeerTimeoutError(const std::string& m) : DistributedError(m) {}
};
struct NumericalError : Error {
    explicit NumericalError(const std::string& m) : Error(ErrorKind::Numerical, m) {}
};
struct InternalError : Error {
    explicit InternalError(const std::string& m) : Error(ErrorKind::Internal, m) {}
};

} // namespace trainscope::core
