// The side lane (lower.hpp: plan_side_lane; cuda_program.hpp: the schedule
// and CudaEngine::Program::enqueue). A CUDA graph captured from one stream is
// a chain: every launch waits for the one before, even where the graph IR has
// two independent branches (RT-DETR r18vd at batch 1 on the H100: a backbone
// shortcut's pool and 1x1 conv, ~7 us, ran after its block's first 3x3 conv
// instead of beside it; the encoder's input projections, the CSP blocks'
// second branch and the decoder's value projections likewise). Capturing such
// branches on a second stream forked from and joined to the first gives the
// graph the edges the IR has, and the GPU runs the branches side by side.
// One extra stream, not a general multi-stream scheduler: the side branches
// are short and few, and one lane keeps the memory plan's reasoning local.
#include <algorithm>
#include <functional>

#include "backends/cuda/cuda_program.hpp"
#include "backends/cuda/lower.hpp"
#include "core/error.hpp"
#include "ir/attrs.hpp"
#include "ir/quant_form.hpp"

namespace kiln::cuda {

namespace {
// late_side_fork's top_k: at most 8 rows (top_k_rows gives a row one block,
// or one cluster of 8 from 4096 elements: a few SMs busy, the rest idle).
constexpr int64_t kLateForkTopKRows = 8;
}  // namespace

std::vector<int> launch_nodes(const Graph& g, const GraphFacts& f) {
  const int end = static_cast<int>(g.nodes.size());
  std::vector<int> at(g.nodes.size());
  for (int i = 0; i < end; ++i) {
    const Node& n = g.nodes[i];
    bool alias = !n.outputs.empty();
    for (int o : n.outputs) alias &= f.alias[o] >= 0;
    if (alias) at[i] = kPassThrough;  // flatten/reshape/token rows/row windows/upsample reads: the same bytes
    else if (f.folded_cast[i]) at[i] = -1;  // inside the engine input's conversion, before every node
    else at[i] = f.fused_away[i] ? kUnknownLaunch : i;
  }
  auto run_at = [&](size_t node, size_t launch) {
    if (node != kNoNode) at[node] = static_cast<int>(launch);
  };
  for (const auto& [out, from] : f.output_from) run_at(static_cast<size_t>(g.values[out].producer), g.nodes.size());
  for (const auto& [ln, a] : f.norm_adds)
    for (size_t x : {a.residual, a.pos, a.widen}) run_at(x, ln);
  for (const auto& [b, r] : f.box_refines)
    for (size_t x : {r.widen, r.inverse, r.narrow}) run_at(x, b);
  for (const auto& [key, u] : f.upsample_reads) run_at(u.upsample, key.first);
  for (const auto& [cat, mul] : f.concat_masks) run_at(mul, cat);
  for (const auto& [lin, v] : f.wide_linears) {
    const int cast = g.values[g.nodes[lin].inputs[0]].producer;  // the widening cast the linear reads through
    if (cast >= 0 && f.fused_away[cast]) run_at(static_cast<size_t>(cast), lin);
  }
  for (const auto& [launch, chain] : f.mlp_chains)
    for (size_t c : chain) run_at(c, launch);
  for (const auto& [a, link] : f.mlp_chain_links) {
    run_at(link.refine, a);
    if (const auto r = f.box_refines.find(link.refine); r != f.box_refines.end())
      for (size_t x : {r->second.widen, r->second.inverse, r->second.narrow}) run_at(x, a);
    for (size_t c : link.next) run_at(c, a);
  }
  // A chain's sum output is written by whatever launch runs the chain's last linear (a link's, when linked).
  for (const auto& [launch, add] : f.mlp_chain_sums) run_at(add, static_cast<size_t>(at[launch] >= 0 ? at[launch] : launch));
  for (const auto& [a, link] : f.mlp_chain_links)
    if (const auto s = f.mlp_chain_sums.find(link.next.back()); s != f.mlp_chain_sums.end()) run_at(s->second, a);
  return at;
}

void plan_side_lane(const Graph& g, GraphFacts& f, bool late_fork, bool chain_fork) {
  f.side_runs.clear();
  if (f.dense || f.window_mode || f.use_views || !f.se.fused_away.empty() || !f.se.mlp_at.empty() ||
      !f.se.scale_at.empty())
    return;
  const std::vector<int> at = launch_nodes(g, f);
  const int end = static_cast<int>(g.nodes.size());
  // The first launch reading v (through byte aliases; the output conversion
  // for an engine output); false when a reader's launch is unknown.
  std::function<bool(int, int&)> first_read = [&](int v, int& first) {
    if (g.is_graph_output(v)) first = std::min(first, end);
    for (int c : g.consumers(v)) {
      if (at[c] == kUnknownLaunch) return false;
      if (at[c] == kPassThrough) {
        for (int o : g.nodes[c].outputs)
          if (!first_read(o, first)) return false;
        continue;
      }
      first = std::min(first, at[c]);
    }
    return true;
  };
  // The last launch writing v (through byte aliases; -1 for engine inputs).
  std::function<bool(int, int&)> last_write = [&](int v, int& last) {
    const int p = g.values[v].producer;
    if (p < 0) return true;
    if (at[p] == kUnknownLaunch) return false;
    if (at[p] == kPassThrough) {
      for (int in : g.nodes[p].inputs)
        if (!g.values[in].constant && !last_write(in, last)) return false;
      return true;
    }
    last = std::max(last, at[p]);
    return true;
  };
  auto candidate = [&](size_t i) {
    const Node& n = g.nodes[i];
    if (n.op != Op::Conv2d && n.op != Op::Linear && n.op != Op::MaxPool2d && n.op != Op::AvgPool2d) return false;
    if (at[i] != static_cast<int>(i) || n.outputs.size() != 1 || is_quantized_layer(g, n)) return false;
    const int y = n.outputs[0];
    return !f.mlp_chains.count(i) && !f.mlp_chain_links.count(i) && !f.wide_linears.count(i) && !f.view_convs.count(i) &&
           !f.live_from.count(y) && f.alias[y] < 0;
  };
  // Every candidate run: a chain of candidates, each read by the next alone.
  std::vector<SideRun> runs;
  std::vector<char> in_run(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (in_run[i] || !candidate(i)) continue;
    SideRun r;
    r.nodes = {i};
    for (;;) {
      const int y = g.nodes[r.nodes.back()].outputs[0];
      const std::vector<int> readers = g.consumers(y);
      if (readers.size() != 1 || g.is_graph_output(y)) break;
      const auto t = static_cast<size_t>(readers[0]);
      bool alone = !in_run[t] && candidate(t);
      for (int in : g.nodes[t].inputs) alone &= g.values[in].constant || in == y;
      if (!alone) break;
      r.nodes.push_back(t);
    }
    for (size_t n : r.nodes) in_run[n] = 1;
    r.fork = -1, r.join = end;
    bool known = true;
    for (size_t n : r.nodes)
      for (int in : g.nodes[n].inputs) {
        const int p = g.values[in].producer;
        if (g.values[in].constant || (p >= 0 && std::find(r.nodes.begin(), r.nodes.end(), static_cast<size_t>(p)) != r.nodes.end()))
          continue;
        known = known && last_write(in, r.fork);
      }
    known = known && first_read(g.nodes[r.nodes.back()].outputs[0], r.join);
    if (known && r.fork < r.join) runs.push_back(std::move(r));
  }
  std::vector<char> side(g.nodes.size(), 0);
  // Main-lane launches between r's fork and join, with the side set as it is.
  auto between = [&](const SideRun& r) {
    int count = 0;
    for (int k = r.fork + 1; k < r.join; ++k)
      count += at[k] == k && !side[k] && std::find(r.nodes.begin(), r.nodes.end(), static_cast<size_t>(k)) == r.nodes.end();
    return count;
  };
  // The branch to move is the short one beside a long one: runs are taken in
  // order of main-lane launches they can overlap minus their own launches
  // (a CSP block's second 1x1 conv beside its four-conv first branch, not the
  // other way round; an input projection beside the rest of the backbone, not
  // the backbone's last conv beside it), as long as every taken run keeps a
  // main-lane launch to overlap.
  std::vector<size_t> order(runs.size());
  std::vector<int> score(runs.size());
  for (size_t r = 0; r < runs.size(); ++r) order[r] = r, score[r] = between(runs[r]) - static_cast<int>(runs[r].nodes.size());
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] > score[b]; });
  std::vector<size_t> taken;
  for (size_t r : order) {
    const SideRun& run = runs[r];
    if (between(run) == 0) continue;
    for (size_t n : run.nodes) side[n] = 1;
    bool keeps = true;
    for (size_t t : taken) keeps &= between(runs[t]) > 0;
    if (!keeps) {
      for (size_t n : run.nodes) side[n] = 0;
      continue;
    }
    taken.push_back(r);
  }
  std::sort(taken.begin(), taken.end());  // node order
  // Switch late_side_fork: a run whose window holds a main-lane top_k of a
  // few rows (RT-DETR's query selection, 8400 -> 300: at batch 1 one
  // thread-block cluster for ~10 us with the rest of the GPU idle) forks
  // right before it instead of where its input is written. RT-DETR's merged
  // decoder value projection (8400 x 768, 264 CTAs at batch 1), forked where
  // the encoder's memory is written, held the SMs while model.enc_output.0
  // waited 6.7 us (H100, session 33's two-lane trace).
  const auto few_rows_top_k = [&](int k) {
    if (g.nodes[k].op != Op::TopK) return false;
    const TopKAttrs a = top_k_attrs(g, g.nodes[k]);
    return a.outer * a.inner <= kLateForkTopKRows;
  };
  // The first main-lane launch after run's fork and before `until` for which
  // `is` holds; -1 if none.
  const auto first_main = [&](const SideRun& run, int until, const auto& is) {
    for (int k = run.fork + 1; k < std::min(run.join, until); ++k)
      if (at[k] == k && !side[k] && is(k)) return k;
    return -1;
  };
  if (late_fork)
    for (size_t r : taken) {
      SideRun& run = runs[r];
      // The fork step is the first main-lane step with a node after the fork: the top_k's.
      if (const int k = first_main(run, static_cast<int>(run.nodes.front()), few_rows_top_k); k >= 0) run.fork = k - 1;
    }
  // Switch chain_side_fork: a run whose window holds a main-lane mlp_chain
  // launch before the run's first node forks right after the chain instead,
  // so its launches do not take SMs beside the chain's clusters, whose
  // layers are latency bound (RT-DETR: each decoder layer's self-attention
  // v_proj, forked with the box head + query position chain that feeds the
  // q/k projection; the chain took ~17 us in the graph against 12.8 alone,
  // H100 session 35). Not a run whose window holds the query selection's
  // top_k (the merged decoder value projection, late_side_fork's), which
  // would then run beside the first decoder layer.
  const auto chain_launch = [&](int k) {
    return f.mlp_chains.count(static_cast<size_t>(k)) > 0 || f.mlp_chain_links.count(static_cast<size_t>(k)) > 0;
  };
  if (chain_fork)
    for (size_t r : taken) {
      SideRun& run = runs[r];
      if (first_main(run, run.join, few_rows_top_k) >= 0) continue;
      // The fork step is then the first main-lane step with a node after the chain's.
      if (const int k = first_main(run, static_cast<int>(run.nodes.front()), chain_launch); k >= 0) run.fork = k;
    }
  for (size_t r : taken) {
    const SideRun& run = runs[r];
    for (size_t n : run.nodes) {
      for (int in : g.nodes[n].inputs)
        if (!g.values[in].constant) f.live_through(in, run.join);
      const auto [it, fresh] = f.live_from.try_emplace(g.nodes[n].outputs[0], run.fork + 1);
      if (!fresh) it->second = std::min(it->second, run.fork + 1);
    }
    f.side_runs.push_back(run);
  }
}

