// `rlserve serve`: the engine behind the network front (docs/protocol.md): websocket and HTTP on
// one port until SIGINT or SIGTERM. Prints one line "listening on HOST:PORT" to stdout when
// ready (with --port 0 the port the system chose), so scripts and tests can wait for it.
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "actors/engine.hpp"
#include "apps/command.hpp"
#include "net/log.hpp"
#include "net/server.hpp"

namespace rlserve::apps {

namespace {

struct serve_options {
  engine_config engine;
  net::server_options server;
  double request_timeout_s = 30;
  double idle_timeout_s = 300;
  int64_t gpu_staging_budget_mib = 0;
  double update_session_idle_timeout_s = 600;
  std::string api_key_file;
  std::string admin_api_key_file;
  std::string log_level;
  // SGLang launch-line options (python -m sglang.launch_server ...), mapped in run().
  bool disable_cuda_graph = false;
  int tp_size = 1;
  int base_gpu_id = -1;
  bool trust_remote_code = false;
};

// A key kept in a file, so it does not show in /proc/PID/cmdline or `ps`: the file's text with
// surrounding whitespace (a trailing newline) removed.
std::string read_key_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw command_failed(std::string(flag) + ": cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  std::string key = text.str();
  const char* space = " \t\r\n";
  key.erase(0, key.find_first_not_of(space) == std::string::npos ? key.size() : key.find_first_not_of(space));
  key.erase(key.find_last_not_of(space) + 1);
  if (key.empty())
    throw command_failed(std::string(flag) + ": " + path + " holds no key");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    net::log_warn(std::string(flag) + ": " + path +
                  " can be read by other users of this machine (chmod 600 it)");
  return key;
}

void run(serve_options o) {
  // Blocked in every thread (the engine's and the server's inherit this mask), taken by sigwait
  // below: a signal never interrupts an actor or an I/O thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (!o.log_level.empty()) {
    const std::pair<const char*, net::log_level> levels[] = {
      {"debug", net::log_level::debug}, {"info", net::log_level::info}, {"warn", net::log_level::warn},
      {"error", net::log_level::error}, {"off", net::log_level::off}};
    bool known = false;
    for (const auto& [name, level] : levels)
      if (o.log_level == name) {
        net::set_log_level(level);
        known = true;
      }
    if (!known)
      throw command_failed("--log-level: expected debug, info, warn, error or off");
  }
  if (!o.api_key_file.empty()) {
    if (!o.server.keys.api_key.empty())
      throw command_failed("--api-key and --api-key-file (or RLSERVE_API_KEY) both give the key; give one");
    o.server.keys.api_key = read_key_file(o.api_key_file, "--api-key-file");
  }
  if (!o.admin_api_key_file.empty()) {
    if (!o.server.keys.admin_api_key.empty())
      throw command_failed("--admin-api-key and --admin-api-key-file (or RLSERVE_ADMIN_API_KEY) both "
                           "give the key; give one");
    o.server.keys.admin_api_key = read_key_file(o.admin_api_key_file, "--admin-api-key-file");
  }
  o.server.update_session_idle_timeout =
    std::chrono::milliseconds(static_cast<int64_t>(o.update_session_idle_timeout_s * 1000));
  o.server.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.request_timeout_s * 1000));
  o.server.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.idle_timeout_s * 1000));

  // SGLang's launch line, where it means something here.
  if (o.tp_size != 1)
    throw command_failed("--tp-size " + std::to_string(o.tp_size) +
                         ": rlserve serves a model on one GPU per process; tensor parallelism is not "
                         "implemented (run one server per GPU)");
  if (o.base_gpu_id >= 0) {
    if (o.engine.device != "auto" && o.engine.device != "cuda:" + std::to_string(o.base_gpu_id))
      throw command_failed("--base-gpu-id " + std::to_string(o.base_gpu_id) + " and --device " + o.engine.device +
                           " name different devices; give one");
    o.engine.device = "cuda:" + std::to_string(o.base_gpu_id);
  }
  if (o.disable_cuda_graph)
    o.engine.cuda_graphs = false;
  if (o.gpu_staging_budget_mib < 0)
    throw command_failed("--gpu-staging-budget-mib: expected 0 or more");
  o.engine.gpu_staging_budget_bytes = static_cast<std::size_t>(o.gpu_staging_budget_mib) << 20;
  o.server.enable_deterministic_inference = o.engine.enable_deterministic_inference;
  // vLLM's level-1 sleep keeps the weights in host memory: rlserve's release does so only with
  // the host copy. (Level 2, which vLLM discards, then keeps them too: docs/protocol.md.)
  if (o.server.enable_sleep_mode)
    o.engine.enable_weights_cpu_backup = true;
  if (o.engine.initial_weight_version.empty())
    throw command_failed("--weight-version: empty; name the loaded weights (e.g. default)");
  auto engine = Engine::start(o.engine);
  if (!engine)
    throw command_failed(engine.error());
  auto srv = net::server::start(**engine, o.server);
  if (!srv)
    throw command_failed(srv.error());
  auto info = (*engine)->get_server_info();
  std::printf("rlserve serve: listening on %s (model %s, weight version %s, %zu I/O threads)\n",
              (*srv)->address().c_str(), info.model_path.c_str(), info.weight_version.c_str(),
              o.server.io_threads);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  net::log_info(sig == SIGINT ? "interrupted; stopping" : "terminated; stopping");
  (*srv)->stop();
  srv->reset();
  engine->reset();
}

