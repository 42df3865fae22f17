// speculative_bench: the cost model of speculative decoding on the GPU runner, in one run, at the
// Qwen3-30B-A3B shape (INT4-asym g128 experts, random weights made on the device) with a small
// dense draft of Qwen3-0.6B's shape (hidden 1024, 28 layers, 16 q / 8 kv heads of 128, MLP 3072,
// the same vocabulary, BF16). With random weights an acceptance rate means nothing, so the
// benchmark measures the three times speculation trades, per batch size B and proposal count k:
//
//   t_decode      one target-only decode step (forward_sample: forward and sampling on the device)
//   t_draft(k)    the draft proposing k tokens: k forwards of one token per sequence, each drawing
//                 on the device and keeping its distribution (gpu_draft_distributions)
//   t_verify(k)   the target running the pending token and the k proposals (k + 1 positions) and
//                 verifying them on the device (filtered_probs + spec_verify)
//
// all sampled (temperature 1), as the GPU runner runs them. With per-proposal acceptance
// probability a (independent), a step emits E(a, k) = (1 - a^(k+1)) / (1 - a) tokens (k + 1 at
// a = 1), so the speed-up over target-only decoding is
//
//   speed-up(a, k) = E(a, k) * t_decode / (t_draft(k) + t_verify(k)),
//
// printed as a table over a. Last, one measured end-to-end point: greedy decoding with the target
// as its own draft (a second model with the same seed, so the same weights; both prefill the same
// 16-token prompt), proposals and verifications on the device, KV cut to the accepted prefix;
// tokens per second against target-only greedy decoding, with the acceptance it reached (1.0 when
// every row's argmax is the same in a chunk of k + 1 and in a one-token step: --batch-invariant
// makes that exact).
//
//   speculative_bench [--batches 1,8,32] [--ks 2,3,4,5,6] [--prompt 256] [--repeats 10]
//                     [--layers 48] [--draft-layers 28] [--self-k 4] [--self-steps 32]
//                     [--batch-invariant] [--json FILE]
// Sequences start with `--prompt` positions counted as cached (decode_bench's --prefill none:
// attention reads a context of that length; the tokens mean nothing). Every timed call is
// followed by cutting the KV back, so each repeat runs at the same context.
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
#include "model/gpu_draft_distributions.hpp"
#include "model/qwen3.hpp"
#include "model/qwen3_gpu.hpp"

using namespace rlserve;
using namespace rlserve::model;

namespace {

struct options {
  std::vector<int64_t> batches{1, 8, 32};
  std::vector<int64_t> ks{2, 3, 4, 5, 6};
  int64_t prompt = 256;
  int64_t repeats = 10;
  int64_t layers = 48;
  int64_t draft_layers = 28;
  int64_t self_k = 4;
  int64_t self_steps = 32;
  bool batch_invariant = false;
  std::string json;
};

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    out.push_back(std::strtoll(p, nullptr, 10));
    p = std::strchr(p, ',');
    if (!p)
      break;
    ++p;
  }
  return out;
}

model_config qwen3_0_6b_shape(int64_t layers) {
  model_config c = bench::qwen3_30b_a3b(layers);
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.hidden_size = 1024;
  c.intermediate_size = 3072;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.num_experts = 0;
  c.num_experts_per_tok = 0;
  c.moe_intermediate_size = 0;
  c.tie_word_embeddings = true;
  return c;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "speculative_bench: %s\n", what.c_str());
  std::exit(1);
}

template <class F>
double time_ms(int64_t repeats, F&& f) {
  f(); // warm-up (graphs captured, scratch taken)
  const auto start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < repeats; ++r)
    f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
         double(repeats);
}

// B sequences over blocks of 16, `positions` positions each, `prompt` of them counted as cached.
std::vector<kv_sequence> sequences(int64_t B, int64_t prompt, int64_t per_seq_blocks) {
  std::vector<kv_sequence> kv(static_cast<std::size_t>(B));
  int32_t next = 0;
  for (auto& s : kv) {
    for (int64_t b = 0; b < per_seq_blocks; ++b)
      s.blocks.push_back(next++);
    s.length = prompt;
  }
  return kv;
}

constexpr int64_t k_self_prompt = 16; // the end-to-end point's real prompt, per sequence