namespace {

// The main-lane step a side run forks before (the first with a node after
// `fork`) and joins before (the first with a node at or after `join`); the
// step count when none.
size_t first_main_step(const CudaEngine::Program& p, const std::vector<char>& on_side, int node, bool at_or_after) {
  for (size_t k = 0; k < p.steps.size(); ++k)
    if (!on_side[k] && (at_or_after ? p.step_nodes[k] >= node : p.step_nodes[k] > node)) return k;
  return p.steps.size();
}

}  // namespace

void schedule_side_lane(CudaEngine::Program& p, const GraphFacts& f) {
  p.side_runs.clear();
  p.step_on_side.assign(p.steps.size(), 0);
  std::vector<const SideRun*> runs;
  for (const SideRun& r : f.side_runs) runs.push_back(&r);
  // A run without steps, or with no main-lane step between its fork and its
  // join, runs on the main lane (its extended lifetimes are harmless); that
  // can give other runs more main-lane steps, never fewer, so repeat until stable.
  for (;;) {
    std::vector<int> run_of(p.shaped.nodes.size(), -1);
    for (size_t r = 0; r < runs.size(); ++r)
      for (size_t n : runs[r]->nodes) run_of[n] = static_cast<int>(r);
    std::vector<std::vector<size_t>> steps(runs.size());
    for (size_t k = 0; k < p.steps.size(); ++k) {
      const int r = p.step_nodes[k] >= 0 ? run_of[static_cast<size_t>(p.step_nodes[k])] : -1;
      p.step_on_side[k] = r >= 0;
      if (r >= 0) steps[static_cast<size_t>(r)].push_back(k);
    }
    std::vector<CudaEngine::Program::SideLaneRun> out;
    std::vector<const SideRun*> kept;
    for (size_t r = 0; r < runs.size(); ++r) {
      const size_t fork = first_main_step(p, p.step_on_side, runs[r]->fork, false);
      const size_t join = first_main_step(p, p.step_on_side, runs[r]->join, true);
      if (steps[r].empty() || fork >= join) continue;
      out.push_back({steps[r], fork, join});
      kept.push_back(runs[r]);
    }
    if (kept.size() == runs.size()) {
      p.side_runs = std::move(out);
      break;
    }
    runs = std::move(kept);
  }
  sort_side_runs(p);
}

