// Proof by exhaustion (castlab.numerics.exhaustive): every input tuple of a cross product
// of enumerations, run through one lowered Plan per configuration (policy x math) and the
// fp64 reference Plan, reduced to counts (ops/scalar/exhaustive.h defines them).
//
// The CPU driver walks the index space in chunks: a chunk's inputs are generated from
// their indices into small tensors, every Plan runs on them with the CPU executor (the
// same Programs castlab runs everywhere, multithreaded inside), and the statistics of
// the chunk are reduced on the thread pool into per-block partials merged in index order
// (so "first K" and "argmax" are the smallest indices, whatever the thread count).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/runtime.h"
#include "ops/scalar/exhaustive.h"

namespace cl {

// The values of one input: bit patterns of `dtype`, the range [lo, lo + count) or, when
// `table` is not empty, the patterns listed there.
struct Enumeration {
  DTypeCode dtype = kBFloat16;
  uint64_t lo = 0, count = 0;
  std::vector<uint64_t> table;
  uint64_t size() const { return table.empty() ? count : table.size(); }
  uint64_t bits(uint64_t i) const { return table.empty() ? lo + i : table[i]; }
};

struct ExhaustiveSpec {
  std::vector<Enumeration> inputs;   // the cross product, the last input varying fastest
  DTypeCode out_dtype = kBFloat16;   // every configuration's output format
  uint64_t begin = 0, end = 0;       // the indices to visit (end 0: all of them)
  int first_k = 10;                  // differing inputs to keep per pair of configurations
  int64_t chunk = int64_t(1) << 20;  // indices per chunk (the traced Plans' input length)
};

struct ConfigStats {
  uint64_t count[kExCategories] = {0, 0, 0, 0, 0};  // ExCategory
  uint64_t hist[kExHistBins] = {};
  double max_error = -1.0;  // largest non-NaN ulp error (-1: none)
  uint64_t max_index = 0;   // the smallest index reaching it
};

struct PairStats {
  uint64_t differ = 0;             // inputs where the two results differ
  uint64_t differ_at_ties = 0;     // ... and the reference is on a midpoint
  double max_tie_distance = -1.0;  // the largest ex_midpoint_distance of those (-1: none)
  std::vector<uint64_t> first;     // the first `first_k` such indices
};

struct ExhaustiveResult {
  uint64_t n = 0;          // inputs visited
  uint64_t ties = 0;       // inputs whose fp64 reference is a midpoint of the output format
  uint64_t near_ties = 0;  // ... or within 256 fp64 ulps of one (ex_near_midpoint)
  std::vector<ConfigStats> configs;
  std::vector<PairStats> pairs;  // (0,1), (0,2), ..., (1,2), ...: i < j
};

// The number of index tuples (throws std::overflow_error beyond 2**64 - 1).
uint64_t enumeration_size(const std::vector<Enumeration>& inputs);
// The bit pattern of every input at index `idx`.
std::vector<uint64_t> enumeration_bits(const std::vector<Enumeration>& inputs, uint64_t idx);

// Runs the exhaustive comparison on the CPU. Each Plan takes one input tensor per
// enumeration, of shape [spec.chunk] and the enumeration's dtype, and gives one output of
// that shape: `configs` in spec.out_dtype, `ref` in float64.
ExhaustiveResult exhaustive_cpu(const ExhaustiveSpec& spec,
                                const std::vector<std::shared_ptr<Plan>>& configs, const Plan& ref);

// One configuration's Program as the GPU kernel embeds it: the Plan's single step, and for
// each of its leaves (its loads' `aux`) the input it reads. Throws std::invalid_argument
// unless the Plan is one elementwise Program over whole inputs with one output and no
// random numbers (stochastic rounding would depend on where an input sits in a chunk).
struct ExChain {
  const Program* prog = nullptr;
  std::vector<int> input_of_leaf;
};
ExChain exhaustive_chain(const Plan& plan, int n_inputs);

}  // namespace cl
