// Checkpoint directories: atomic write protocol, discovery of the newest complete checkpoint,
// configuration check on resume, and the RNG/integer helpers the trainers' archives use.
#include "trainscope/train/checkpoint.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/train/run_control.hpp"
#include "trainscope/train/workload.hpp"

#if TRAINSCOPE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace fs = std::filesystem;

namespace trainscope::train {
namespace {

constexpr const char* kManifest = "MANIFEST.json";
constexpr const char* kPrefix = "ckpt-";
constexpr const char* kPartialPrefix = ".partial-ckpt-";
constexpr const char* kLock = ".lock";

std::string dir_name(std::int64_t iteration) {
    std::ostringstream o;
    o << std::setw(9) << std::setfill('0') << iteration;
    return o.str();
}

std::string rank_file(const std::string& dir, int rank) {
    std::ostringstream o;
    o << dir << "/rank" << std::setw(5) << std::setfill('0') << rank << ".pt";
    return o.str();
}

// A rank file that could not be read (`why`: the reader's strerror text), for the rank that wanted
// it or, when another rank of its node read it, for every rank that wanted it.
[[noreturn]] void unreadable(const CheckpointManifest& m, int rank, const std::string& why) {
    throw core::InputError("checkpoint file " + rank_file(m.path, rank) + " cannot be read: " +
                           why + " (delete " + m.path + " to resume from an older checkpoint)");
}

// fsync a file or directory so the data (or the directory entry) survive a node crash.
void sync_path(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw core::OutputError("cannot open " + path + " to sync it: " + std::strerror(errno));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    // Some file systems refuse fsync on directories (EINVAL): the rename is then as durable as
    // the file system makes it.
    if (rc != 0 && err != EINVAL)
        throw core::OutputError("fsync of " + path + " failed: " + std::strerror(err) +
                                " (is the checkpoint file system full?)");
}

// Complete checkpoints in dir, oldest first: (iteration, path).
std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& dir) {
    std::vector<std::pair<std::int64_t, std::string>> found;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(kPrefix, 0) != 0) continue;
        const std::string digits = name.substr(std::strlen(kPrefix));
        if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
        if (!fs::exists(e.path() / kManifest, ec)) continue;
        found.emplace_back(std::stoll(digits), e.path().string());
    }
    std::sort(found.begin(), found.end());
    return found;
}

// Rank 0's exclusive lock on <dir>/.lock (see checkpoint.hpp); returns its descriptor, or -1 when
// the file system does not support locks (a warning: concurrent jobs then go unnoticed). A lock
// held by another process is retried for a few seconds: a job that was just killed may still be
// torn down by the kernel when its successor (--resume) starts.
int lock_checkpoint_dir(const std::string& dir) {
    const std::string path = dir + "/" + kLock;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        throw core::OutputError("checkpoint.dir = '" + dir + "': cannot create its lock file " +
                                path + ": " + std::strerror(errno) +
                                " (choose a writable directory)");
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err == EINTR) continue;
        if (err != EWOULDBLOCK) {
            core::log::warn() << "checkpoint.dir = '" << dir << "': cannot lock " << path << " ("
                              << std::strerror(err)
                              << "): a second job using the same directory would not be noticed";
            ::close(fd);
            return -1;
        }
        if (std::chrono::steady_clock::now() > give_up) {
            std::ifstream f(path);
            std::string holder;
            std::getline(f, holder);
            ::close(fd);
            throw core::OutputError(
                "checkpoint.dir = '" + dir + "' is in use by another job (" +
                (holder.empty() ? std::string("its lock file ") + path : holder) +
                "): two jobs writing one checkpoint directory would delete each other's "
                "checkpoints and --resume could continue the wrong run. Give each job its own "
                "checkpoint.dir, or wait until the other job has ended");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const std::string holder = "pid " + std::to_string(::getpid()) + " on " + host + ", since " +
                               io::utc_now_iso8601() + "\n";
    if (::ftruncate(fd, 0) == 0) {
        const ssize_t written = ::pwrite(fd, holder.data(), holder.size(), 0);
        (void)written; // the holder's name is a courtesy; the lock is what protects
    }
    return fd;
}

