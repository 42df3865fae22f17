// `rlserve generate`: one or more completions from a model, through the whole actor pipeline,
// for quick checks by hand (--logprobs shows per-token logprobs) and for scripts (--json prints
// one JSON object per request, in the order given).
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "actors/engine.hpp"
#include "apps/command.hpp"
#include <nlohmann/json.hpp>

#include "messages/json_codec.hpp"

namespace rlserve::apps {

namespace {

struct generate_options {
  std::string device = "auto";
  std::filesystem::path model;
  std::filesystem::path draft_model;
  int32_t draft_tokens = 4;
  std::string quantize;
  int32_t group_size = 128;
  std::vector<std::string> prompts;
  std::vector<std::string> input_ids;
  SamplingParams sampling;
  std::optional<uint64_t> seed;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool json = false;
  bool stream = false;
};

expected<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX)
        throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return fail("--input-ids: \"" + item + "\" is not a token id (expected 1,2,3)");
    }
  }
  if (ids.empty())
    return fail("--input-ids: no token ids given");
  return ids;
}

void print_human(const GenerateReqOutput& out, const generate_options& o, bool streamed) {
  if (!out.success) {
    std::printf("error: %s\n", out.message.c_str());
    return;
  }
  if (!streamed)
    std::printf("%s", out.text.c_str());
  std::printf("\n");
  if (o.logprobs) {
    std::printf("  %-6s %-10s %s\n", "pos", "token id", "logprob");
    for (std::size_t i = 0; i < out.output_ids.size(); ++i)
      std::printf("  %-6zu %-10d %.5f\n", i, out.output_ids[i],
                  i < out.output_token_logprobs.size() ? out.output_token_logprobs[i] : 0.0f);
  }
  std::string reason = out.finish_reason ? out.finish_reason->type : "?";
  if (out.finish_reason && out.finish_reason->matched_token)
    reason += " (token " + std::to_string(*out.finish_reason->matched_token) + ")";
  if (out.finish_reason && out.finish_reason->matched_str)
    reason += " (\"" + *out.finish_reason->matched_str + "\")";
  std::printf("[%s, %d prompt + %d generated tokens, weight version %s, seed %llu]\n",
              reason.c_str(), out.prompt_tokens, out.completion_tokens, out.weight_version.c_str(),
              static_cast<unsigned long long>(out.sampling_seed));
}

void run(const generate_options& o) {
  std::vector<GenerateReqInput> requests;
  for (const auto& p : o.prompts) {
    GenerateReqInput r;
    r.text = p;
    requests.push_back(std::move(r));
  }
  for (const auto& ids : o.input_ids) {
    auto parsed = parse_ids(ids);
    if (!parsed)
      throw command_failed(parsed.error());
    GenerateReqInput r;
    r.input_ids = std::move(*parsed);
    requests.push_back(std::move(r));
  }
  if (requests.empty())
    throw command_failed("give --prompt TEXT or --input-ids 1,2,3 (either may repeat)");
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto& r = requests[i];
    r.sampling_params = o.sampling;
    if (o.seed)
      r.sampling_params.sampling_seed = *o.seed + i;
    r.return_logprob = o.logprobs || o.top_logprobs > 0 || o.json;
    r.top_logprobs_num = o.top_logprobs;
  }
  engine_config cfg;
  cfg.model_path = o.model;
  cfg.draft_model_path = o.draft_model;
  cfg.speculative_num_draft_tokens = o.draft_tokens;
  cfg.device = o.device;
  cfg.quantize = o.quantize;
  cfg.quantize_group_size = o.group_size;
  auto engine = Engine::start(cfg);
  if (!engine)
    throw command_failed(engine.error());
  // Streaming prints the first request as it arrives; the rest run concurrently and print in
  // order afterwards.
  std::vector<std::future<GenerateReqOutput>> futures;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    chunk_callback cb;
    if (o.stream && !o.json && i == 0)
      cb = [](const GenerateReqOutput& c) {
        std::fwrite(c.text.data(), 1, c.text.size(), stdout);
        std::fflush(stdout);
      };
    futures.push_back((*engine)->generate_async(requests[i], cb));
  }
  bool all_ok = true;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    auto out = futures[i].get();
    all_ok = all_ok && out.success;
    if (o.json) {
      std::cout << to_json(out).dump() << "\n";
    } else {
      if (futures.size() > 1)
        std::printf("--- request %zu ---\n", i + 1);
      print_human(out, o, o.stream && i == 0);
    }
  }
  std::fflush(stdout);
  if (!all_ok)
    throw command_failed("some requests failed (see above)");
}

void add_generate(CLI::App& app) {
  auto o = std::make_shared<generate_options>();
  auto* cmd = app.add_subcommand("generate", "Generate completions through the engine");
  cmd->add_option("--device", o->device, "Where to run: auto (the GPU when one is visible), cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--model", o->model, "Model directory (default: the built-in tiny model)");
  cmd->add_option("--draft-model", o->draft_model,
                  "Draft model directory: speculative decoding (same vocabulary as the target)");
  cmd->add_option("--speculative-num-draft-tokens", o->draft_tokens,
                  "Tokens the draft proposes per step (0: do not speculate)")
    ->capture_default_str()
    ->check(CLI::NonNegativeNumber);
  add_quantize_options(*cmd, o->quantize, o->group_size);
  cmd->add_option("--prompt", o->prompts, "Prompt text (repeat for several requests)");
  cmd->add_option("--input-ids", o->input_ids, "Prompt token ids, comma-separated (repeatable)");
  cmd->add_option("--max-new-tokens", o->sampling.max_new_tokens, "Tokens to generate at most")
    ->capture_default_str();
  cmd->add_option("--temperature", o->sampling.temperature, "0 means greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "-1: whole vocabulary")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Nucleus sampling mass")->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "Drop tokens below min_p x max prob")
    ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed (request i gets seed + i)");
  cmd->add_option("--stop", o->sampling.stop, "Stop string (repeatable)");
  cmd->add_option("--stop-token-id", o->sampling.stop_token_ids, "Stop token id (repeatable)");
  cmd->add_flag("--ignore-eos", o->sampling.ignore_eos, "Keep going after EOS");
  cmd->add_flag("--logprobs", o->logprobs, "Print the logprob of every generated token");
  cmd->add_option("--top-logprobs", o->top_logprobs, "Also return the N most likely tokens");
  cmd->add_flag("--json", o->json, "One JSON object per request (SGLang's response shape)");
  cmd->add_flag("--stream", o->stream, "Print the first request's text as it is generated");
  cmd->callback([o] { run(*o); });
}

const command_registrar registrar{20, add_generate};

} // namespace

} // namespace rlserve::apps
