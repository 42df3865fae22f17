#include "actors/engine.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <type_traits>

#include "actors/guard.hpp"
#include "actors/runner_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/tokenizer_actor.hpp"
#include "actors/watch.hpp"
#include "actors/weight_updater_actor.hpp"
#include "caf/all.hpp"
#include "model/bpe_tokenizer.hpp"
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/gpu_draft_distributions.hpp"
#include "model/make_model.hpp"
#include "model/qwen3.hpp"
#include "model/qwen3_gpu.hpp"

namespace rlserve {

namespace fs = std::filesystem;

fs::path builtin_model_dir(bool gpu) {
  // The GPU kernels need head_dim >= 64 and INT4 groups of 128: the GPU demo's model is the
  // make-model "medium" Qwen3-MoE, the CPU's the "tiny" dense Qwen3 (fast to run on a core).
  const char* name = gpu ? "gpu-qwen3-moe" : "tiny-qwen3";
  if (const char* dir = std::getenv("RLSERVE_CACHE_DIR"); dir && *dir)
    return fs::path(dir) / name;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return fs::path(xdg) / "rlserve" / name;
  if (const char* home = std::getenv("HOME"); home && *home)
    return fs::path(home) / ".cache" / "rlserve" / name;
  return fs::temp_directory_path() / "rlserve" / name;
}

expected<fs::path> ensure_builtin_model(bool gpu) {
  auto dir = builtin_model_dir(gpu);
  std::error_code ec;
  bool complete = fs::exists(dir / "config.json", ec) && fs::exists(dir / "tokenizer.json", ec) &&
                  (fs::exists(dir / "model.safetensors", ec) || fs::exists(dir / "model.safetensors.index.json", ec));
  if (complete)
    return dir;
  fs::create_directories(dir, ec);
  if (ec)
    return fail("cannot create " + dir.string() + " for the built-in model: " + ec.message());
  model::make_model_options options;
  options.arch = gpu ? "qwen3-moe" : "qwen3";
  options.preset = gpu ? "medium" : "tiny";
  options.out = dir;
  options.seed = 0;
  if (auto ok = model::make_model(options); !ok)
    return fail("cannot write the built-in model to " + dir.string() + ": " + ok.error());
  return dir;
}

// A call of the Engine's API on its way to the front door (see engine_client below).
struct engine_call {
  std::function<void(caf::event_based_actor*, pending_requests&, const tokenizer_actor&)> send;
};

} // namespace rlserve

// Local only: it never leaves the process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rlserve::engine_call)

namespace rlserve {

namespace {

struct loaded_model {
  fs::path path;
  std::shared_ptr<model::qwen3_model> model;
  std::shared_ptr<const model::bpe_tokenizer> tokenizer; // null without tokenizer.json
};

// The load options engine_config asks for (quantize at load), or why they make no sense.
expected<model::qwen3_load_options> load_options(const engine_config& c) {
  model::qwen3_load_options o;
  if (c.quantize.empty())
    return o;
  model::quant::quantize_options q;
  auto recipe = kernels::parse_int4_recipe(c.quantize);
  if (!recipe)
    return fail("--quantize " + c.quantize + ": use int4-asym, int4-sym-qat or int4-sym");
  q.recipe = *recipe;
  if (!kernels::int4_group_size_supported(c.quantize_group_size))
    return fail("--group-size " + std::to_string(c.quantize_group_size) +
                ": use 32, 64, 128, or -1 for per-channel");
  q.group_size = c.quantize_group_size;
  auto targets = model::quant::parse_quant_targets(c.quantize_targets);
  if (!targets)
    return fail("quantize targets '" + c.quantize_targets + "': use experts or linear");
  q.targets = *targets;
  o.quantize = q;
  return o;
}

expected<loaded_model> load(const fs::path& dir, const char* role,
                            const model::qwen3_load_options& options = {}) {
  auto config = model::load_model_config(dir);
  if (!config)
    return fail(std::string(role) + " model: " + config.error());
  auto ckpt = model::checkpoint::open(dir);
  if (!ckpt)
    return fail(std::string(role) + " model: " + ckpt.error());
  auto m = model::qwen3_model::load(*config, *ckpt, options);
  if (!m)
    return fail(std::string(role) + " model: " + m.error());
  loaded_model out;
  out.path = dir;
  out.model = std::make_shared<model::qwen3_model>(std::move(*m));
  std::error_code ec;
  if (fs::exists(dir / "tokenizer.json", ec)) {
    auto tok = model::bpe_tokenizer::from_file(dir / "tokenizer.json");
    if (!tok)
      return fail(std::string(role) + " model: " + tok.error());
    out.tokenizer = std::make_shared<model::bpe_tokenizer>(std::move(*tok));
  }
  return out;
}

// One generate_async call: its future is fulfilled once the reply has arrived and, when
// streaming, the sink has handed the last chunk to the callback — whichever comes second.
struct pending_generate {
  std::mutex mtx;
  std::optional<GenerateReqOutput> reply;
  bool sink_finished = true; // set false when there is a sink
  std::promise<GenerateReqOutput> result;

