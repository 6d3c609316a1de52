// Rank-aware logging: every line carries "[rank r/N host]"; info lines print on rank 0 only,
// warnings and errors on every rank. A line is written with one call so ranks do not interleave.
#pragma once

#include <sstream>
#include <string>

namespace trainscope::core::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

void set_identity(int rank, int world_size, const std::string& host);
void set_level(Level level);
Level parse_level(const std::string& name); // debug|info|warn|error, throws ConfigError
int rank();

class Line {
  public:
    Line(Level level, bool all_ranks);
    Line(const Line&) = delete;
    Line& operator=(const Line&) = delete;
    ~Line();
    template <class T> Line& operator<<(const T& value) {
        if (enabled_) stream_ << value;
        return *this;
    }

  private:
    Level level_;
    bool enabled_;
    std::ostringstream stream_;
};

inline Line debug() {
    return Line(Level::Debug, false);
}
inline Line info() {
    return Line(Level::Info, false);
}
inline Line info_all() {
    return Line(Level::Info, true);
} // info from every rank
inline Line warn() {
    return Line(Level::Warn, true);
}
inline Line error() {
    return Line(Level::Error, true);
}

} // namespace trainscope::core::log
