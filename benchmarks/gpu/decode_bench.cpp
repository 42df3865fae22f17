// decode_bench: decode step time and tokens/s of the GPU model (model/qwen3_gpu) at a
// Qwen3-30B-A3B shape with random weights generated on the device (48 layers, hidden 2048, 128
// experts top-8, moe_intermediate 768, 32 q / 4 kv heads, head_dim 128, vocab 151936), INT4-asym
// g128 experts and BF16 experts in the same run, against the memory roofline
//
//   roofline step = (active weight bytes + KV bytes read) / measured device-to-device copy bandwidth
//
// active weights per step: attention (q, k, v, o), routers, norms, lm_head, and the experts the
// batch touches: with routing spread over E experts, a layer touches E (1 - (1 - k/E)^B) of them
// in expectation for B tokens (exactly k at B = 1). KV bytes: every sequence's cached keys and
// values, all layers.
//
// Each batch size: B fresh sequences prefilled with `--prompt` random tokens (eager, in chunks of
// at most max_batch_tokens = 2048 tokens as the scheduler runs them: whole prompts while they fit,
// a longer prompt alone in chunks of 2048, only the chunk that ends a prompt asking for logits),
// `--warmup` decode steps (the CUDA graph of the bucket is captured there), then `--steps` timed
// greedy decode steps through forward_sample (forward + sampling on the device, tokens back to the
// host, as the runner does). Prints a table and, with --json, writes the numbers. With
// RLSERVE_GPU_PROFILE=1 in the environment the steps run eagerly with events between phases and
// the time per phase is printed (graph gaps then show as launch overhead), followed by the
// attention share of that eager step and the bandwidth paged attention reached on the KV bytes.
//
//   decode_bench [--batches 1,8,32,128] [--prompt 128] [--steps 32] [--mode both|int4|bf16]
//                [--layers 48] [--no-graphs] [--linears gemv|cublas] [--prefill full|none]
//                [--batch-invariant] [--profile-steps N] [--json FILE]
// --linears cublas runs the decode-size BF16 linears on cuBLAS instead of the project's GEMV
// (gpu_options::bf16_gemv), to compare the two.
// --batch-invariant runs the batch-invariant forward (gpu_options::batch_invariant, what
// `serve --enable-deterministic-inference` runs): what that costs against the default at each batch.
// --profile-steps N runs N more steps after the timed ones inside a profiler range
// (gpu_profiler_range): `ncu --profile-from-start off` then profiles the kernels of steady-state
// steps only, not the random fills, prefill or graph capture (scripts/gpu/run_runner.sh ncu).
// --prefill none skips the prompt's forward: each sequence's KV simply counts `--prompt` positions
// (whatever the pool holds there: zeros, or an earlier batch's keys) and the rows start from
// distinct random tokens. Attention then reads the bytes of a real context of that length, so the
// step time should hold (the routing sees other hidden states than after a real prompt, as it
// would with other random weights), but tokens mean nothing: timing only. For long contexts at
// large batches, where the eager prefill (CUDA-core attention over the whole context) takes
// minutes.
// Long contexts: the KV pool holds batch x (prompt + warmup + steps) positions, 96 KiB each at this
// shape (48 layers): 3.2 GB per 32k-token sequence, so batch 32 at 32k takes 103 GB (INT4 only, on
// an H200). The model's limit is max_position_embeddings = 40960 positions per sequence.
//
// Each row line gives the KV bytes read per step (at the context of the middle timed step) and
// their share of the roofline's bytes, and two FNV-1a hashes of the timed steps: of the tokens and
// of the logprobs' bits (same build, same arguments, same hashes = bitwise reproducible;
// scripts/gpu/run_runner.sh determinism compares them across processes).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/gpu/qwen3_30b_a3b.hpp"
#include "model/qwen3.hpp"
#include "model/qwen3_gpu.hpp"

using namespace rlserve;
using namespace rlserve::model;

