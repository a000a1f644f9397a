// The harness's sampling (tools/harness/sampling.hpp, grouped_gemm_check.hpp):
// what a quick check (jitctl selftest's default) fills and compares, on the
// CPU. The checks themselves need a GPU (tests/gpu).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "grouped_gemm_check.hpp"
#include "sampling.hpp"

namespace {

using kjit::harness::Depth;

// Whether `cols` is sorted, each once, within [0, n), with the first and last column and one in every tile.
void check_covers(const std::vector<int64_t>& cols, int64_t n, int64_t tile) {
  CAPTURE(n);
  CAPTURE(tile);
  REQUIRE_FALSE(cols.empty());
  CHECK(std::is_sorted(cols.begin(), cols.end()));
  CHECK(std::adjacent_find(cols.begin(), cols.end()) == cols.end());
  CHECK(cols.front() == 0);
  CHECK(cols.back() == n - 1);
  std::set<int64_t> tiles;
  for (int64_t c : cols) tiles.insert(c / tile);
  CHECK(static_cast<int64_t>(tiles.size()) == (n + tile - 1) / tile);
}

}  // namespace

TEST_CASE("sampled_columns: the first and last column and every tile, whatever the shapes") {
  for (int64_t n : {1, 2, 7, 64, 127, 128, 129, 1000, 2880, 4096, 7168, 14336, 28672})
    for (int64_t tile : {1, 8, 16, 64, 128, 256}) {
      const auto cols = kjit::harness::sampled_columns(n, tile, 64);
      check_covers(cols, n, tile);
      CHECK(static_cast<int64_t>(cols.size()) <= std::min<int64_t>(n, 64 + 2 + (n + tile - 1) / tile));
    }
}

TEST_CASE("sampled_columns: offsets within the tiles move, from the first tile's last column on") {
  const auto cols = kjit::harness::sampled_columns(4096, 128, 0);
  CHECK(std::find(cols.begin(), cols.end(), 127) != cols.end());
  std::set<int64_t> offsets;
  for (int64_t c : cols) offsets.insert(c % 128);
  CHECK(offsets.size() > 16);
}

TEST_CASE("sampled_columns: every column when the spread reaches them all, none of nothing") {
  const auto all = kjit::harness::sampled_columns(100, 16, 100);
  REQUIRE(all.size() == 100);
  for (int64_t c = 0; c < 100; ++c) CHECK(all[static_cast<size_t>(c)] == c);
  CHECK(kjit::harness::sampled_columns(0, 16, 64).empty());
}

TEST_CASE("ColumnPlan: quick covers every output tile, a fused activation reads both gate and up") {
  using kjit::codegen::Activation;
  const kjit::harness::ColumnPlan plain(4096, Activation::none, 128, Depth::quick);
  check_covers(plain.out, 4096, 128);
  CHECK(plain.product == plain.out);
  const kjit::harness::ColumnPlan fused(4096, Activation::silu_mul, 128, Depth::quick);
  check_covers(fused.out, 2048, 64);
  CHECK(fused.product.size() == 2 * fused.out.size());
  for (int64_t j : fused.out) {
    CHECK(std::binary_search(fused.product.begin(), fused.product.end(), kjit::harness::gate_column(j)));
    CHECK(std::binary_search(fused.product.begin(), fused.product.end(), kjit::harness::gate_column(j) + 8));
  }
  const kjit::harness::ColumnPlan untiled(1000, Activation::none, 0, Depth::quick);
  check_covers(untiled.out, 1000, 128);
  const kjit::harness::ColumnPlan all(2880, Activation::swiglu_oai, 128, Depth::exhaustive);
  CHECK(all.out.size() == 1440);
  CHECK(all.product.size() == 2880);
}

TEST_CASE("routed_experts: quick routes the second and the last, exhaustive the middle too") {
  using V = std::vector<int64_t>;
  CHECK(kjit::harness::routed_experts(256, Depth::quick) == V{1, 255});
  CHECK(kjit::harness::routed_experts(256, Depth::exhaustive) == V{1, 128, 255});
  CHECK(kjit::harness::routed_experts(3, Depth::quick) == V{1, 2});
  CHECK(kjit::harness::routed_experts(2, Depth::exhaustive) == V{1});
  CHECK(kjit::harness::routed_experts(1, Depth::quick) == V{0});
  CHECK(kjit::harness::busy_expert(256, Depth::quick) == 255);
  CHECK(kjit::harness::busy_expert(256, Depth::exhaustive) == 128);
}

TEST_CASE("fill_random: values of the draw only, varied, and a fresh stream each call") {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> odd(0, 499);
  const auto draw = [&](std::mt19937_64& r) { return static_cast<uint16_t>(2 * odd(r) + 1); };
  for (size_t size : {size_t{10}, size_t{65536}, size_t{1} << 20}) {
    std::vector<uint16_t> a(size), b(size);
    kjit::harness::fill_random(a, rng, draw);
    kjit::harness::fill_random(b, rng, draw);
    CHECK(std::all_of(a.begin(), a.end(), [](uint16_t v) { return v % 2 == 1 && v < 1000; }));
    CHECK(a != b);
    CHECK(std::set<uint16_t>(a.begin(), a.end()).size() >= std::min<size_t>(size / 2, 400));
  }
}