// TRAINSCOPE_FAULT=checkpoint_stall:rank=R:iteration=I (a test hook): rank R writes the first half
// of its archive for the checkpoint that resumes at iteration I, says so and hangs, so that a
// test can kill it in the middle of the write.
[[noreturn]] void stall_while_writing(torch::serialize::OutputArchive& out,
                                      const std::string& file) {
    std::ostringstream bytes;
    out.save_to(bytes);
    const std::string all = bytes.str();
    {
        std::ofstream f(file, std::ios::binary);
        f.write(all.data(), static_cast<std::streamsize>(all.size() / 2));
    }
    sync_path(file);
    core::log::warn() << "TRAINSCOPE_FAULT: stalling while writing " << file << " ("
                      << all.size() / 2 << " of " << all.size() << " bytes written)";
    for (;;)
        std::this_thread::sleep_for(std::chrono::seconds(1));
}

// `text` with every byte outside printable ASCII as \xNN: the JSON parser's messages quote what
// it read, and a damaged manifest's bytes must not reach the terminal or the log raw.
std::string printable(const std::string& text) {
    std::string out;
    for (const unsigned char c : text) {
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            char hex[8];
            std::snprintf(hex, sizeof(hex), "\\x%02x", c);
            out += hex;
        }
    }
    return out;
}

[[noreturn]] void bad_manifest(const std::string& dir, const std::string& field,
                               const std::string& what) {
    throw core::InputError("checkpoint manifest " + dir + "/" + kManifest + ": field " + field +
                           " " + what + ", which no checkpoint of trainscope writes (delete " +
                           dir + " to resume from an older checkpoint)");
}

CheckpointManifest parse_manifest(const std::string& dir, const std::string& text) {
    CheckpointManifest m;
    m.path = dir;
    bool has_files = false;
    std::vector<std::string> files;
    try {
        const nlohmann::json j = nlohmann::json::parse(text);
        m.next_iteration = j.at("next_iteration").get<std::int64_t>();
        m.world_size = j.at("world_size").get<int>();
        m.restart_index = j.at("restart_index").get<int>();
        m.run_file = j.at("run_file").get<std::string>();
        m.created_utc = j.at("created_utc").get<std::string>();
        m.workload = j.at("workload").get<std::string>();
        m.global_batch = j.value("global_batch", std::int64_t{0}); // absent before elastic resume
        for (const auto& [k, v] : j.at("config").items())
            m.config.emplace_back(k, v.get<std::string>());
        if (j.contains("format") && j["format"] != "trainscope-checkpoint/1")
            throw core::InputError("checkpoint manifest " + dir + "/" + kManifest +
                                   ": field format is not trainscope-checkpoint/1 (delete that "
                                   "checkpoint directory to resume from an older one)");
        if (j.contains("files")) {
            has_files = true;
            files = j.at("files").get<std::vector<std::string>>();
        }
    } catch (const nlohmann::json::exception& e) {
        throw core::InputError("checkpoint manifest " + dir + "/" + kManifest +
                               " is not valid: " + printable(e.what()) +
                               " (delete that checkpoint directory to resume from an older one)");
    }
    // Values in range (a manifest is data: a hand-edited or damaged one must not size buffers,
    // divide by zero or name another job's files).
    if (m.next_iteration < 0)
        bad_manifest(dir, "next_iteration", "is " + std::to_string(m.next_iteration));
    if (m.world_size < 1 || m.world_size > (1 << 24))
        bad_manifest(dir, "world_size", "is " + std::to_string(m.world_size));
    if (m.restart_index < 0 || m.restart_index > 1000000)
        bad_manifest(dir, "restart_index", "is " + std::to_string(m.restart_index));
    if (m.global_batch < 0)
        bad_manifest(dir, "global_batch", "is " + std::to_string(m.global_batch));
    if (has_files) {
        if (static_cast<std::int64_t>(files.size()) != m.world_size)
            bad_manifest(dir, "files",
                         "lists " + std::to_string(files.size()) + " rank files for world_size " +
                             std::to_string(m.world_size));
        for (int r = 0; r < m.world_size; ++r)
            if (files[static_cast<std::size_t>(r)] !=
                fs::path(rank_file(dir, r)).filename().string())
                bad_manifest(dir, "files",
                             "entry " + std::to_string(r) + " is '" +
                                 printable(files[static_cast<std::size_t>(r)]) + "', not rank " +
                                 std::to_string(r) + "'s file");
    }
    // The interrupted run's file: the checkpointed job's own output.file or one of its
    // continuations (<stem>.resume<k><ext> beside it), never another path.
    std::string output;
    for (const auto& [k, v] : m.config)
        if (k == "output.file") output = v;
    if (m.run_file.empty() || output.empty() || !in_output_series(m.run_file, output))
        bad_manifest(dir, "run_file",
                     "'" + printable(m.run_file) +
                         "' is not the checkpointed job's output.file ('" + printable(output) +
                         "') or one of its <stem>.resume<k> continuations");
    return m;
}

} // namespace

