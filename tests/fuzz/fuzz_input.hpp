// Helpers shared by the libFuzzer targets and the regression tests: the input as a named file (the
// parsers read paths, and a JSONL dataset is recognised by its name), the split of one input into
// a file and extra parts, and a command line to parse. The file lives in a memfd reached through a
// symlink, so no disk write per execution.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "trainscope/core/config.hpp"

namespace trainscope::fuzz {

// A file named `name` (e.g. "data.jsonl") whose content is replaced on every write().
class FuzzFile {
  public:
    explicit FuzzFile(const std::string& name) {
        fd_ = ::memfd_create(name.c_str(), MFD_CLOEXEC);
        char tmpl[] = "/tmp/trainscope-fuzz-XXXXXX";
        if (fd_ < 0 || !::mkdtemp(tmpl)) {
            std::perror("trainscope fuzz: memfd_create/mkdtemp");
            std::abort();
        }
        dir_ = tmpl;
        path_ = (dir_ / name).string();
        std::filesystem::create_symlink("/proc/self/fd/" + std::to_string(fd_), path_);
    }
    ~FuzzFile() {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
        ::close(fd_);
    }
    FuzzFile(const FuzzFile&) = delete;
    FuzzFile& operator=(const FuzzFile&) = delete;

    // Replaces the content; returns the path to give to the parser.
    const std::string& write(std::string_view bytes) {
        if (::ftruncate(fd_, 0) != 0 ||
            ::pwrite(fd_, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
            std::perror("trainscope fuzz: writing the memfd");
            std::abort();
        }
        return path_;
    }
    const std::string& path() const { return path_; }

  private:
    int fd_ = -1;
    std::filesystem::path dir_;
    std::string path_;
};

// The input up to the first NUL byte (the file), and the NUL-separated parts after it.
struct SplitInput {
    std::string_view file;
    std::vector<std::string_view> parts;
};

inline SplitInput split_at_nul(const std::uint8_t* data, std::size_t size) {
    const std::string_view all(reinterpret_cast<const char*>(data), size);
    SplitInput in;
    const auto nul = all.find('\0');
    in.file = all.substr(0, nul);
    if (nul == std::string_view::npos) return in;
    std::string_view rest = all.substr(nul + 1);
    while (true) {
        const auto next = rest.find('\0');
        in.parts.push_back(rest.substr(0, next));
        if (next == std::string_view::npos) break;
        rest = rest.substr(next + 1);
    }
    return in;
}

// core::CommandLine::parse of the command line "trainscope <args...>".
inline core::CommandLine parse_command_line(const core::OptionRegistry& registry,
                                            std::vector<std::string> args) {
    args.insert(args.begin(), "trainscope");
    std::vector<const char*> argv;
    for (const auto& a : args)
        argv.push_back(a.c_str());
    return core::CommandLine::parse(registry, static_cast<int>(argv.size()), argv.data());
}

// Stops the run on a broken invariant: libFuzzer saves the input as a crash.
inline void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "trainscope fuzz: invariant broken: %s\n", what);
        std::abort();
    }
}

} // namespace trainscope::fuzz
