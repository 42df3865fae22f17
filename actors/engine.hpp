// rlserve::Engine — the in-process API. A plain C++ class (not an actor): it builds the actor
// system and the graph of docs/architecture.md from a config, and offers a blocking call per
// message family. The command line, the websocket server and embedding applications all sit on it.
//
//   auto engine = rlserve::Engine::start({.model_path = "/models/qwen3-tiny"});
//   if (!engine) { std::cerr << engine.error(); return 1; }
//   rlserve::GenerateReqInput req;
//   req.text = "Hello";
//   auto out = (*engine)->generate(req);   // out.text, out.output_ids, out.weight_version
//
// Every call is thread-safe and may be made from many threads at once. Streaming callbacks run
// on one of the engine's worker threads, one chunk at a time per request; they must not call
// back into the engine synchronously.
#pragma once

#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "actors/profiler.hpp"
#include "actors/runner_actor.hpp"
#include "actors/tokenizer_actor.hpp"
#include "messages/all.hpp"
#include "messages/expected.hpp"

namespace caf {
class actor_system;
class actor_system_config;
} // namespace caf

namespace rlserve {

struct engine_config {
  // A Hugging Face model directory. Empty: the built-in tiny Qwen3 model, written by
  // `make-model --preset tiny --seed 0` into builtin_model_dir() on first use.
  std::filesystem::path model_path;
  // Optional speculative draft model (same vocabulary as the target). With one, every decode
  // step the draft proposes speculative_num_draft_tokens tokens and the target verifies them in
  // one forward (0: the draft is loaded and updated but not used for decoding).
  std::filesystem::path draft_model_path;
  int32_t speculative_num_draft_tokens = 4;
  int32_t max_running_requests = 64;
  // Tokens one forward batch may run; longer prompts are prefilled in chunks of at most this.
  int64_t max_batch_tokens = 2048;
  // KV pool of each runner: tokens it can hold in all, in blocks of kv_block_size tokens.
  int64_t kv_cache_tokens = 32768;
  int64_t kv_block_size = 16;
  // Turns the prefix cache off (SGLang's flag): every request then prefills its whole prompt.
  // On, requests reuse the KV of block-aligned prefixes computed with the weights serving now.
  bool disable_radix_cache = false;
  // Output tokens per streamed chunk for requests that do not set sampling_params.stream_interval
  // (SGLang's --stream-interval).
  int32_t stream_interval = 1;
  std::string initial_weight_version = "0";
  // Where the runners run: "auto" (the GPU when this build has CUDA and a device is visible,
  // else the CPU), "cpu", or "cuda" / "cuda:N" (fails at start when there is no such device).
  std::string device = "auto";
  // GPU runners: capture decode steps as CUDA graphs (one per batch bucket).
  bool cuda_graphs = true;
  // SGLang's --enable-deterministic-inference: a request's tokens and logprobs do not depend on
  // the requests batched with it or on how its prompt was chunked (model::gpu_options::
  // batch_invariant on GPU runners; the CPU runner's forward is batch-invariant already). Slower
  // on the GPU (docs/performance.md). Seeded sampling then reproduces a rollout bit for bit.
  bool enable_deterministic_inference = false;
  // Quantize the target model's BF16 checkpoint to INT4 (W4A16) at load: "" (no), "int4-asym",
  // "int4-sym-qat" or "int4-sym", in groups of quantize_group_size (32, 64, 128, -1 per channel)
  // over quantize_targets ("experts" or "linear") — the same bytes `rlserve quantize` writes.
  // BF16 weight updates of those modules are then quantized with the same recipe. Refused on a
  // checkpoint that is already INT4. The draft model (if any) is loaded as it is.
  std::string quantize;
  int32_t quantize_group_size = 128;
  std::string quantize_targets = "experts";
  // Accept NaN and infinity in weight updates (tensor and disk; checked on the host for CPU
  // runners, on the device for GPU runners). Refused by default: such weights make a dense model
  // emit token 0 with logprob -inf and a MoE model fail every request, all while reporting success.
  bool allow_non_finite_weights = false;
  // release_memory_occupation copies the weights to pinned host memory and resume restores them
  // (SGLang's --enable-weights-cpu-backup). Without it they are undefined after a resume until
  // the trainer sends new ones (a colocated trainer always does).
  bool enable_weights_cpu_backup = false;
  // GPU runners: device bytes one weight-update session may stage before its commit (0: one full
  // copy of the served weights). A message that would exceed it is refused whole.
  std::size_t gpu_staging_budget_bytes = 0;
  // CAF worker threads for the cooperative actors; 0: CAF's default (one per core).
  std::size_t worker_threads = 0;
};

// Where the built-in model lives: $RLSERVE_CACHE_DIR, else $XDG_CACHE_HOME/rlserve, else
// ~/.cache/rlserve; the model itself in <that>/tiny-qwen3 (a tiny dense Qwen3 for the CPU), or
// with `gpu` in <that>/gpu-qwen3-moe (make-model's "medium" Qwen3-MoE: the smallest shapes the
// GPU kernels run).
std::filesystem::path builtin_model_dir(bool gpu = false);
// Writes the built-in model there unless it is already complete; returns its directory.
expected<std::filesystem::path> ensure_builtin_model(bool gpu = false);

using chunk_callback = std::function<void(const GenerateReqOutput&)>;

class Engine {
public:
  // Loads the model(s) (a bad checkpoint is an error here, not a dead actor later), spawns the
  // graph, and returns when it is ready to serve.
  static expected<std::unique_ptr<Engine>> start(engine_config config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- generation ----
  // Runs one request to its end and returns the whole result.
  GenerateReqOutput generate(GenerateReqInput req);
  // The same, with every streamed chunk passed to `on_chunk` first (req.stream is forced on).
  GenerateReqOutput generate(GenerateReqInput req, chunk_callback on_chunk);
  // Submits and returns at once; the future holds the whole result.
  std::future<GenerateReqOutput> generate_async(GenerateReqInput req, chunk_callback on_chunk = {});

  // ---- every other operation: one blocking method per line of messages/operations.hpp ----
  // e.g. pause_generation, flush_cache, get_server_info, health, abort, begin_weight_update,
  // update_weights_from_tensor, update_weights_from_disk, end_weight_update, check_weights.
#define RLSERVE_ENGINE_METHOD(route, method, In, Out, auth, role) Out method(In req = {});
  RLSERVE_CONTROL_OPERATIONS(RLSERVE_ENGINE_METHOD, RLSERVE_OP_NOTHING)
  RLSERVE_WEIGHT_OPERATIONS(RLSERVE_ENGINE_METHOD, RLSERVE_OP_NOTHING)
#undef RLSERVE_ENGINE_METHOD

  // ---- for front ends built on the engine (websocket server) ----
  caf::actor_system& system();
  tokenizer_actor front_door() const;
  // The target runner's manifest: every parameter name with its load-format dtype and shape.
  const RunnerManifest& target_manifest() const;
  // The draft's, when one is loaded.
  const RunnerManifest* draft_manifest() const;
  const std::filesystem::path& model_path() const;
  // The target model's tokenizer (tokenizer.json), shared; null when the model has none.
  std::shared_ptr<const model::bpe_tokenizer> tokenizer() const;
  // The recorder of /start_profile and /stop_profile: start() it, run work, stop() it for a
  // Chrome trace of the scheduler's and runners' steps (actors/profiler.hpp).
  std::shared_ptr<profiler> profile() const;

  // Fault injection for tests: ends one actor as a crash would ("tokenizer", "scheduler",
  // "weight_updater", "runner" (the target's), "draft_runner"). The engine must answer every
  // request, in flight or new, with an error where it cannot serve it, and shut down cleanly.
  status kill_actor_for_test(std::string_view kind);

private:
  struct impl;
  explicit Engine(std::unique_ptr<impl> p);
  template <class Out, class In>
  Out call(In req);
  std::unique_ptr<impl> impl_;
};

} // namespace rlserve