bool in_output_series(const std::string& file, const std::string& output) {
    std::error_code ea, eb;
    const fs::path f = fs::weakly_canonical(fs::absolute(file, ea), ea);
    const fs::path o = fs::weakly_canonical(fs::absolute(output, eb), eb);
    if (ea || eb || f.parent_path() != o.parent_path()) return false;
    if (f.filename() == o.filename()) return true;
    const std::string name = f.filename().string();
    const std::string head = o.stem().string() + ".resume", tail = o.extension().string();
    if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
        return false;
    const std::string k = name.substr(head.size(), name.size() - head.size() - tail.size());
    return k.size() <= 7 &&
           std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool may_differ_on_resume(const std::string& key) {
    for (const char* prefix : {"output.", "log.", "checkpoint.", "profile.", "telemetry."})
        if (key.rfind(prefix, 0) == 0) return true;
    // Memory and scheduling policies change where tensors live and when they move, not the
    // arithmetic: a run resumed after an out-of-memory failure may change them.
    return key == "run.iteration_timeout" || key == "run.nonfinite" || key == "dist.timeout" ||
           key == "data.workers" || key == "data.prefetch" || key == "data.pin_memory" ||
           key == "run.host_memory" || key == "dist.reshard_after_forward" ||
           key == "dist.prefetch" || key == "llm.save_adapters";
}

bool is_batch_option(const std::string& key) {
    return key == "train.batch_size" || key == "train.global_batch_size" ||
           key == "run.global_batch" || key == "run.batch_per_rank";
}

Checkpointer::Checkpointer(std::string dir, int keep, MPI_Comm world, const core::Config& config,
                           std::string run_file, int restart_index, std::int64_t global_batch)
    : dir_(std::move(dir)), keep_(keep), world_(world), config_(config),
      run_file_(std::move(run_file)), restart_index_(restart_index), global_batch_(global_batch),
      timeout_s_(config.get_float("dist.timeout")) {
    MPI_Comm_rank(world, &rank_);
    MPI_Comm_size(world, &size_);
    if (!enabled()) return;
    // Checked at start, so a wrong directory fails now and not at the first checkpoint hours in.
    agree([&] {
        if (rank_ != 0) return;
        std::error_code ec;
        if (fs::exists(dir_, ec) && !fs::is_directory(dir_, ec))
            throw core::OutputError("checkpoint.dir = '" + dir_ +
                                    "' exists but is not a directory (a file?): give a "
                                    "directory, or a path that does not exist yet");
        fs::create_directories(dir_, ec);
        if (ec || !fs::is_directory(dir_))
            throw core::OutputError("checkpoint.dir = '" + dir_ + "' cannot be created: " +
                                    (ec ? ec.message() : std::string("not a directory")) +
                                    " (choose a writable directory on a shared file system)");
        if (::access(dir_.c_str(), W_OK | X_OK) != 0)
            throw core::OutputError("checkpoint.dir = '" + dir_ + "' is not writable: " +
                                    std::strerror(errno) + " (choose a writable directory)");
        lock_fd_ = lock_checkpoint_dir(dir_);
    });
}

Checkpointer::~Checkpointer() {
    if (lock_fd_ >= 0) ::close(lock_fd_); // releases the flock
}

void Checkpointer::agree(const std::function<void()>& fn) const {
    dist::agree_on_errors(world_, fn, timeout_s_);
}

std::string Checkpointer::save(std::int64_t next_iteration,
                               const std::function<void(torch::serialize::OutputArchive&)>& fill) {
    if (!enabled()) throw core::InternalError("Checkpointer::save without checkpoint.dir");
    const std::string partial = dir_ + "/" + kPartialPrefix + dir_name(next_iteration);
    const std::string final_dir = dir_ + "/" + kPrefix + dir_name(next_iteration);
    auto fail = [&](const std::string& what, const std::error_code& ec) {
        return core::OutputError("checkpoint " + final_dir + ": " + what + ": " + ec.message() +
                                 " (free space in checkpoint.dir or choose another one; the "
                                 "previous checkpoint is kept)");
    };
    // Every step ends in an agreement of all ranks, bounded by dist.timeout: a rank that stalls
    // while writing costs its peers that long, not forever.
    // 1. rank 0 prepares an empty partial directory (left-overs of a crashed save are removed).
    agree([&] {
        if (rank_ != 0) return;
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(dir_, ec))
            if (e.path().filename().string().rfind(kPartialPrefix, 0) == 0)
                fs::remove_all(e.path(), ec);
        fs::create_directories(partial, ec);
        if (ec) throw fail("cannot create " + partial, ec);
    });
    // 2. every rank writes and syncs its archive.
    agree([&] {
        torch::serialize::OutputArchive out;
        write_int(out, "next_iteration", next_iteration);
        write_int(out, "rank", rank_);
        fill(out);
        const std::string file = rank_file(partial, rank_);
        if (FaultInjection::from_environment().fires(FaultInjection::Kind::CheckpointStall, rank_,
                                                     next_iteration))
            stall_while_writing(out, file);
        try {
            out.save_to(file);
        } catch (const c10::Error& e) {
            throw core::OutputError("checkpoint: writing " + file +
                                    " failed: " + std::string(e.what_without_backtrace()) +
                                    " (is checkpoint.dir full or read-only?)");
        }
        sync_path(file);
    });
    // 3. rank 0 seals it: manifest, sync, atomic rename, sync the parent, prune old ones.
    agree([&] {
        if (rank_ != 0) return;
        nlohmann::json j;
        j["format"] = "trainscope-checkpoint/1";
        j["next_iteration"] = next_iteration;
        j["world_size"] = size_;
        j["restart_index"] = restart_index_;
        j["run_file"] = run_file_;
        j["created_utc"] = io::utc_now_iso8601();
        j["workload"] = config_.get_string("run.workload");
        j["global_batch"] = global_batch_;
        j["trainscope_version"] = TRAINSCOPE_VERSION;
        nlohmann::json cfg = nlohmann::json::object();
        for (const auto& [k, v] : config_.items())
            cfg[k] = v;
        j["config"] = cfg;
        std::vector<std::string> files;
        for (int r = 0; r < size_; ++r)
            files.push_back(fs::path(rank_file(partial, r)).filename().string());
        j["files"] = files;
        const std::string manifest = partial + "/" + kManifest;
        {
            std::ofstream f(manifest);
            f << j.dump(2) << "\n";
            f.flush();
            if (!f)
                throw core::OutputError("checkpoint: writing " + manifest + " failed: " +
                                        std::strerror(errno) + " (is checkpoint.dir full?)");
        }
        sync_path(manifest);
        sync_path(partial);
        std::error_code ec;
        if (fs::exists(final_dir, ec)) fs::remove_all(final_dir, ec); // an older run's, same step
        fs::rename(partial, final_dir, ec);
        if (ec) throw fail("cannot rename " + partial, ec);
        sync_path(dir_);
        auto all = complete_checkpoints(dir_);
        while (static_cast<int>(all.size()) > keep_) {
            fs::remove_all(all.front().second, ec);
            all.erase(all.begin());
        }
    });
    return final_dir;
}