void sort_side_runs(CudaEngine::Program& p) {
  // Enqueued in fork order; runs forking together, the one joined first first.
  std::stable_sort(p.side_runs.begin(), p.side_runs.end(), [](const auto& a, const auto& b) {
    return a.fork_step != b.fork_step ? a.fork_step < b.fork_step : a.join_step < b.join_step;
  });
}

void CudaEngine::Program::enqueue(const Exec& x, const SideLane* lane, const std::function<void(size_t)>* after_step) const {
  const auto run = [&](size_t k, const Exec& on) {
    steps[k](on);
    if (after_step) (*after_step)(k);
  };
  if (!lane || side_runs.empty()) {
    for (size_t k = 0; k < steps.size(); ++k) run(k, x);
    return;
  }
  if (lane->done.size() < side_runs.size()) fail_runtime("side lane: ", lane->done.size(), " events for ", side_runs.size(), " runs");
  size_t next = 0;
  for (size_t k = 0; k <= steps.size(); ++k) {
    for (size_t r = 0; r < next; ++r)
      if (side_runs[r].join_step == k) KILN_CUDA_CHECK(cudaStreamWaitEvent(x.stream, lane->done[r], 0));
    for (; next < side_runs.size() && side_runs[next].fork_step == k; ++next) {
      KILN_CUDA_CHECK(cudaEventRecord(lane->fork, x.stream));
      KILN_CUDA_CHECK(cudaStreamWaitEvent(lane->x.stream, lane->fork, 0));
      for (size_t s : side_runs[next].steps) run(s, lane->x);
      KILN_CUDA_CHECK(cudaEventRecord(lane->done[next], lane->x.stream));
    }
    if (k < steps.size() && !step_on_side[k]) run(k, x);
  }
}

}  // namespace kiln::cuda
