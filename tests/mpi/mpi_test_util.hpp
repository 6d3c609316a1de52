// Small helpers shared by the MPI test suites.
#pragma once

#include <mpi.h>

#include <cstdlib>
#include <string>

namespace trainscope::testing {

inline int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

inline int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

// A fresh directory under $TMPDIR (or /tmp) made by rank 0, its path broadcast to every rank;
// "" when it could not be made. `tag` names the suite in the directory name.
inline std::string shared_tmp_dir(const std::string& tag) {
    std::string made;
    if (world_rank() == 0) {
        const char* tmp = std::getenv("TMPDIR");
        std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ts_" + tag + "_XXXXXX";
        made = mkdtemp(pattern.data()) ? pattern : "";
    }
    int n = static_cast<int>(made.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    made.resize(static_cast<std::size_t>(n));
    MPI_Bcast(made.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
    return made;
}

} // namespace trainscope::testing