CheckpointManifest Checkpointer::find_latest(const std::string& dir, MPI_Comm world,
                                             double timeout_s) {
    int rank = 0;
    MPI_Comm_rank(world, &rank);
    std::string text, path;
    // Rank 0 looks; every rank gets the verdict.
    const auto look = [&] {
        if (dir.empty())
            throw core::ConfigError("--resume needs checkpoint.dir: the directory the "
                                    "interrupted run wrote its checkpoints to");
        if (rank != 0) return;
        if (fs::exists(dir) && !fs::is_directory(dir))
            throw core::InputError("--resume: checkpoint.dir = '" + dir +
                                   "' is not a directory (a file?): give the directory the "
                                   "interrupted run wrote its checkpoints to");
        if (!fs::is_directory(dir))
            throw core::InputError("--resume: checkpoint.dir = '" + dir +
                                   "' does not exist (run without --resume to start afresh)");
        const auto all = complete_checkpoints(dir);
        if (all.empty())
            throw core::InputError("--resume: no complete checkpoint (ckpt-*/" +
                                   std::string(kManifest) + ") in checkpoint.dir = '" + dir +
                                   "' (run without --resume to start afresh)");
        path = all.back().second;
        std::ifstream f(path + "/" + kManifest);
        std::ostringstream s;
        s << f.rdbuf();
        text = s.str();
        parse_manifest(path, text); // a broken manifest fails here, on every rank
    };
    dist::agree_on_errors(world, look, timeout_s);
    text = core::broadcast_string(world, text, 0, timeout_s);
    path = core::broadcast_string(world, path, 0, timeout_s);
    return parse_manifest(path, text);
}

