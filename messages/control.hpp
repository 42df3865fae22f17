// Control messages: pause / continue (docs/sglang-contract.md, 'Pause modes'), cache flush, server
// info and health.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "caf/meta/type_name.hpp"
#include "messages/enums.hpp"
#include "messages/std_optional_inspect.hpp"

namespace rlserve {

// abort: in-flight requests end with finish reason "abort" and their partial output.
// retract: KV freed, requests go back to the queue with their tokens and resume on continue.
// in_place: nothing freed; decoding stops and resumes on continue.
// drain: new requests wait for continue, running ones run to their end; the reply comes when
//   none is left (vLLM's /pause?mode=wait; SGLang has no such mode).
// JSON: "abort" | "retract" | "in_place" | "drain".
enum class pause_mode : uint8_t { abort = 1, retract, in_place, drain };

struct PauseGenerationReqInput {
  pause_mode mode = pause_mode::abort;
};

struct PauseGenerationReqOutput {
  bool success = true;
  std::string message;
};

struct ContinueGenerationReqInput {
  bool torch_empty_cache = true;
};

struct ContinueGenerationReqOutput {
  bool success = true;
  std::string message;
};

// Drops cached KV (prefix cache). Refused while requests are running; with timeout_s the engine
// waits up to that long for them to finish first.
struct FlushCacheReqInput {
  std::optional<double> timeout_s;
};

struct FlushCacheReqOutput {
  bool success = true;
  std::string message;
};

// Gives the GPU memory of `tags` back to the driver for a colocated trainer (SGLang's
// release_memory_occupation): "weights", "kv_cache", "cuda_graph" (the forward's activations and
// workspaces); empty: all three. Refused while a request holds KV (pause with mode "abort" or
// "retract", or wait until idle). Until resumed, generate requests are refused (queued retracted
// ones wait), and while the weights are released so is every weight operation. Also the runner's
// message (tags then canonical: never empty).
// SGLang's memory tags, in the order replies name them.
inline constexpr std::array<std::string_view, 3> k_memory_tags{"weights", "kv_cache", "cuda_graph"};

// The index of the first tag that is not one of k_memory_tags, if any.
std::optional<std::size_t> find_unknown_memory_tag(const std::vector<std::string>& tags);

// The known tags of `tags` in k_memory_tags order, each once; all three when `tags` is empty.
std::vector<std::string> canonical_memory_tags(const std::vector<std::string>& tags);

struct ReleaseMemoryOccupationReqInput {
  std::vector<std::string> tags;
};

struct ReleaseMemoryOccupationReqOutput {
  bool success = true;
  std::string message;
};

// Takes the memory of `tags` again (empty: all). The weights are those of before with
// --enable-weights-cpu-backup, else undefined until an update writes them; the KV pool is empty.
struct ResumeMemoryOccupationReqInput {
  std::vector<std::string> tags;
};

struct ResumeMemoryOccupationReqOutput {
  bool success = true;
  std::string message;
};

struct GetServerInfoReqInput {};

struct GetServerInfoReqOutput {
  bool success = true;
  std::string message;
  std::string model_path;
  std::string draft_model_path; // empty without a draft
  std::string weight_version;
  std::string device;           // "cpu" or "cuda:<n> (<name>)"
  std::string architecture;
  int64_t vocab_size = 0;
  int64_t max_context_length = 0;
  bool paused = false;
  std::string pause_mode;       // the mode of the current pause, or empty
  bool weight_update_session_open = false;
  int32_t running_requests = 0;
  int32_t waiting_requests = 0;
  uint64_t committed_updates = 0;
  // Forward batches the scheduler has sent, and the CPU time its own work took (planning,
  // bookkeeping, results, chunks; not the runner's forward): overhead per step = cpu / steps.
  uint64_t scheduler_steps = 0;
  double scheduler_cpu_us = 0.0;
  // Speculative decoding: draft tokens proposed per step (0: off), and acceptance since start
  // and over the most recent verification steps (to watch acceptance after an update).
  int32_t speculative_num_draft_tokens = 0;
  uint64_t spec_verify_steps = 0;
  uint64_t spec_accepted_tokens = 0;
  uint64_t spec_proposed_drafts = 0;      // draft tokens verified (accepted or not), since start
  double spec_accept_rate = 0.0;          // accepted / proposed, since start
  double spec_accept_length = 0.0;        // tokens per verification step, since start
  double spec_recent_accept_length = 0.0; // the same over the last 256 verification steps
  // How this engine takes weights: "inline" and "disk" always, "cuda_ipc" when every runner
  // reads tensors from a trainer's GPU, "nccl" when every runner joins weight-update groups.
  std::vector<std::string> weight_transports;
  // The target's INT4 (W4A16) modules, and what BF16 updates of them are quantized with and
  // where ("device" or "host"); 0 and empty for a BF16 model.
  int32_t int4_modules = 0;
  std::string int4_update_recipe;
  std::string int4_quantized_on;
  // The scheduler's limits and KV use, by SGLang's names (its scheduler_info and /v1/loads):
  // requests in one batch, tokens the KV pool holds, and tokens its used blocks hold.
  int32_t max_running_requests = 0;
  int64_t max_total_num_tokens = 0;
  int64_t num_used_tokens = 0;
  // The prefix cache (false: --disable-radix-cache): tokens whose KV it holds, prompt + output
  // tokens of admitted requests and how many of them it served (the hit rate is their ratio),
  // and tokens prefilled (computed, not served from the cache) since start.
  bool prefix_cache = false;
  int64_t prefix_cached_tokens = 0;
  uint64_t prefix_query_tokens = 0;
  uint64_t prefix_hit_tokens = 0;
  uint64_t prefill_tokens = 0;
};

// Share of admitted requests' tokens the prefix cache served (SGLang's cache_hit_rate).
inline double cache_hit_rate(const GetServerInfoReqOutput& x) {
  return x.prefix_query_tokens > 0
           ? static_cast<double>(x.prefix_hit_tokens) / static_cast<double>(x.prefix_query_tokens)
           : 0.0;
}

struct HealthCheckReqInput {};

struct HealthCheckReqOutput {
  bool success = true;
  std::string message;
};

// ---- inspect (CAF 0.17 form) ------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PauseGenerationReqInput& x) {
  return f(caf::meta::type_name("PauseGenerationReqInput"), x.mode);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PauseGenerationReqOutput& x) {
  return f(caf::meta::type_name("PauseGenerationReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ContinueGenerationReqInput& x) {
  return f(caf::meta::type_name("ContinueGenerationReqInput"), x.torch_empty_cache);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ContinueGenerationReqOutput& x) {
  return f(caf::meta::type_name("ContinueGenerationReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FlushCacheReqInput& x) {
  return f(caf::meta::type_name("FlushCacheReqInput"), x.timeout_s);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FlushCacheReqOutput& x) {
  return f(caf::meta::type_name("FlushCacheReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReleaseMemoryOccupationReqInput& x) {
  return f(caf::meta::type_name("ReleaseMemoryOccupationReqInput"), x.tags);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReleaseMemoryOccupationReqOutput& x) {
  return f(caf::meta::type_name("ReleaseMemoryOccupationReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ResumeMemoryOccupationReqInput& x) {
  return f(caf::meta::type_name("ResumeMemoryOccupationReqInput"), x.tags);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ResumeMemoryOccupationReqOutput& x) {
  return f(caf::meta::type_name("ResumeMemoryOccupationReqOutput"), x.success, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GetServerInfoReqInput&) {
  return f(caf::meta::type_name("GetServerInfoReqInput"));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GetServerInfoReqOutput& x) {
  return f(caf::meta::type_name("GetServerInfoReqOutput"), x.success, x.message, x.model_path,
           x.draft_model_path, x.weight_version, x.device, x.architecture, x.vocab_size,
           x.max_context_length, x.paused, x.pause_mode, x.weight_update_session_open,
           x.running_requests, x.waiting_requests, x.committed_updates,
           x.scheduler_steps, x.scheduler_cpu_us, x.speculative_num_draft_tokens,
           x.spec_verify_steps, x.spec_accepted_tokens, x.spec_proposed_drafts, x.spec_accept_rate,
           x.spec_accept_length, x.spec_recent_accept_length, x.weight_transports, x.int4_modules,
           x.int4_update_recipe, x.int4_quantized_on, x.max_running_requests,
           x.max_total_num_tokens, x.num_used_tokens, x.prefix_cache, x.prefix_cached_tokens,
           x.prefix_query_tokens, x.prefix_hit_tokens, x.prefill_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HealthCheckReqInput&) {
  return f(caf::meta::type_name("HealthCheckReqInput"));
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HealthCheckReqOutput& x) {
  return f(caf::meta::type_name("HealthCheckReqOutput"), x.success, x.message);
}

} // namespace rlserve
