// The two parts of the schema table (schema_table.cpp, schema_table_results.cpp).
#pragma once

#include <vector>

#include "trainscope/io/schema.hpp"

namespace trainscope::io::schema {

// /summary, /comm, /telemetry, /profile: appended to the table after the run's description.
const std::vector<Entry>& result_entries();

} // namespace trainscope::io::schema