void Checkpointer::check_compatible(const CheckpointManifest& m, const core::Config& config,
                                    const ParallelLayout& layout) {
    const int world_size = layout.world_size;
    const std::int64_t global_batch = layout.global_batch();
    std::map<std::string, std::string> saved(m.config.begin(), m.config.end());
    std::string diffs;
    int count = 0;
    // With the global batch recorded, the batch options are compared through it (below).
    const bool by_global_batch = m.global_batch > 0;
    for (const auto& [k, v] : config.items()) {
        if (may_differ_on_resume(k) || (by_global_batch && is_batch_option(k))) continue;
        const auto it = saved.find(k);
        if (it != saved.end() && it->second == v) continue;
        if (count++ < 8)
            diffs += std::string(count > 1 ? "; " : " ") + k + ": checkpoint '" +
                     (it == saved.end() ? std::string("<not set>") : it->second) + "', now '" + v +
                     "'";
    }
    if (m.world_size != world_size) {
        const std::string why = layout.elastic_refusal(m.world_size, by_global_batch);
        if (!why.empty())
            throw core::ConfigError("--resume: checkpoint " + m.path + " was written by " +
                                    std::to_string(m.world_size) + " ranks, this job has " +
                                    std::to_string(world_size) + ", and " + why +
                                    ": resume with the same number of ranks");
    }
    if (by_global_batch && global_batch != m.global_batch)
        throw core::ConfigError(
            "--resume: this job's global batch is " + std::to_string(global_batch) +
            " samples per step (" + std::to_string(world_size) + " ranks), checkpoint " + m.path +
            " trained with " + std::to_string(m.global_batch) + " (" +
            std::to_string(m.world_size) + " ranks): keep " + std::to_string(m.global_batch) +
            " samples per step (train.global_batch_size=" + std::to_string(m.global_batch) +
            " without train.batch_size, or run.scaling=strong with run.global_batch=" +
            std::to_string(m.global_batch) +
            ") so that the resumed run continues the same optimizer trajectory");
    if (count > 0)
        throw core::ConfigError("--resume: the configuration differs from checkpoint " + m.path +
                                " in " + std::to_string(count) +
                                " option(s) that change what is "
                                "trained:" +
                                diffs +
                                ". Resume with the original configuration, or start a new run");
}

