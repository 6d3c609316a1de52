// Rank-aware logging over spdlog. Identity is set once by the MPI runtime; before that lines print
// as rank 0/1. Every line: "[rank r/N host] 2026-11-28T21:05:03.123Z <message>", the time in UTC
// with milliseconds (spdlog's pattern), info on stdout, warnings and errors on stderr.
#include "trainscope/core/log.hpp"

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
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
// Two loggers (stdout for info and debug, stderr for warnings and errors) that format nothing but
// the prefix and the time: the message arrives finished. Flushed after every line, so that lines
// of ranks that die right after still reach the job's output.
struct Sinks {
    std::shared_ptr<spdlog::logger> out, err;
    Sinks()
        : out(std::make_shared<spdlog::logger>("trainscope.out",
                                               std::make_shared<spdlog::sinks::stdout_sink_mt>())),
          err(std::make_shared<spdlog::logger>("trainscope.err",
                                               std::make_shared<spdlog::sinks::stderr_sink_mt>())) {
        for (auto* l : {&out, &err}) {
            (*l)->set_level(spdlog::level::trace);
            (*l)->flush_on(spdlog::level::trace);
        }
        set_prefix("[rank 0/1 localhost] ");
    }
    void set_prefix(std::string prefix) {
        std::string escaped; // the pattern treats '%' as a flag
        for (char c : prefix)
            escaped += c == '%' ? std::string("%%") : std::string(1, c);
        const std::string pattern = escaped + "%Y-%m-%dT%H:%M:%S.%eZ %v";
        out->set_pattern(pattern, spdlog::pattern_time_type::utc);
        err->set_pattern(pattern, spdlog::pattern_time_type::utc);
    }
};
Sinks& sinks() {
    static Sinks s;
    return s;
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
    std::lock_guard<std::mutex> lock(output_mutex());
    sinks().set_prefix("[rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " " +
                       printable(host) + "] ");
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
    std::string text;
    if (level_ != Level::Info) text += std::string(tag(level_)) + ": ";
    // Messages quote file contents, paths and option values: a raw invalid byte would make the
    // job's output undecodable for every tool reading it as UTF-8.
    text += printable(stream_.str());
    static constexpr spdlog::level::level_enum kLevels[] = {
        spdlog::level::debug, spdlog::level::info, spdlog::level::warn, spdlog::level::err};
    std::lock_guard<std::mutex> lock(output_mutex());
    Sinks& s = sinks();
    (level_ >= Level::Warn ? s.err : s.out)
        ->log(kLevels[static_cast<int>(level_)], spdlog::string_view_t(text));
}

} // namespace trainscope::core::log