struct cost_row {
  int64_t batch = 0, k = 0;
  double decode_ms = 0, draft_ms = 0, verify_ms = 0;
};

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc)
        die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--batches") o.batches = parse_list(next());
    else if (a == "--ks") o.ks = parse_list(next());
    else if (a == "--prompt") o.prompt = std::atoll(next());
    else if (a == "--repeats") o.repeats = std::atoll(next());
    else if (a == "--layers") o.layers = std::atoll(next());
    else if (a == "--draft-layers") o.draft_layers = std::atoll(next());
    else if (a == "--self-k") o.self_k = std::atoll(next());
    else if (a == "--self-steps") o.self_steps = std::atoll(next());
    else if (a == "--batch-invariant") o.batch_invariant = true;
    else if (a == "--json") o.json = next();
    else die("unknown argument " + a);
  }
  int64_t max_b = 1, max_k = 1;
  for (auto b : o.batches)
    max_b = std::max(max_b, b);
  for (auto k : o.ks)
    max_k = std::max(max_k, k);
  max_k = std::max(max_k, o.self_k);
  const int64_t per_seq_blocks = (o.prompt + (max_k + 2) * (o.self_steps + 2)) / 16 + 2;
  gpu_options g;
  g.kv_block_size = 16;
  g.kv_num_blocks = max_b * per_seq_blocks + 1;
  g.max_batch_tokens = std::max<int64_t>(2048, max_b * (max_k + 1));
  g.max_sequences = max_b;
  g.batch_invariant = o.batch_invariant;
  const auto tc = bench::qwen3_30b_a3b(o.layers);
  auto target = qwen3_gpu_model::create_random(tc, random_int4{128, false}, 42, g);
  if (!target)
    die("target: " + target.error());
  auto draft = qwen3_gpu_model::create_random(qwen3_0_6b_shape(o.draft_layers), std::nullopt, 43, g);
  if (!draft)
    die("draft: " + draft.error());
  auto store = gpu_draft_distributions::create(g.device, tc.vocab_size, max_k);
  if (!store)
    die(store.error());
  auto& T = **target;
  auto& Dm = **draft;
  std::printf("target: Qwen3-30B-A3B shape, %lld layers, INT4-asym g128 experts, %.1f GB; draft: Qwen3-0.6B "
              "shape, %lld layers, BF16, %.1f GB; on %s%s\n",
              static_cast<long long>(o.layers), double(T.weight_bytes()) / 1e9,
              static_cast<long long>(o.draft_layers), double(Dm.weight_bytes()) / 1e9, T.device_name().c_str(),
              o.batch_invariant ? " (batch-invariant)" : "");

  std::mt19937_64 rng(7);
  const auto V = static_cast<uint64_t>(tc.vocab_size);
  auto uniform = [&] { return static_cast<float>(rng() >> 40) * 0x1.0p-24f; };
  const gpu_sample_row sampled{1.0f, -1, 1.0f, 0.0f, 0.0f};
  std::vector<cost_row> costs;
  for (auto B : o.batches) {
    auto tkv = sequences(B, o.prompt, per_seq_blocks), dkv = sequences(B, o.prompt, per_seq_blocks);
    std::vector<int32_t> current(static_cast<std::size_t>(B));
    for (auto& t : current)
      t = static_cast<int32_t>(rng() % V);
    // target-only decode
    std::vector<gpu_sample_row> rows(static_cast<std::size_t>(B), sampled);
    std::vector<int32_t> tokens;
    std::vector<float> logprobs, logits;
    const double decode_ms = time_ms(o.repeats, [&] {
      std::vector<forward_item> items;
      for (int64_t i = 0; i < B; ++i) {
        rows[i].uniform = uniform();
        items.push_back({&tkv[i], std::span<const int32_t>(&current[i], 1), 1});
      }
      if (auto s = T.forward_sample(items, rows, tokens, logprobs); !s)
        die("decode: " + s.error());
      for (auto& kv : tkv)
        kv.length -= 1;
    });
    for (auto k : o.ks) {
      // the draft: k one-token forwards, each drawing on the device and keeping q
      std::vector<std::vector<int32_t>> proposed(static_cast<std::size_t>(B));
      std::vector<std::vector<float>> u(static_cast<std::size_t>(B));
      const double draft_ms = time_ms(o.repeats, [&] {
        for (auto& p : proposed)
          p.clear();
        for (int64_t round = 0; round < k; ++round) {
          std::vector<forward_item> items;
          std::vector<gpu_spec_item> spec;
          for (int64_t i = 0; i < B; ++i) {
            const int32_t* tok = round == 0 ? &current[i] : &proposed[i].back();
            items.push_back({&dkv[i], std::span<const int32_t>(tok, 1), 1});
            u[i].assign(1, uniform());
            gpu_spec_item x;
            x.sampling = sampled;
            x.uniforms = u[i];
            auto row = (*store)->row_for_writing(static_cast<uint64_t>(i), round);
            if (!row)
              die(row.error());
            x.keep_row = *row;
            spec.push_back(x);
          }
          gpu_spec_result out;
          if (auto s = Dm.forward(items, logits, nullptr, spec, out); !s)
            die("draft: " + s.error());
          for (int64_t i = 0; i < B; ++i)
            proposed[i].push_back(out.tokens[i]);
        }
        for (auto& kv : dkv)
          kv.length -= k;
      });
      // the target: pending token + k proposals, verified against the kept q rows
      std::vector<std::vector<int32_t>> run(static_cast<std::size_t>(B));
      std::vector<std::vector<const float*>> q(static_cast<std::size_t>(B));
      for (int64_t i = 0; i < B; ++i) {
        run[i] = {current[i]};
        run[i].insert(run[i].end(), proposed[i].begin(), proposed[i].end());
        auto r = (*store)->rows(static_cast<uint64_t>(i), k);
        if (!r)
          die(r.error());
        q[i] = *r;
      }
      const double verify_ms = time_ms(o.repeats, [&] {
        std::vector<forward_item> items;
        std::vector<gpu_spec_item> spec;
        for (int64_t i = 0; i < B; ++i) {
          items.push_back({&tkv[i], run[i], k + 1});
          u[i].clear();
          for (int64_t j = 0; j <= k; ++j)
            u[i].push_back(uniform());
          gpu_spec_item x;
          x.sampling = sampled;
          x.draft_tokens = std::span<const int32_t>(run[i].data() + 1, static_cast<std::size_t>(k));
          x.uniforms = u[i];
          x.draft_rows = q[i];
          spec.push_back(x);
        }
        gpu_spec_result out;
        if (auto s = T.forward(items, logits, nullptr, spec, out); !s)
          die("verify: " + s.error());
        for (auto& kv : tkv)
          kv.length -= k + 1;
      });
      costs.push_back({B, k, decode_ms, draft_ms, verify_ms});
    }
  }

  const std::vector<double> alphas{0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  std::printf("\n| batch | k | target decode ms | draft k tokens ms | target verify k+1 ms | speed-up at a =");
  for (auto a : alphas)
    std::printf(" %.1f |", a);
  std::printf("\n|---|---|---|---|---|");
  for (std::size_t i = 0; i < alphas.size(); ++i)
    std::printf("---|");
  std::printf("\n");
  for (const auto& c : costs) {
    std::printf("| %lld | %lld | %.3f | %.3f | %.3f |", static_cast<long long>(c.batch),
                static_cast<long long>(c.k), c.decode_ms, c.draft_ms, c.verify_ms);
    for (auto a : alphas) {
      const double emitted = a >= 1.0 ? double(c.k + 1) : (1.0 - std::pow(a, double(c.k + 1))) / (1.0 - a);
      std::printf(" %.2f |", emitted * c.decode_ms / (c.draft_ms + c.verify_ms));
    }
    std::printf("\n");
  }

  // End to end: greedy with the target as its own draft.
  auto twin = qwen3_gpu_model::create_random(tc, random_int4{128, false}, 42, g);
  if (!twin)
    die("the target's twin (its own draft): " + twin.error());
  auto& Tw = **twin;
  const int64_t K = o.self_k;
  std::printf("\ntarget as its own draft (greedy, k = %lld, %lld steps):\n", static_cast<long long>(K),
              static_cast<long long>(o.self_steps));
  std::string json_self;
  // Both models prefill the same real prompt: a context only counted as cached (as the cost model
  // above runs) would hold different bytes in the two pools, and the twin would not be the
  // target's function (acceptance ~0).
  const int64_t P = k_self_prompt;
  for (auto B : o.batches) {
    auto tkv = sequences(B, 0, per_seq_blocks), dkv = sequences(B, 0, per_seq_blocks);
    std::vector<std::vector<int32_t>> prompts(static_cast<std::size_t>(B));
    for (auto& p : prompts)
      for (int64_t j = 0; j < P; ++j)
        p.push_back(static_cast<int32_t>(rng() % V));
    auto prefill = [&](qwen3_gpu_model& m, std::vector<kv_sequence>& kv) {
      std::vector<forward_item> items;
      for (int64_t i = 0; i < B; ++i)
        items.push_back({&kv[i], prompts[i], 1});
      std::vector<float> prompt_logits;
      if (auto st = m.forward(items, prompt_logits); !st)
        die("self prompt: " + st.error());
    };
    prefill(T, tkv);
    prefill(Tw, dkv);
    std::vector<int32_t> start(static_cast<std::size_t>(B));
    for (auto& t : start)
      t = static_cast<int32_t>(rng() % V);
    // target-only greedy: one token per sequence per step
    std::vector<gpu_sample_row> greedy_rows(static_cast<std::size_t>(B));
    auto current = start;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs, logits;
    const int64_t plain_steps = o.self_steps * (K + 1);
    const double plain_ms = time_ms(1, [&] {
      for (int64_t s = 0; s < plain_steps; ++s) {
        std::vector<forward_item> items;
        for (int64_t i = 0; i < B; ++i)
          items.push_back({&tkv[i], std::span<const int32_t>(&current[i], 1), 1});
        if (auto st = T.forward_sample(items, greedy_rows, tokens, logprobs); !st)
          die("plain decode: " + st.error());
        current = tokens;
      }
      for (auto& kv : tkv)
        kv.length = P;
      current = start;
    });
    const double plain_tps = double(B * plain_steps) / (plain_ms * 1e-3);
    // speculative: the draft catches up on what it lacks, proposes K, the target verifies
    std::vector<std::vector<int32_t>> missing(static_cast<std::size_t>(B));
    int64_t emitted = 0, verifications = 0, accepted_total = 0;
    const gpu_sample_row greedy{};
    const double spec_ms = time_ms(1, [&] {
      for (int64_t i = 0; i < B; ++i) {
        missing[i] = {start[i]};
        tkv[i].length = dkv[i].length = P;
      }
      emitted = verifications = accepted_total = 0;
      std::vector<std::vector<int32_t>> proposed(static_cast<std::size_t>(B)), run(static_cast<std::size_t>(B));
      std::vector<int32_t> pending(start);
      for (int64_t s = 0; s < o.self_steps; ++s) {
        for (auto& p : proposed)
          p.clear();
        for (int64_t round = 0; round < K; ++round) {
          std::vector<forward_item> items;
          std::vector<gpu_spec_item> spec(static_cast<std::size_t>(B));
          for (int64_t i = 0; i < B; ++i) {
            if (round == 0)
              items.push_back({&dkv[i], missing[i], 1});
            else
              items.push_back({&dkv[i], std::span<const int32_t>(&proposed[i].back(), 1), 1});
            spec[i].sampling = greedy;
          }
          gpu_spec_result out;
          if (auto st = Tw.forward(items, logits, nullptr, spec, out); !st)
            die("self draft: " + st.error());
          for (int64_t i = 0; i < B; ++i)
            proposed[i].push_back(out.tokens[i]);
        }
        std::vector<forward_item> items;
        std::vector<gpu_spec_item> spec(static_cast<std::size_t>(B));
        for (int64_t i = 0; i < B; ++i) {
          run[i] = {pending[i]};
          run[i].insert(run[i].end(), proposed[i].begin(), proposed[i].end());
          items.push_back({&tkv[i], run[i], K + 1});
          spec[i].sampling = greedy;
          spec[i].draft_tokens = std::span<const int32_t>(run[i].data() + 1, static_cast<std::size_t>(K));
        }
        gpu_spec_result out;
        if (auto st = T.forward(items, logits, nullptr, spec, out); !st)
          die("self verify: " + st.error());
        for (int64_t i = 0; i < B; ++i) {
          const int64_t a = out.accepted[i];
          tkv[i].length -= K - a; // keep the pending token and the accepted proposals
          // The draft ran the pending token and proposals 1 .. K-1; it keeps what was accepted
          // of those and lacks the rest of the accepted ones and the new pending token.
          const int64_t draft_kept = std::min<int64_t>(a, K - 1);
          dkv[i].length = tkv[i].length - (a - draft_kept);
          pending[i] = out.tokens[static_cast<std::size_t>(i * (K + 1) + a)];
          missing[i].assign(run[i].begin() + 1 + draft_kept, run[i].begin() + 1 + a);
          missing[i].push_back(pending[i]);
          emitted += a + 1;
          accepted_total += a;
          ++verifications;
        }
      }
    });
    const double spec_tps = double(emitted) / (spec_ms * 1e-3);
    const double accept = double(accepted_total) / double(verifications * K);
    std::printf("  batch %lld: %.0f tokens/s speculative, %.0f tokens/s target-only (%.2fx); acceptance %.3f, "
                "%.2f tokens per verification\n",
                static_cast<long long>(B), spec_tps, plain_tps, spec_tps / plain_tps, accept,
                double(emitted) / double(verifications));
    json_self += (json_self.empty() ? "" : ",") +
                 ("{\"batch\":" + std::to_string(B) + ",\"k\":" + std::to_string(K) +
                  ",\"speculative_tokens_per_s\":" + std::to_string(spec_tps) +
                  ",\"target_only_tokens_per_s\":" + std::to_string(plain_tps) +
                  ",\"acceptance\":" + std::to_string(accept) + "}");
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\"batch_invariant\":" << (o.batch_invariant ? "true" : "false") << ",\"costs\":[";
    for (std::size_t i = 0; i < costs.size(); ++i)
      f << (i ? "," : "") << "{\"batch\":" << costs[i].batch << ",\"k\":" << costs[i].k
        << ",\"decode_ms\":" << costs[i].decode_ms << ",\"draft_ms\":" << costs[i].draft_ms
        << ",\"verify_ms\":" << costs[i].verify_ms << "}";
    f << "],\"self_draft\":[" << json_self << "]}\n";
  }
  return 0;
}