void add_serve(CLI::App& app) {
  auto o = std::make_shared<serve_options>();
  auto* cmd = app.add_subcommand("serve", "Serve the engine over websocket and HTTP (docs/protocol.md)");
  // Where SGLang's launch line has a name for the same thing, it is accepted too (--model-path,
  // --speculative-draft-model-path, --max-total-tokens, --chunked-prefill-size, ...), so a
  // trainer's launch command needs only its program name changed.
  cmd->add_option("--model,--model-path", o->engine.model_path,
                  "Model directory (default: the built-in tiny model)");
  cmd->add_option("--draft-model,--speculative-draft-model-path", o->engine.draft_model_path,
                  "Draft model directory (speculative decoding)");
  cmd->add_option("--speculative-num-draft-tokens", o->engine.speculative_num_draft_tokens,
                  "Draft tokens proposed and verified per decode step with a draft model (0: the draft "
                  "is loaded and updated but not used)")
    ->check(CLI::NonNegativeNumber)
    ->capture_default_str();
  cmd->add_option("--device", o->engine.device, "Where to run: auto (the GPU when one is visible), cpu, cuda or cuda:N")->capture_default_str();
  add_quantize_options(*cmd, o->engine.quantize, o->engine.quantize_group_size);
  cmd->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port (0: any free port; the line printed says which)")
    ->capture_default_str();
  cmd->add_option("--api-key", o->server.keys.api_key,
                  "Key for generation and server state (Authorization: Bearer <key>); without "
                  "--admin-api-key it opens every route, as SGLang's")
    ->envname("RLSERVE_API_KEY");
  cmd->add_option("--admin-api-key", o->server.keys.admin_api_key,
                  "Key for every route that changes or reads weights, pauses, resumes, flushes or aborts")
    ->envname("RLSERVE_ADMIN_API_KEY");
  cmd->add_option("--api-key-file", o->api_key_file,
                  "File holding the --api-key (keeps it out of the process list)");
  cmd->add_option("--admin-api-key-file", o->admin_api_key_file,
                  "File holding the --admin-api-key (keeps it out of the process list)");
  cmd->add_option("--allowed-origin", o->server.allowed_origins,
                  "A browser Origin (scheme://host[:port]) allowed besides the server's own; repeatable");
  cmd->add_option("--io-threads", o->server.io_threads, "Asio threads (sockets only; actors do the work)")
    ->capture_default_str();
  cmd->add_option("--max-message-bytes", o->server.max_message_bytes,
                  "Largest websocket message or HTTP body")
    ->capture_default_str();
  cmd->add_option("--max-session-tensor-bytes", o->server.max_session_tensor_bytes,
                  "Tensor bytes accepted per weight-update session")
    ->capture_default_str();
  cmd->add_option("--request-timeout", o->request_timeout_s,
                  "Seconds to read an HTTP request or finish a websocket handshake")
    ->capture_default_str();
  cmd->add_option("--idle-timeout", o->idle_timeout_s,
                  "Seconds a websocket peer may stay silent (pings are sent at half of it; 0: never)")
    ->capture_default_str();
  cmd->add_option("--update-session-idle-timeout", o->update_session_idle_timeout_s,
                  "Seconds a weight-update session begun over HTTP may wait for its next request "
                  "before it is aborted (the old weights keep serving; 0: never)")
    ->capture_default_str();
  cmd->add_flag("--allow-non-finite-weights", o->engine.allow_non_finite_weights,
                "Accept NaN and infinity in weight updates (refused by default)");
  cmd->add_flag("--enable-weights-cpu-backup", o->engine.enable_weights_cpu_backup,
                "release_memory_occupation keeps a host copy of the weights that resume restores "
                "(without it the weights are undefined after resume until an update)");
  cmd->add_option("--max-running-requests", o->engine.max_running_requests, "Requests in one batch")
    ->capture_default_str();
  cmd->add_option("--kv-cache-tokens,--max-total-tokens", o->engine.kv_cache_tokens, "Tokens the KV pool holds")
    ->capture_default_str();
  cmd->add_option("--max-batch-tokens,--chunked-prefill-size", o->engine.max_batch_tokens,
                  "Tokens one forward batch may run; longer prompts are prefilled in chunks of this")
    ->check(CLI::PositiveNumber)
    ->capture_default_str();
  cmd->add_flag("--disable-cuda-graph", o->disable_cuda_graph,
                "GPU runners: run every decode step eagerly (no CUDA graphs)");
  cmd->add_option("--tp-size,--tensor-parallel-size", o->tp_size,
                  "Accepted for SGLang launch lines: only 1 (one GPU per process)")
    ->capture_default_str();
  cmd->add_option("--base-gpu-id", o->base_gpu_id, "The GPU to run on (as --device cuda:N)");
  cmd->add_option("--served-model-name", o->server.served_model_name,
                  "The model's name in OpenAI replies, /v1/models and /server_info (default: its path)");
  cmd->add_option("--tool-call-parser", o->server.tool_call_parser,
                  "Split tool calls out of chat replies (message.tool_calls), SGLang's names: "
                  "qwen25 (or qwen), qwen3_coder, glm45 (or glm)");
  cmd->add_option("--reasoning-parser", o->server.reasoning_parser,
                  "Split <think> reasoning out of chat replies (message.reasoning_content), SGLang's "
                  "names: qwen3, glm45, qwen3-thinking, deepseek-r1");
  cmd->add_flag("--trust-remote-code", o->trust_remote_code,
                "Accepted for SGLang launch lines; rlserve runs no code from a checkpoint");
  cmd->add_flag("--enable-sleep-mode", o->server.enable_sleep_mode,
                "vLLM's /sleep and /wake_up (release and resume memory by tag); implies "
                "--enable-weights-cpu-backup, so a level-1 sleep keeps the weights in host memory");
  cmd->add_option("--weight-version", o->engine.initial_weight_version,
                  "The version label of the weights loaded at start (SGLang's and vLLM's routes "
                  "report it; vLLM starts at \"default\")")
    ->capture_default_str();
  cmd->add_flag("--enable-memory-saver", o->server.enable_memory_saver,
                "Report SGLang's enable_memory_saver as true in /server_info (trainers launched "
                "with memory offload check it); release/resume_memory_occupation work either way");
  cmd->add_flag("--enable-return-routed-experts", o->server.enable_return_routed_experts,
                "Report SGLang's enable_return_routed_experts as true in /server_info (trainers "
                "with routing replay check it); return_routed_experts works either way");
  cmd->add_flag("--enable-deterministic-inference", o->engine.enable_deterministic_inference,
                "Batch-invariant forward: a request's tokens and logprobs do not depend on the "
                "requests batched with it (slower on the GPU; the CPU runner is so already)");
  cmd->add_flag("--disable-radix-cache", o->engine.disable_radix_cache,
                "Turn the prefix cache off: every request prefills its whole prompt");
  cmd->add_option("--stream-interval", o->engine.stream_interval,
                  "Output tokens per streamed chunk for requests that do not set "
                  "sampling_params.stream_interval")
    ->check(CLI::PositiveNumber)
    ->capture_default_str();
  cmd->add_option("--gpu-staging-budget-mib", o->gpu_staging_budget_mib,
                  "GPU runners: device MiB one update session may stage before its commit (0: one "
                  "full copy of the weights)");
  cmd->add_flag("--resume-on-disconnect", o->server.resume_on_disconnect,
                "Continue generation when the websocket client that paused it disconnects");
  cmd->add_option("--log-level", o->log_level, "debug, info, warn, error or off (default: info)");
  cmd->callback([o] { run(*o); });
}

const command_registrar registrar{40, add_serve};

} // namespace

} // namespace rlserve::apps
