// Fuzzes the plan table parser (collectives/planner.h): ParsePlan on any text must return a plan
// or an error, never crash; a plan it accepts must print (Plan::ToString) as text that parses
// back to the same plan up to the printed precision of the figures, as planner.h promises.
// Input: the plan table as poseidon_plan and psdGetPlan print it (corpus/plan/).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "collectives/planner.h"

namespace {

void Fail(const std::string& what, const std::string& text, const std::string& printed) {
  std::fprintf(stderr, "plan_fuzzer: %s\n--- input ---\n%s\n--- printed ---\n%s\n", what.c_str(),
               text.c_str(), printed.c_str());
  std::abort();
}

// Printed with %.9g (times in microseconds, scaled back by 1e-6 when parsed): equal up to
// that precision, except where the scaling leaves the normal range of double.
bool SameFigure(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == b) return true;
  double scale = std::max(std::fabs(a), std::fabs(b));
  return std::fabs(a - b) <= 1e-8 * scale || scale < 1e-290;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto plan = poseidon::ParsePlan(text);
  if (!plan.ok()) {
    (void)plan.status().ToString();
    return 0;
  }
  const std::string printed = plan->ToString();
  auto again = poseidon::ParsePlan(printed);
  if (!again.ok()) Fail("the printed plan does not parse: " + again.status().ToString(), text,
                        printed);
  const poseidon::Plan& a = *plan;
  const poseidon::Plan& b = *again;
  if (a.world != b.world || a.batch != b.batch || a.model_source != b.model_source) {
    Fail("the header changed in the round trip", text, printed);
  }
  if (a.entries.size() != b.entries.size()) {
    Fail("the round trip has " + std::to_string(b.entries.size()) + " layers, not " +
             std::to_string(a.entries.size()),
         text, printed);
  }
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const poseidon::PlanEntry& x = a.entries[i];
    const poseidon::PlanEntry& y = b.entries[i];
    if (x.layer != y.layer || x.shape != y.shape || x.kind != y.kind || x.choice != y.choice ||
        x.reason != y.reason || x.candidates.size() != y.candidates.size()) {
      Fail("layer " + std::to_string(i) + " changed in the round trip", text, printed);
    }
    for (size_t c = 0; c < x.candidates.size(); ++c) {
      const poseidon::CandidateCost& p = x.candidates[c];
      const poseidon::CandidateCost& q = y.candidates[c];
      if (p.strategy != q.strategy || p.applies != q.applies || p.candidate != q.candidate ||
          !SameFigure(p.time_s, q.time_s) || !SameFigure(p.bytes_sent, q.bytes_sent)) {
        Fail("layer " + std::to_string(i) + " cell " + std::to_string(c) +
                 " changed in the round trip",
             text, printed);
      }
    }
  }
  (void)a.PredictedTime();
  (void)a.PredictedBytes();
  (void)a.DenseAllReduceTime();
  (void)a.DenseAllReduceBytes();
  return 0;
}