void Checkpointer::load(const CheckpointManifest& m, int rank, torch::serialize::InputArchive& in,
                        torch::Device device, const std::string* bytes) {
    const std::string file = rank_file(m.path, rank);
    std::int64_t saved_rank = -1, saved_iteration = -1;
    // One open() per file: LibTorch's load_from(file) opens it twice (format probe, then read).
    std::string mine;
    if (!bytes) {
        const std::string error = core::read_whole_file(file, mine);
        if (!error.empty()) unreadable(m, rank, error);
        bytes = &mine;
    }
    try {
        in.load_from(bytes->data(), bytes->size(), device);
        saved_rank = read_int(in, "rank");
        saved_iteration = read_int(in, "next_iteration");
    } catch (const c10::Error& e) {
        throw core::InputError("checkpoint file " + file +
                               " cannot be read: " + std::string(e.what_without_backtrace()) +
                               " (delete " + m.path + " to resume from an older checkpoint)");
    }
    // Each rank file says whose state it holds: swapped files, or one from another checkpoint,
    // would resume silently from mixed state.
    if (saved_rank != rank || saved_iteration != m.next_iteration)
        throw core::InputError("checkpoint file " + file + " holds rank " +
                               std::to_string(saved_rank) + "'s state for iteration " +
                               std::to_string(saved_iteration) + ", but the manifest " + kManifest +
                               " expects rank " + std::to_string(rank) + " at iteration " +
                               std::to_string(m.next_iteration) +
                               " (rank files swapped or copied from another checkpoint): delete " +
                               m.path + " to resume from an older checkpoint");
}

CheckpointShards::CheckpointShards(const CheckpointManifest& m, torch::Device device,
                                   MPI_Comm world, const std::vector<int>& wanted)
    : manifest_(m), device_(device) {
    archives_.resize(static_cast<std::size_t>(std::max(m.world_size, 0)));
    core::NodeComm node(world);
    // Which saved ranks every rank of the node wants ("0,3"): a few bytes per local rank.
    std::string mine;
    for (int r : wanted)
        if (r >= 0 && r < m.world_size) mine += std::to_string(r) + ",";
    std::map<int, std::vector<int>> wanted_by; // saved rank -> local ranks that want it
    const std::vector<std::string> all = core::allgather_strings(node.get(), mine);
    for (int local = 0; local < node.size(); ++local) {
        std::istringstream in(all[static_cast<std::size_t>(local)]);
        std::string r;
        while (std::getline(in, r, ','))
            if (!r.empty()) {
                auto& who = wanted_by[std::stoi(r)];
                if (who.empty() || who.back() != local) who.push_back(local);
            }
    }
    // The same order on every rank of the node: one broadcast per shared file.
    for (const auto& [r, who] : wanted_by) {
        if (who.size() < 2) continue; // one reader: rank() reads it
        core::SharedFile f = core::read_file_on_node(node.get(), rank_file(m.path, r), who.front());
        if (std::find(who.begin(), who.end(), node.rank()) == who.end()) continue;
        if (f.error.empty())
            shared_[r] = std::move(f.bytes);
        else
            failed_[r] = std::move(f.error);
    }
}

torch::serialize::InputArchive& CheckpointShards::rank(int r) {
    auto& slot = archives_.at(static_cast<std::size_t>(r));
    if (!slot) {
        if (const auto bad = failed_.find(r); bad != failed_.end())
            unreadable(manifest_, r, bad->second);
        auto in = std::make_unique<torch::serialize::InputArchive>();
        const auto it = shared_.find(r);
        Checkpointer::load(manifest_, r, *in, device_, it == shared_.end() ? nullptr : &it->second);
        if (it != shared_.end()) shared_.erase(it); // the archive holds its own copies
        slot = std::move(in);
    }
    return *slot;
}

