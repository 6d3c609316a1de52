// Rank-aware logging. Identity is set once by the MPI runtime; before that lines print as rank 0/1.
#include "trainscope/core/log.hpp"

#include <cstdio>
#include <mutex>

#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"

namespace trainscope::core::log {
namespace {
struct Identity {
    int rank = 0;
    int world_size = 1;
    std::string host = "localhost";
    Level level = Level::Info;
};
Identity& identity() {
    static Identity id;
    return id;
}
std::mutex& output_mutex() {
    static std::mutex m;
    return m;
}
const char* tag(Level level) {
    switch (level) {
    case Level::Debug:
        return "debug";
    case Level::Info:
        return "info";
    case Level::Warn:
        return "warning";
    case Level::Error:
        return "error";
    }
    return "";
}
} // namespace

void set_identity(int rank, int world_size, const std::string& host) {
    identity().rank = rank;
    identity().world_size = world_size;
    identity().host = host;
}
void set_level(Level level) {
    identity().level = level;
}
int rank() {
    return identity().rank;
}

Level parse_level(const std::string& name) {
    if (name == "debug") return Level::Debug;
    if (name == "info") return Level::Info;
    if (name == "warn" || name == "warning") return Level::Warn;
    if (name == "error") return Level::Error;
    throw ConfigError("log.level = '" + name +
                      "' is not a log level; use debug, info, warn or error");
}

Line::Line(Level level, bool all_ranks)
    : level_(level), enabled_(level >= identity().level && (all_ranks || identity().rank == 0)) {}

Line::~Line() {
    if (!enabled_) return;
    const Identity& id = identity();
    std::string text = "[rank " + std::to_string(id.rank) + "/" + std::to_string(id.world_size) +
                       " " + id.host + "] ";
    if (level_ != Level::Info) text += std::string(tag(level_)) + ": ";
    // Messages quote file contents, paths and option values: a raw invalid byte would make the
    // job's output undecodable for every tool reading it as UTF-8.
    text += printable(stream_.str());
    text += '\n';
    std::FILE* out = level_ >= Level::Warn ? stderr : stdout;
    std::lock_guard<std::mutex> lock(output_mutex());
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
}

} // namespace trainscope::core::log
