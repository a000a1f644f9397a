// How much of a problem the harness's checks fill and compare (harness.hpp):
// the depth of a check, the columns a quick check compares, and bulk random
// fills fast enough for whole expert weight stacks. No device code here: the
// CPU unit tests include it alone.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace kjit::harness {

// What a check compares. exhaustive: every column of its sampled rows, three
// routed experts (every expert for the weight gradient): what the GPU tests
// run, and `jitctl selftest --exhaustive`. quick (selftest's default): the same
// launch on fresh random data, outputs poisoned, the same tolerance, but
// two routed experts (the first empty before them, the last routed) and, of
// each sampled row, sampled_columns() only.
enum class Depth { quick, exhaustive };

// The columns of [0, cols) a quick check compares: the first and the last,
// one in every `tile`-wide tile (at an offset that moves from tile to tile,
// starting with the first tile's last column), and `spread` more spread
// evenly; sorted, each once. All columns when `spread` reaches `cols`.
inline std::vector<int64_t> sampled_columns(int64_t cols, int64_t tile, int64_t spread) {
  std::vector<int64_t> picked;
  if (cols <= 0) return picked;
  if (spread >= cols) {
    for (int64_t c = 0; c < cols; ++c) picked.push_back(c);
    return picked;
  }
  tile = std::max<int64_t>(tile, 1);
  picked = {0, cols - 1};
  for (int64_t t = 0; t * tile < cols; ++t) picked.push_back(std::min(cols - 1, t * tile + (tile - 1 + 37 * t) % tile));
  for (int64_t i = 1; i + 1 < spread; ++i) picked.push_back(i * (cols - 1) / (spread - 1));
  std::sort(picked.begin(), picked.end());
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  return picked;
}

// Fills `out` with values of `draw(rng)`. Past 65536 elements, 65536 draws
// make a table and a splitmix64 stream seeded from `rng` picks each element's
// entry, 16 bits a pick: the values follow draw's distribution (resampled from
// those draws) at a few nanoseconds an element, where std::normal_distribution
// over a 30M-weight expert takes seconds.
template <class T, class Draw>
void fill_random(std::vector<T>& out, std::mt19937_64& rng, Draw&& draw) {
  constexpr size_t kTable = size_t{1} << 16;
  if (out.size() <= kTable) {
    for (auto& v : out) v = draw(rng);
    return;
  }
  std::vector<T> table(kTable);
  for (auto& v : table) v = draw(rng);
  uint64_t state = rng();
  for (size_t i = 0; i < out.size();) {
    uint64_t z = state += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int pick = 0; pick < 4 && i < out.size(); ++pick, z >>= 16) out[i++] = table[z & 0xFFFF];
  }
}

}  // namespace kjit::harness