  void on_reply(GenerateReqOutput out) {
    std::lock_guard<std::mutex> guard{mtx};
    if (sink_finished)
      result.set_value(std::move(out));
    else
      reply = std::move(out);
  }
  void on_sink_finished() {
    std::lock_guard<std::mutex> guard{mtx};
    sink_finished = true;
    if (reply)
      result.set_value(std::move(*reply));
  }
};

// Receives the streamed chunks of one request, calls the user's callback for each, and quits
// after the last one (the front door sends every streaming request a final chunk). The callback
// is the caller's code: an exception it throws is reported and the next chunks still come. Were
// it to end the sink, the last chunk would never be handed over and the call's future would
// wait forever (it waits for the reply and the sink's end).
caf::behavior chunk_sink(caf::event_based_actor* self, chunk_callback cb,
                         std::shared_ptr<pending_generate> pending) {
  return guarded_behavior<caf::behavior>(
    "chunk sink", [self, cb, pending](GenerateReqOutput& chunk) {
      guarded([&] { cb(chunk); },
              [](const std::string& what) {
                std::fprintf(stderr, "rlserve: a generate call's chunk callback threw: %s\n", what.c_str());
              });
      if (chunk.finished) {
        pending->on_sink_finished();
        self->quit();
      }
    });
}

template <class Out>
Out failed(std::string message) {
  Out out;
  out.success = false;
  out.message = std::move(message);
  if constexpr (std::is_same_v<Out, GenerateReqOutput>)
    out.finished = true;
  return out;
}

// The Engine's side of every call: one actor that sends each request to the front door and
// hands the reply to the caller's callback. It monitors the front door, so a call the front
// door dies holding is answered with an error (CAF 0.17 would leave it waiting forever), and,
// being one actor, it hands replies over in the order the front door sent them (a session's
// begin is never seen before the generate it waited for).
struct engine_client_state {
  tokenizer_actor front;
  pending_requests waits;
  static inline const char* name = "engine_client";
};

caf::behavior engine_client(caf::stateful_actor<engine_client_state>* self, tokenizer_actor front) {
  self->state.front = std::move(front);
  self->monitor(self->state.front);
  self->set_down_handler([self](caf::down_msg& dm) {
    self->state.waits.peer_down(dm.source, "the engine's front door stopped (" +
                                             self->system().render(dm.reason) +
                                             "); the engine cannot serve until it is restarted");
  });
  return {
    [self](engine_call& call) {
      guarded([&] { call.send(self, self->state.waits, self->state.front); },
              [](const std::string& what) {
                std::fprintf(stderr, "rlserve: sending an engine call failed: %s\n", what.c_str());
              });
    },
  };
}

// Sends `args` to the front door through the client and calls `done(reply, true)` with the
// answer, or `done(error, false)` when the front door does not answer.
template <class Out, class... Args>
void ask_front(const caf::actor& client, std::function<void(Out, bool)> done, Args... args) {
  auto shared_args = std::make_shared<std::tuple<Args...>>(std::move(args)...);
  caf::anon_send(client, engine_call{[done = std::move(done), shared_args](
                                       caf::event_based_actor* self, pending_requests& waits,
                                       const tokenizer_actor& front) {
    std::apply(
      [&](auto&... a) {
        waits.request_of<Out>(
          self, front, [done](Out& out) { done(std::move(out), true); },
          [done](const std::string& why) {
            done(failed<Out>("the engine did not answer: " + why), false);
          },
          std::move(a)...);
      },
      *shared_args);
  }});
}

// The blocking form: the reply, or the error that stands for it.
template <class Out, class... Args>
Out ask_front_and_wait(const caf::actor& client, Args... args) {
  auto result = std::make_shared<std::promise<Out>>();
  auto fut = result->get_future();
  ask_front<Out>(client, [result](Out out, bool) { result->set_value(std::move(out)); },
                 std::move(args)...);
  return fut.get();
}

} // namespace

struct Engine::impl {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  fs::path model_path;
  std::vector<runner_actor> runners;
  RunnerManifest target_manifest;
  std::optional<RunnerManifest> draft_manifest;
  weight_updater_actor updater;
  scheduler_actor scheduler;
  std::shared_ptr<profiler> profile = std::make_shared<profiler>();
  tokenizer_actor front;
  caf::actor client; // engine_client: every call goes through it
  std::shared_ptr<const model::bpe_tokenizer> tokenizer;
};

Engine::Engine(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

Engine::~Engine() {
  if (!impl_ || !impl_->sys)
    return;
  auto exit_all = [&](auto& handle) {
    if (handle)
      caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  };
  exit_all(impl_->client);
  exit_all(impl_->front);
  exit_all(impl_->scheduler);
  exit_all(impl_->updater);
  for (auto& r : impl_->runners)
    exit_all(r);
  // Drop our handles: a detached actor's thread ends only when its last reference is gone, and
  // the actor system's destructor waits for those threads.
  impl_->client = nullptr;
  impl_->front = nullptr;
  impl_->scheduler = nullptr;
  impl_->updater = nullptr;
  impl_->runners.clear();
  impl_->sys.reset(); // waits for every actor, detached runners included
}

// "auto" -> the first CUDA device when there is one, else the CPU (-1); "cpu" -> -1;
// "cuda" / "cuda:N" -> N, failing when this build or machine has no such device.
static expected<int> resolve_device(const std::string& device) {
  if (device == "cpu")
    return -1;
  if (device == "auto" || device.empty())
    return model::gpu_available() ? 0 : -1;
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int n = 0;
    if (device.size() > 5) {
      try {
        std::size_t used = 0;
        n = std::stoi(device.substr(5), &used);
        if (used != device.size() - 5 || n < 0)
          throw std::invalid_argument(device);
      } catch (...) {
        return fail("device '" + device + "': expected cuda:N with N a device number");
      }
    }
    if (!model::gpu_available())
      return fail("device '" + device + "': no CUDA device is visible, or this build has no CUDA "
                  "support; use --device cpu");
    return n;
  }
  return fail("device '" + device + "': expected auto, cpu, cuda or cuda:N");
}

// The weight transports every runner takes (what a selector of "all" can use).
static std::vector<std::string> weight_transports(const std::vector<runner_handle>& runners) {
  std::vector<std::string> out{"inline", "disk"};
  auto all = [&](bool RunnerCapabilities::*can) {
    return std::all_of(runners.begin(), runners.end(),
                       [&](const runner_handle& r) { return r.manifest.capabilities.*can; });
  };
  if (all(&RunnerCapabilities::device_tensors))
    out.push_back("cuda_ipc");
  if (all(&RunnerCapabilities::weight_update_groups))
    out.push_back("nccl");
  return out;
}

expected<std::unique_ptr<Engine>> Engine::start(engine_config config) {
  auto device = resolve_device(config.device);
  if (!device)
    return std::move(device).take_failure();
  auto path = config.model_path;
  if (path.empty()) {
    auto builtin = ensure_builtin_model(*device >= 0);
    if (!builtin)
      return std::move(builtin).take_failure();
    path = *builtin;
  }
  auto options = load_options(config);
  if (!options)
    return std::move(options).take_failure();
  // A GPU runner's host side keeps only the checkpoint's own bytes (validation, staging,
  // checksums, get_weights_by_name, uploads); the fp32 compute copies are for CPU forwards and
  // would quadruple the host memory of a BF16 model (about 120 GB more for Qwen3-30B-A3B).
  std::optional<loaded_model> target, draft;
  auto load_models = [&](bool compute_copies) -> status {
    options->compute_copies = compute_copies;
    model::qwen3_load_options draft_options; // the draft is never quantized at load
    draft_options.compute_copies = compute_copies;
    auto t = load(path, "target", *options);
    if (!t)
      return std::move(t).take_failure();
    target = std::move(*t);
    if (config.draft_model_path.empty())
      return {};
    auto d = load(config.draft_model_path, "draft", draft_options);
    if (!d)
      return std::move(d).take_failure();
    if (d->model->config().vocab_size != target->model->config().vocab_size)
      return fail("draft model: vocabulary size " + std::to_string(d->model->config().vocab_size) +
                  " differs from the target's " +
                  std::to_string(target->model->config().vocab_size));
    draft = std::move(*d);
    return {};
  };
  if (auto s = load_models(*device < 0); !s)
    return std::move(s).take_failure();

  // Every check of the configuration before anything is spawned.
  if (config.kv_block_size < 1 || config.kv_cache_tokens < config.kv_block_size)
    return fail("kv_cache_tokens (" + std::to_string(config.kv_cache_tokens) +
                ") must hold at least one block of kv_block_size (" +
                std::to_string(config.kv_block_size) + ") tokens");
  if (config.max_running_requests < 1 || config.max_batch_tokens < 1)
    return fail("max_running_requests and max_batch_tokens must be at least 1");
  if (config.stream_interval < 1)
    return fail("stream_interval must be at least 1 (output tokens per streamed chunk), got " +
                std::to_string(config.stream_interval));
  auto kv_blocks = config.kv_cache_tokens / config.kv_block_size;
  // GPU runners: the device copy of each model, made here so a device problem is an error of
  // start. A batch holds at most max_batch_tokens of prefill and decodes, plus the draft
  // tokens of every running request when the target verifies them.
  std::shared_ptr<model::qwen3_gpu_model> target_gpu, draft_gpu;
  std::shared_ptr<model::gpu_draft_distributions> draft_distributions;
  if (*device >= 0) {
    model::gpu_options g;
    g.device = *device;
    g.kv_block_size = config.kv_block_size;
    g.kv_num_blocks = kv_blocks;
    g.max_sequences = config.max_running_requests;
    g.max_batch_tokens = config.max_batch_tokens +
                         int64_t{config.max_running_requests} *
                           (1 + std::max(0, config.speculative_num_draft_tokens));
    g.cuda_graphs = config.cuda_graphs;
    g.batch_invariant = config.enable_deterministic_inference;
    g.staging_budget_bytes = config.gpu_staging_budget_bytes;
    auto t = model::qwen3_gpu_model::create(*target->model, g);
    expected<std::unique_ptr<model::qwen3_gpu_model>> d = std::unique_ptr<model::qwen3_gpu_model>{};
    if (t && draft)
      d = model::qwen3_gpu_model::create(*draft->model, g);
    // A GPU draft keeps the distributions it draws proposals from on the device, for the target.
    expected<std::shared_ptr<model::gpu_draft_distributions>> kept = std::shared_ptr<model::gpu_draft_distributions>{};
    if (t && d && *d && config.speculative_num_draft_tokens > 0)
      kept = model::gpu_draft_distributions::create(*device, target->model->config().vocab_size,
                                                    config.speculative_num_draft_tokens);
    if (t && d && kept) {
      target_gpu = std::move(*t);
      draft_gpu = std::move(*d);
      draft_distributions = std::move(*kept);
    } else if (!kept) {
      return fail("draft model on the GPU: " + kept.error());
    } else {
      auto why = !t ? "target model on the GPU: " + t.error() : "draft model on the GPU: " + d.error();
      // An explicit cuda device must run there; "auto" serves on the CPU instead, and says why.
      if (config.device != "auto" && !config.device.empty())
        return fail(why);
      std::fprintf(stderr, "rlserve: %s; serving on the CPU (pass --device cuda to make this an "
                           "error)\n", why.c_str());
      // The models were loaded for a GPU runner (no compute copies): load them again for the CPU.
      if (auto s = load_models(true); !s)
        return std::move(s).take_failure();
    }
  }

  auto p = std::make_unique<impl>();
  p->model_path = path;
  p->cfg.add_message_types<caf::id_block::rlserve>();
  if (config.worker_threads > 0)
    p->cfg.set("scheduler.max-threads", config.worker_threads);
  p->sys = std::make_unique<caf::actor_system>(p->cfg);
  auto& sys = *p->sys;

  auto spawn = [&](const char* role, const fs::path& dir, std::shared_ptr<model::qwen3_model> m,
                   std::shared_ptr<model::qwen3_gpu_model> gpu) {
    runner_options o;
    o.role = role;
    o.model_path = dir;
    o.kv_block_size = config.kv_block_size;
    o.kv_num_blocks = kv_blocks;
    o.allow_non_finite_weights = config.allow_non_finite_weights;
    o.profile = p->profile;
    o.weights_cpu_backup = config.enable_weights_cpu_backup;
    if (gpu)
      o.draft_distributions = draft_distributions;
    return gpu ? spawn_gpu_runner(sys, std::move(o), std::move(m), std::move(gpu))
               : spawn_cpu_runner(sys, std::move(o), std::move(m));
  };
  p->runners.push_back(spawn("target", path, target->model, std::move(target_gpu)));
  if (draft)
    p->runners.push_back(spawn("draft", draft->path, draft->model, std::move(draft_gpu)));

  std::vector<runner_handle> handles;
  caf::scoped_actor self{sys};
  for (auto& r : p->runners) {
    std::optional<std::string> err;
    self->request(r, caf::infinite, manifest_atom_v)
      .receive([&](RunnerManifest& m) { handles.push_back({r, std::move(m)}); },
               [&](caf::error& e) { err = sys.render(e); });
    if (err)
      return fail("a runner did not start: " + *err);
  }
  p->target_manifest = handles.front().manifest;
  if (draft)
    p->draft_manifest = handles.back().manifest;
  p->updater = spawn_weight_updater(sys, handles, config.initial_weight_version,
                                    config.allow_non_finite_weights);
  if (config.speculative_num_draft_tokens < 0)
    return fail("speculative_num_draft_tokens must be 0 (off) or more, got " +
                std::to_string(config.speculative_num_draft_tokens));
  scheduler_options scheduling;
  scheduling.max_running_requests = config.max_running_requests;
  scheduling.max_batch_tokens = config.max_batch_tokens;
  scheduling.speculative_num_draft_tokens = config.speculative_num_draft_tokens;
  scheduling.prefix_cache = !config.disable_radix_cache;
  scheduling.stream_interval = config.stream_interval;
  scheduling.profile = p->profile;
  p->scheduler = spawn_scheduler(sys, scheduling,
                                 p->runners.front(), draft ? p->runners.back() : runner_actor{},
                                 p->target_manifest, p->updater, config.initial_weight_version,
                                 target->tokenizer);
  front_door_info info;
  info.model_path = path.string();
  info.draft_model_path = draft ? draft->path.string() : "";
  info.device = p->target_manifest.device; // the target's device, as its runner states it
  info.weight_transports = weight_transports(handles);
  const auto& caps = p->target_manifest.capabilities;
  info.int4_modules = caps.int4_modules;
  info.int4_update_recipe = caps.int4_update_recipe;
  info.int4_quantized_on = caps.int4_quantized_on;
  info.architecture = p->target_manifest.architecture;
  info.vocab_size = p->target_manifest.vocab_size;
  info.max_context_length = p->target_manifest.max_context_length;
  p->tokenizer = target->tokenizer;
  p->front = spawn_tokenizer(sys, p->scheduler, target->tokenizer, std::move(info));
  p->client = sys.spawn(engine_client, p->front);
  return std::unique_ptr<Engine>(new Engine(std::move(p)));
}

template <class Out, class In>
Out Engine::call(In req) {
  return ask_front_and_wait<Out>(impl_->client, std::move(req));
}

GenerateReqOutput Engine::generate(GenerateReqInput req) {
  return ask_front_and_wait<GenerateReqOutput>(impl_->client, std::move(req), caf::actor{});
}

GenerateReqOutput Engine::generate(GenerateReqInput req, chunk_callback on_chunk) {
  return generate_async(std::move(req), std::move(on_chunk)).get();
}

std::future<GenerateReqOutput> Engine::generate_async(GenerateReqInput req, chunk_callback on_chunk) {
  auto pending = std::make_shared<pending_generate>();
  auto fut = pending->result.get_future();
  auto& sys = *impl_->sys;
  caf::actor sink;
  if (on_chunk) {
    req.stream = true;
    pending->sink_finished = false;
    sink = sys.spawn(chunk_sink, std::move(on_chunk), pending);
  }
  ask_front<GenerateReqOutput>(
    impl_->client,
    [sink, pending](GenerateReqOutput out, bool answered) {
      if (!answered && sink) { // no last chunk will come
        caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
        pending->on_sink_finished();
      }
      pending->on_reply(std::move(out));
    },
    std::move(req), sink);
  return fut;
}

#define RLSERVE_ENGINE_METHOD(route, method, In, Out, auth, role)                                \
  Out Engine::method(In req) { return call<Out>(std::move(req)); }
RLSERVE_CONTROL_OPERATIONS(RLSERVE_ENGINE_METHOD, RLSERVE_OP_NOTHING)
RLSERVE_WEIGHT_OPERATIONS(RLSERVE_ENGINE_METHOD, RLSERVE_OP_NOTHING)
#undef RLSERVE_ENGINE_METHOD

status Engine::kill_actor_for_test(std::string_view kind) {
  auto kill = [](const auto& handle) {
    caf::anon_send_exit(handle, caf::exit_reason::kill);
  };
  if (kind == "tokenizer")
    kill(impl_->front);
  else if (kind == "scheduler")
    kill(impl_->scheduler);
  else if (kind == "weight_updater")
    kill(impl_->updater);
  else if (kind == "runner" && !impl_->runners.empty())
    kill(impl_->runners.front());
  else if (kind == "draft_runner" && impl_->runners.size() > 1)
    kill(impl_->runners.back());
  else
    return fail("kill_actor_for_test: no actor kind \"" + std::string(kind) +
                "\" (tokenizer, scheduler, weight_updater, runner, draft_runner with a draft "
                "model)");
  return {};
}

caf::actor_system& Engine::system() { return *impl_->sys; }
tokenizer_actor Engine::front_door() const { return impl_->front; }
const RunnerManifest& Engine::target_manifest() const { return impl_->target_manifest; }
const RunnerManifest* Engine::draft_manifest() const {
  return impl_->draft_manifest ? &*impl_->draft_manifest : nullptr;
}
const fs::path& Engine::model_path() const { return impl_->model_path; }

std::shared_ptr<const model::bpe_tokenizer> Engine::tokenizer() const { return impl_->tokenizer; }

std::shared_ptr<profiler> Engine::profile() const { return impl_->profile; }

} // namespace rlserve
