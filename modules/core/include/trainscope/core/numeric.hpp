#pragma once
// Numeric constants shared by every module (one definition, so that unity builds see one name).
#include <limits>

namespace trainscope::core {

// "Not measured" in run-file series and summaries: written as NaN, never as 0.
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

} // namespace trainscope::core
