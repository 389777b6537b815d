// top_k cases: ranks 1-5, the axis first, in the middle and last (negative
// too), k = 1, k = extent and in between, extents 13 and 24, batches 1 and 3,
// largest and smallest, and a case whose inputs are mostly ties (values
// rounded to few distinct numbers), so the tie rule (smaller index first) is
// compared too, also at RT-DETR's size (300 of 8400). Exact: top_k selects input elements and their indices.
//
// Graph inputs carry the batch on axis 0 and the runtime also plans every
// graph at batch 1 (plan_for_batch's per-image graph, engine.cpp): a top_k
// over axis 0 with k > 1 does not fit there, so the CPU backend refuses those
// cases (declared); the reference still runs them.
#include "op_harness.hpp"

namespace kiln::ops {

namespace {

struct TopKSpec {
  const char* tag;
  Shape x;
  int64_t axis, k, largest;
  float lo = -1.f, hi = 1.f;
};

}  // namespace

void add_top_k_cases(std::vector<OpCase>& out) {
  const TopKSpec specs[] = {
      {"r1_k1", {13}, 0, 1, 1},
      {"r1_k1_smallest", {24}, -1, 1, 0},
      {"r1_k_extent", {13}, 0, 13, 1},
      {"r2_k1_b1", {1, 13}, -1, 1, 1},
      {"r2_k_extent_b3", {3, 24}, 1, 24, 1},
      {"r2_k5_smallest_b3", {3, 13}, -1, 5, 0},
      {"r2_axis0_k1", {13, 3}, 0, 1, 1},
      {"r2_axis0_k_extent", {24, 2}, 0, 24, 0},
      {"r3_middle_k_extent_b3", {3, 13, 4}, 1, 13, 1},
      {"r3_last_k1_b1", {1, 4, 24}, -1, 1, 1},
      {"r3_middle_k7_smallest_b3", {3, 24, 5}, -2, 7, 0},
      {"r4_channels_k_extent_b1", {1, 13, 3, 3}, 1, 13, 1},
      {"r4_axis2_k1_b3", {3, 2, 24, 2}, 2, 1, 1},
      {"r4_last_k_extent_smallest_b3", {3, 4, 3, 13}, 3, 13, 0},
      {"r4_axis_neg3_k5_b1", {1, 24, 2, 2}, -3, 5, 1},
      {"r5_middle_k_extent_b1", {1, 2, 13, 2, 3}, 2, 13, 1},
      {"r5_last_k_extent_smallest_b3", {3, 2, 2, 3, 24}, 4, 24, 0},
      {"r5_axis1_k1_b3", {3, 24, 1, 2, 2}, 1, 1, 1},
      {"r5_last_k4_b1", {1, 3, 2, 2, 13}, -1, 4, 1},
      // 24 values in [1, 1.06): bf16 keeps about 8 distinct ones, f16 about 60, f32 all.
      {"ties_r2_k9_b3", {3, 24}, -1, 9, 1, 1.f, 1.06f},
      {"ties_r4_k13_smallest_b1", {1, 13, 2, 3}, 1, 13, 0, 1.f, 1.06f},
      // RT-DETR's query selection: 300 of 8400 anchors, and the same with mostly ties.
      {"rtdetr_8400_k300_b1", {1, 8400}, -1, 300, 1},
      {"ties_8400_k300_smallest_b3", {3, 8400}, 1, 300, 0, 1.f, 1.06f},
      // CUDA: long rows with ties and a large k, strided rows, k past 1024, rows whose order values need
      // more than 48 KiB of shared memory in one block (20000, 30000).
      {"ties_16384_k1024_b1", {1, 16384}, -1, 1024, 1, 1.f, 1.06f},
      {"middle_2000_k100_smallest_b1", {1, 2000, 3}, 1, 100, 0},
      {"k1100_of_3000_b1", {1, 3000}, -1, 1100, 1},
      {"long_20000_k50_b1", {1, 20000}, -1, 50, 1},
      {"long_30000_k300_b1", {1, 30000}, -1, 300, 1},
      {"ties_long_30000_k300_smallest_b3", {3, 30000}, 1, 300, 0, 1.f, 1.06f},
      // CUDA: with switch cluster_top_k on, rows of 4096..196608 take the cluster form; 4099 is not a
      // multiple of its 8 blocks (the last holds fewer), with an inner stride and k at the limit. Past
      // 196608 the one-block kernel reads global memory in every pass.
      {"cluster_4099_k2048_middle_b1", {1, 4099, 3}, 1, 2048, 1},
      {"long_200000_k300_b1", {1, 200000}, -1, 300, 1},
      // k = 1 (CUDA: one warp per row): RT-DETR's best class per anchor, long rows and inner strides with ties.
      {"rtdetr_class_max_8400x80_k1_b1", {1, 8400, 80}, -1, 1, 1},
      {"ties_k1_long_rows_b3", {3, 2, 1000}, -1, 1, 1, 1.f, 1.06f},
      {"ties_k1_smallest_inner_b3", {3, 100, 3}, 1, 1, 0, 1.f, 1.06f},
  };
  for (DType dt : kCaseTypes)
    for (const TopKSpec& s : specs) {
      OpCase c;
      c.name = std::string("top_k_") + s.tag + "_" + dtype_name(dt);
      c.group = "top_k";
      c.dtype = dt;
      c.limit = {Measure::Exact, 0};
      c.input_lo = s.lo, c.input_hi = s.hi;
      CaseBuilder b(c.name, dt);
      const std::vector<int> vi =
          b.node_multi(Op::TopK, "head.topk", {b.input("x", s.x)}, {{"k", s.k}, {"axis", s.axis}, {"largest", s.largest}});
      c.graph = b.finish(vi);  // values and indices, both graph outputs
      const int64_t axis = s.axis < 0 ? s.axis + static_cast<int64_t>(s.x.size()) : s.axis;
      if (axis == 0 && s.k > 1)
        c.cpu = {Expect::Refuses,
                 "the runtime also plans every graph at batch 1 (plan_for_batch, engine.cpp), where k > 1 does not fit "
                 "a top_k over the batch axis",
                 "is larger than the extent"};
      out.push_back(std::move(c));
    }
}

}  // namespace kiln::ops