namespace {

struct options {
  std::vector<int64_t> batches{1, 8, 32, 128};
  int64_t prompt = 128;
  int64_t steps = 32;
  int64_t warmup = 3;
  int64_t layers = 48;
  std::string mode = "both";
  bool graphs = true;
  bool gemv = true;
  bool prefill = true; // --prefill none: KV positions counted, not computed (timing only)
  bool batch_invariant = false;
  int64_t profile_steps = 0;
  std::string json;
};

struct row {
  std::string mode;
  int64_t batch = 0;
  double step_ms = 0, tokens_per_s = 0, roofline_ms = 0, weight_gb = 0, kv_gb = 0;
  int64_t distinct = 0;   // distinct tokens of the batch at the last step
  uint64_t token_hash = 0; // FNV-1a of every token of the timed steps (same code, same tokens)
  uint64_t logprob_hash = 0; // FNV-1a of the bits of every logprob of the timed steps
  int64_t context = 0;       // cached positions per sequence at the middle of the timed steps
  double kv_share = 0;       // KV bytes / (weight + KV bytes) of the roofline
  double prefill_s = 0;      // wall time of the batch's prefill
  double attention_ms = -1;  // RLSERVE_GPU_PROFILE: paged attention per (eager) step; -1: not profiled
  double profiled_ms = -1;   // RLSERVE_GPU_PROFILE: every phase per (eager) step
};

// Bytes a decode step must read at batch B with `context` cached tokens per sequence.
void step_bytes(const model_config& c, bool int4, int64_t B, int64_t context, double& weights,
                double& kv) {
  const double H = double(c.hidden_size), D = double(c.head_dim), E = double(c.num_experts);
  const double k = double(c.num_experts_per_tok), I = double(c.moe_intermediate_size);
  const double L = double(c.num_hidden_layers);
  const double attention = (double(c.num_attention_heads + 2 * c.num_key_value_heads) * D * H +
                            H * double(c.num_attention_heads) * D) * 2.0;
  const double router = E * H * 2.0, norms = (2 * H + 2 * D) * 2.0;
  const double expert_params = 3.0 * H * I;
  // asym g128: 4 bits + a bf16 scale and a 4-bit zero point per 128 weights.
  const double expert_bytes = int4 ? expert_params * (4.0 + 16.0 / 128 + 4.0 / 128) / 8.0 : expert_params * 2.0;
  const double touched = E * (1.0 - std::pow(1.0 - k / E, double(B)));
  weights = L * (attention + router + norms + touched * expert_bytes) +
            double(c.vocab_size) * H * 2.0 /* lm_head */ + B * H * 2.0 /* embedding rows */;
  kv = double(B) * double(context) * L * 2.0 * double(c.num_key_value_heads) * D * 2.0;
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  std::string text(s);
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto comma = text.find(',', pos);
    if (comma == std::string::npos)
      comma = text.size();
    out.push_back(std::stoll(text.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

bool run_mode(const options& o, bool int4, double copy_bw, std::vector<row>& rows) {
  const auto c = bench::qwen3_30b_a3b(o.layers);
  int64_t max_b = 1;
  for (auto b : o.batches)
    max_b = std::max(max_b, b);
  gpu_options g;
  g.kv_block_size = 16;
  const int64_t per_seq_blocks = (o.prompt + o.warmup + o.steps + o.profile_steps + 16) / 16 + 1;
  g.kv_num_blocks = max_b * per_seq_blocks + 1;
  g.max_batch_tokens = 2048;
  g.max_sequences = max_b;
  g.cuda_graphs = o.graphs;
  g.bf16_gemv = o.gemv;
  g.batch_invariant = o.batch_invariant;
  auto t0 = std::chrono::steady_clock::now();
  auto made = qwen3_gpu_model::create_random(c, int4 ? std::optional<random_int4>(random_int4{128, false})
                                                     : std::nullopt,
                                             42, g);
  if (!made) {
    // A long context's KV pool is the usual reason: say what it asked for.
    const double kv_pool = double(g.kv_num_blocks) * double(g.kv_block_size) * double(c.num_hidden_layers) * 2.0 *
                           double(c.num_key_value_heads) * double(c.head_dim) * 2.0;
    std::fprintf(stderr, "decode_bench: %s\n  (the KV pool for batch %lld x %lld positions is %.1f GB; fewer "
                         "--batches, a shorter --prompt, or --mode int4 may fit)\n",
                 made.error().c_str(), static_cast<long long>(max_b),
                 static_cast<long long>(per_seq_blocks * g.kv_block_size), kv_pool / 1e9);
    return false;
  }
  auto& m = **made;
  std::printf("%s model on %s (decode-size BF16 linears on %s): %.1f GB of weights, %.2f GB of KV, made in %.1f s\n",
              int4 ? (o.batch_invariant ? "INT4-asym g128 experts, batch-invariant" : "INT4-asym g128 experts")
                   : (o.batch_invariant ? "BF16, batch-invariant" : "BF16"),
              m.device_name().c_str(), o.gemv ? "the GEMV" : "cuBLAS",
              double(m.weight_bytes()) / 1e9, double(m.kv_bytes()) / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::mt19937_64 rng(7);
  for (auto B : o.batches) {
    std::vector<kv_sequence> kv(static_cast<std::size_t>(B));
    int32_t next = 0;
    for (auto& s : kv)
      for (int64_t b = 0; b < per_seq_blocks; ++b)
        s.blocks.push_back(next++);
    // Prefill in chunks of the token budget, as the scheduler runs them: whole prompts while they
    // fit (a prompt of at most max_batch_tokens is never cut, so those runs are the batches and
    // tokens of earlier builds), a longer prompt alone in chunks of the budget; only the chunk that
    // ends a prompt asks for its logits row. forward() advances each kv.length.
    std::vector<float> logits;
    std::vector<int32_t> current(static_cast<std::size_t>(B));
    int64_t prefill_forwards = 0;
    const auto prefill_start = std::chrono::steady_clock::now();
    if (o.prefill) {
      std::vector<std::vector<int32_t>> prompts(static_cast<std::size_t>(B));
      for (auto& p : prompts)
        for (int64_t t = 0; t < o.prompt; ++t)
          p.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size)));
      for (int64_t first = 0; first < B;) {
        std::vector<forward_item> items;
        int64_t tokens = 0;
        for (int64_t i = first; i < B; ++i) {
          const int64_t done = kv[i].length, left = o.prompt - done;
          const std::span<const int32_t> rest(prompts[i].data() + done, static_cast<std::size_t>(left));
          if (left <= g.max_batch_tokens - tokens) {
            items.push_back({&kv[i], rest, 1});
            tokens += left;
          } else {
            if (items.empty()) // a prompt longer than the budget: its next chunk, alone
              items.push_back({&kv[i], rest.first(static_cast<std::size_t>(g.max_batch_tokens)), 0});
            break;
          }
        }
        if (auto s = m.forward(items, logits); !s) {
          std::fprintf(stderr, "decode_bench: prefill: %s\n", s.error().c_str());
          return false;
        }
        ++prefill_forwards;
        while (first < B && kv[first].length == o.prompt)
          ++first;
      }
      for (int64_t i = 0; i < B; ++i)
        current[i] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()) % 1000;
    } else {
      // No prefill: the positions are counted as cached. Every row then depends only on its own
      // tokens, so each starts from its own random token (a shared one would decode the same
      // tokens in every row and route them all to the same experts).
      for (int64_t i = 0; i < B; ++i) {
        kv[i].length = o.prompt;
        current[i] = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size));
      }
    }
    const double prefill_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_start).count();
    std::vector<gpu_sample_row> sample(static_cast<std::size_t>(B)); // greedy
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    auto step = [&]() {
      std::vector<forward_item> items;
      for (int64_t i = 0; i < B; ++i)
        items.push_back({&kv[i], std::span<const int32_t>(&current[i], 1), 1});
      if (auto s = m.forward_sample(items, sample, tokens, logprobs); !s) {
        std::fprintf(stderr, "decode_bench: decode: %s\n", s.error().c_str());
        std::exit(1);
      }
      current = tokens;
    };
    // A batch whose rows decode the same tokens routes them to the same experts and reads fewer
    // bytes than the roofline counts: the distinct count says how far that went. The hashes let
    // two builds, settings or processes show they generated the same tokens, and the same
    // logprobs to the bit (which catches a difference in the logits that greedy tokens hide).
    uint64_t hash = 1469598103934665603ull, lp_hash = 1469598103934665603ull;
    auto record = [&] {
      for (int32_t t : current)
        hash = (hash ^ static_cast<uint32_t>(t)) * 1099511628211ull;
      for (float lp : logprobs) {
        uint32_t bits = 0;
        std::memcpy(&bits, &lp, sizeof bits);
        lp_hash = (lp_hash ^ bits) * 1099511628211ull;
      }
    };
    for (int64_t i = 0; i < o.warmup; ++i)
      step();
    const int64_t context_mid = o.prompt + o.warmup + o.steps / 2;
    m.take_profile(); // drop what prefill and warm-up recorded
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < o.steps; ++i) {
      step();
      record();
    }
    const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      double(o.steps);
    row r;
    r.mode = int4 ? "int4" : "bf16";
    r.batch = B;
    r.step_ms = ms;
    r.tokens_per_s = double(B) / (ms * 1e-3);
    double wb = 0, kb = 0;
    step_bytes(c, int4, B, context_mid, wb, kb);
    r.weight_gb = wb / 1e9;
    r.kv_gb = kb / 1e9;
    r.roofline_ms = (wb + kb) / copy_bw * 1e3;
    std::vector<int32_t> last = current;
    std::sort(last.begin(), last.end());
    r.distinct = std::unique(last.begin(), last.end()) - last.begin();
    r.token_hash = hash;
    r.logprob_hash = lp_hash;
    r.context = context_mid;
    r.kv_share = kb / (wb + kb);
    r.prefill_s = prefill_s;
    std::printf("  %-4s B=%-4lld step %8.3f ms  %9.1f tok/s  roofline %7.3f ms (%.0f%%)  weights %.2f GB  KV %.3f GB"
                "  distinct %lld  tokens %016llx  KV %.0f%% of roofline  logprobs %016llx\n",
                r.mode.c_str(), static_cast<long long>(B), r.step_ms, r.tokens_per_s, r.roofline_ms,
                100.0 * r.roofline_ms / r.step_ms, r.weight_gb, r.kv_gb, static_cast<long long>(r.distinct),
                static_cast<unsigned long long>(r.token_hash), 100.0 * r.kv_share,
                static_cast<unsigned long long>(r.logprob_hash));
    if (!o.prefill || o.prompt > g.max_batch_tokens)
      std::printf("      prefill %s: %lld x %lld tokens, %lld forwards, %.1f s; context %lld at mid-run\n",
                  o.prefill ? "in chunks" : "skipped (--prefill none)", static_cast<long long>(B),
                  static_cast<long long>(o.prompt), static_cast<long long>(prefill_forwards), prefill_s,
                  static_cast<long long>(context_mid));
    const auto profile = m.take_profile(); // RLSERVE_GPU_PROFILE: eager steps, per phase
    double profiled = 0, attention = 0;
    for (const auto& [phase, total] : profile) {
      std::printf("      %-28s %8.3f ms / step\n", phase.c_str(), total / double(o.steps));
      profiled += total / double(o.steps);
      if (phase == "paged attention")
        attention = total / double(o.steps);
    }
    if (!profile.empty()) {
      r.profiled_ms = profiled;
      r.attention_ms = attention;
      // KV bytes over the attention phase's time: how close attention comes to copy bandwidth.
      std::printf("      attention share: %.3f of %.3f ms per eager step (%.0f%%); KV %.3f GB in it: %.2f TB/s "
                  "(%.0f%% of copy)\n",
                  attention, profiled, profiled > 0 ? 100.0 * attention / profiled : 0.0, r.kv_gb,
                  attention > 0 ? kb / (attention * 1e-3) / 1e12 : 0.0,
                  attention > 0 ? 100.0 * kb / (attention * 1e-3) / copy_bw : 0.0);
    }
    if (o.profile_steps > 0) { // after every number above: the profiler's replays skew none of them
      gpu_profiler_range(true);
      for (int64_t i = 0; i < o.profile_steps; ++i)
        step();
      gpu_profiler_range(false);
      m.take_profile();
    }
    rows.push_back(r);
    std::fflush(stdout);
  }
  return true;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    auto arg = std::string(argv[i]);
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "decode_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--batches")
      o.batches = parse_list(value());
    else if (arg == "--prompt")
      o.prompt = std::stoll(value());
    else if (arg == "--steps")
      o.steps = std::stoll(value());
    else if (arg == "--layers")
      o.layers = std::stoll(value());
    else if (arg == "--mode")
      o.mode = value();
    else if (arg == "--no-graphs")
      o.graphs = false;
    else if (arg == "--batch-invariant")
      o.batch_invariant = true;
    else if (arg == "--linears") {
      const std::string v = value();
      if (v != "gemv" && v != "cublas") {
        std::fprintf(stderr, "decode_bench: --linears takes gemv or cublas, not '%s'\n", v.c_str());
        return 2;
      }
      o.gemv = v == "gemv";
    }
    else if (arg == "--prefill") {
      const std::string v = value();
      if (v != "full" && v != "none") {
        std::fprintf(stderr, "decode_bench: --prefill takes full or none, not '%s'\n", v.c_str());
        return 2;
      }
      o.prefill = v == "full";
    }
    else if (arg == "--profile-steps")
      o.profile_steps = std::max<int64_t>(0, std::stoll(value()));
    else if (arg == "--json")
      o.json = value();
    else {
      std::fprintf(stderr, "decode_bench: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  {
    const auto c = bench::qwen3_30b_a3b(o.layers);
    const int64_t positions = o.prompt + o.warmup + o.steps + o.profile_steps;
    if (o.mode != "both" && o.mode != "int4" && o.mode != "bf16") {
      std::fprintf(stderr, "decode_bench: --mode takes both, int4 or bf16, not '%s'\n", o.mode.c_str());
      return 2;
    }
    if (o.prompt < (o.prefill ? 1 : 0) || o.steps < 1 || o.layers < 1 || o.batches.empty() ||
        *std::min_element(o.batches.begin(), o.batches.end()) < 1) {
      std::fprintf(stderr, "decode_bench: --prompt (at least 1 unless --prefill none), --steps, --layers and "
                           "every batch must be positive\n");
      return 2;
    }
    if (positions > c.max_position_embeddings) {
      std::fprintf(stderr, "decode_bench: --prompt %lld + %lld warm-up + %lld steps = %lld positions exceed the "
                           "model's %lld\n",
                   static_cast<long long>(o.prompt), static_cast<long long>(o.warmup),
                   static_cast<long long>(o.steps), static_cast<long long>(positions),
                   static_cast<long long>(c.max_position_embeddings));
      return 2;
    }
  }
  auto bw = gpu_copy_bandwidth(0, std::size_t{1} << 30, 20);
  if (!bw) {
    std::fprintf(stderr, "decode_bench: %s\n", bw.error().c_str());
    return 1;
  }
  std::printf("device-to-device copy: %.2f TB/s (read + write)\n", *bw / 1e12);
  std::vector<row> rows;
  if (o.mode == "both" || o.mode == "int4")
    if (!run_mode(o, true, *bw, rows))
      return 1;
  if (o.mode == "both" || o.mode == "bf16")
    if (!run_mode(o, false, *bw, rows))
      return 1;
  std::printf("\n| batch | INT4 step ms | INT4 tok/s | INT4 %% of roofline | BF16 step ms | BF16 tok/s | INT4 / BF16 |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (auto B : o.batches) {
    const row *a = nullptr, *b = nullptr;
    for (const auto& r : rows)
      if (r.batch == B)
        (r.mode == "int4" ? a : b) = &r;
    auto cell = [](const row* r, double v, const char* f) {
      char buf[32];
      if (!r)
        return std::string("-");
      std::snprintf(buf, sizeof buf, f, v);
      return std::string(buf);
    };
    std::printf("| %lld | %s | %s | %s | %s | %s | %s |\n", static_cast<long long>(B),
                cell(a, a ? a->step_ms : 0, "%.3f").c_str(), cell(a, a ? a->tokens_per_s : 0, "%.0f").c_str(),
                cell(a, a ? 100.0 * a->roofline_ms / a->step_ms : 0, "%.0f%%").c_str(),
                cell(b, b ? b->step_ms : 0, "%.3f").c_str(), cell(b, b ? b->tokens_per_s : 0, "%.0f").c_str(),
                (a && b) ? cell(a, b->step_ms / a->step_ms, "%.2fx").c_str() : "-");
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\"copy_bandwidth_bytes_per_s\": " << *bw << ", \"rows\": [";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      f << (i ? ", " : "") << "{\"mode\": \"" << r.mode << "\", \"batch\": " << r.batch
        << ", \"step_ms\": " << r.step_ms << ", \"tokens_per_s\": " << r.tokens_per_s
        << ", \"roofline_ms\": " << r.roofline_ms << ", \"weight_gb\": " << r.weight_gb
        << ", \"kv_gb\": " << r.kv_gb << ", \"distinct_tokens_last_step\": " << r.distinct
        << ", \"token_hash\": \"" << std::hex << r.token_hash << "\", \"logprob_hash\": \"" << r.logprob_hash
        << std::dec << "\", \"prompt\": " << o.prompt << ", \"prefill\": \"" << (o.prefill ? "full" : "none")
        << "\", \"prefill_s\": " << r.prefill_s << ", \"context_mid\": " << r.context
        << ", \"kv_share_of_roofline\": " << r.kv_share;
      if (r.attention_ms >= 0)
        f << ", \"profiled_step_ms\": " << r.profiled_ms << ", \"attention_ms\": " << r.attention_ms;
      f << "}";
    }
    f << "]}\n";
  }
  return 0;
}
