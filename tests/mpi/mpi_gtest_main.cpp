// GoogleTest main for MPI suites: every rank runs every test; only rank 0 prints the usual report,
// other ranks print their failures. A failure on any rank makes that rank (and mpiexec) exit
// non-zero.
#include <gtest/gtest.h>
#include <mpi.h>

namespace {
class RankFailurePrinter : public testing::EmptyTestEventListener {
  public:
    explicit RankFailurePrinter(int rank) : rank_(rank) {}
    void OnTestPartResult(const testing::TestPartResult& r) override {
        if (r.failed())
            std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                         r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    }

  private:
    int rank_;
};
} // namespace

int main(int argc, char** argv) {
    int provided = 0;
    // trainscope's thread level (dist::kMpiThreadLevel; this main does not link the dist module).
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    testing::InitGoogleTest(&argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) {
        auto& listeners = testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter(rank));
    }
    int result = RUN_ALL_TESTS();
    // Every rank learns whether any rank failed, so the exit status is the same everywhere.
    int any_failed = 0;
    MPI_Allreduce(&result, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any_failed;
}
