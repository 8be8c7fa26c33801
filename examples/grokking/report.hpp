#pragma once
// grokking's outputs: the JSON summary (its field names are the public contract of the example)
// and the report page.
#include <string>

#include <nlohmann/json.hpp>

#include "grokking.hpp"

namespace grokking {

nlohmann::json summary_json(const Result& r);
std::string report_html(const Result& r);

}  // namespace grokking
