#pragma once
// induction_heads' outputs: the JSON summary (field names fixed by /work/shared/API.md's
// "canonical experiments" section) and the report page.
#include <string>

#include <nlohmann/json.hpp>

#include "study.hpp"

namespace induction {

nlohmann::json summary_json(const StudyResult& r);
std::string report_html(const StudyResult& r);

}  // namespace induction
