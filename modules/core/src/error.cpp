// Names of the error kinds, as printed in error lines and stored in failed run files.
#include "trainscope/core/error.hpp"

namespace trainscope::core {

const char* to_string(ErrorKind kind) {
    switch (kind) {
    case ErrorKind::Config:
        return "configuration error";
    case ErrorKind::Input:
        return "input error";
    case ErrorKind::Output:
        return "output error";
    case ErrorKind::Distributed:
        return "distributed error";
    case ErrorKind::Numerical:
        return "numerical error";
    case ErrorKind::Internal:
        return "internal error";
    }
    return "error";
}

} // namespace trainscope::core
