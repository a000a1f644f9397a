// "Did you mean": the closest of the valid names to a mistyped one (a command,
// an option, an arch, an op, a manifest), for jitctl's usage errors.
#pragma once

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace kjit::tools {

// Edits (insert, delete, substitute, swap two neighbours) that turn a into b.
inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The candidate `typed` most likely meant: the nearest within a third of its
// length (at least one edit; of equally near ones, one that `typed` begins:
// sm_90 -> sm_90a, not sm_80), else the only one it is a prefix of.
template <class Names>
std::optional<std::string> closest(std::string_view typed, const Names& candidates) {
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(1, typed.size() / 3) + 1;
  bool best_extends = false;
  for (const auto& candidate : candidates) {
    const size_t distance = edit_distance(typed, candidate);
    const bool extends = std::string_view(candidate).starts_with(typed);
    if (distance < best_distance || (best && distance == best_distance && extends && !best_extends))
      best_distance = distance, best = std::string(candidate), best_extends = extends;
  }
  if (best || typed.size() < 2) return best;
  for (const auto& candidate : candidates)
    if (std::string_view(candidate).starts_with(typed)) {
      if (best) return std::nullopt;  // ambiguous
      best = std::string(candidate);
    }
  return best;
}

// " (did you mean 'list'?)", or "" when nothing is close.
template <class Names>
std::string did_you_mean(std::string_view typed, const Names& candidates) {
  auto best = closest(typed, candidates);
  return best ? fmt::format(" (did you mean '{}'?)", *best) : std::string();
}

}  // namespace kjit::tools