torch::Tensor CheckpointShards::reshard(const std::string& sub, const std::string& name,
                                        std::int64_t numel, int new_rank, int new_world) {
    const int old_world = manifest_.world_size;
    const std::int64_t old_shard = (numel + old_world - 1) / old_world;
    const std::int64_t new_shard = (numel + new_world - 1) / new_world;
    const std::int64_t begin = std::min(numel, new_rank * new_shard);
    const std::int64_t end = std::min(numel, begin + new_shard);
    std::vector<torch::Tensor> pieces;
    torch::Tensor like;
    for (std::int64_t at = begin; at < end;) {
        const int r = static_cast<int>(at / old_shard);
        torch::serialize::InputArchive part;
        rank(r).read(sub, part);
        torch::Tensor t;
        part.read(name, t, /*is_buffer=*/true);
        if (t.numel() != old_shard)
            throw core::InputError(
                "checkpoint file " + rank_file(manifest_.path, r) + ": " + sub + "/" + name +
                " has " + std::to_string(t.numel()) + " elements, a shard of " +
                std::to_string(numel) + " over " + std::to_string(old_world) + " ranks has " +
                std::to_string(old_shard) + ": resume with the same model and method");
        const std::int64_t from = at - r * old_shard;
        const std::int64_t take = std::min(end - at, old_shard - from);
        pieces.push_back(t.narrow(0, from, take));
        like = t;
        at += take;
    }
    if (!like.defined()) { // this rank's shard lies wholly in the padding
        torch::serialize::InputArchive part;
        rank(0).read(sub, part);
        part.read(name, like, /*is_buffer=*/true);
    }
    torch::Tensor out = torch::zeros({new_shard}, like.options());
    if (!pieces.empty()) out.narrow(0, 0, end - begin).copy_(torch::cat(pieces));
    return out;
}

namespace {

// A module's parameters (only those that require grad when trainable_only) and, unless
// trainable_only, its buffers, by name. The tensors share the module's storage.
std::pair<dist::TrainableSet, dist::TrainableSet> named_tensors(const torch::nn::Module& module,
                                                                bool trainable_only) {
    dist::TrainableSet params, buffers;
    for (const auto& p : module.named_parameters(/*recurse=*/true))
        if (!trainable_only || p.value().requires_grad()) {
            params.names.push_back(p.key());
            params.tensors.push_back(p.value());
        }
    if (!trainable_only)
        for (const auto& b : module.named_buffers(/*recurse=*/true)) {
            buffers.names.push_back(b.key());
            buffers.tensors.push_back(b.value());
        }
    return {std::move(params), std::move(buffers)};
}

} // namespace

void save_named_tensors(torch::serialize::OutputArchive& out, const torch::nn::Module& module,
                        bool trainable_only) {
    const auto [params, buffers] = named_tensors(module, trainable_only);
    dist::save_tensors(out, params.names, params.tensors);
    dist::save_tensors(out, buffers.names, buffers.tensors, /*buffers=*/true);
}

void load_named_tensors(torch::serialize::InputArchive& in, torch::nn::Module& module,
                        const std::string& where, bool trainable_only) {
    auto [params, buffers] = named_tensors(module, trainable_only);
    dist::load_tensors(in, params.names, params.tensors, where);
    dist::load_tensors(in, buffers.names, buffers.tensors, where, /*buffers=*/true);
}

void write_int(torch::serialize::OutputArchive& out, const std::string& key, std::int64_t v) {
    out.write(key, c10::IValue(v));
}

std::int64_t read_int(torch::serialize::InputArchive& in, const std::string& key) {
    c10::IValue v;
    in.read(key, v);
    return v.toInt();
}

void save_rng_state(torch::serialize::OutputArchive& out, int cuda_index) {
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    out.write("rng_cpu", cpu.get_state(), /*is_buffer=*/true);
#if TRAINSCOPE_HAVE_CUDA
    if (cuda_index >= 0) {
        at::Generator cuda =
            at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(cuda_index));
        out.write("rng_cuda", cuda.get_state(), /*is_buffer=*/true);
    }
#else
    (void)cuda_index;
#endif
}

void load_rng_state(torch::serialize::InputArchive& in, int cuda_index) {
    torch::Tensor cpu;
    in.read("rng_cpu", cpu, /*is_buffer=*/true);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(cpu.cpu());
#if TRAINSCOPE_HAVE_CUDA
    if (cuda_index >= 0) {
        torch::Tensor cuda;
        in.read("rng_cuda", cuda, /*is_buffer=*/true);
        at::Generator generator =
            at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(cuda_index));
        generator.set_state(cuda.cpu());
    }
#else
    (void)cuda_index;
#endif
}

} // namespace trainscope::train
