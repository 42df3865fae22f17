// scheduler_bench: what the scheduler costs per decode step, apart from the model (results:
// docs/performance.md). The scheduler runs as in the engine, over a runner that answers every
// forward batch at once with a fixed token (no model), so the time between batches is the
// scheduler's planning, block bookkeeping, result handling and chunk building, plus the message
// hops between the actors. Batches of 64 and 256 requests decode together; streaming on and off.
//
//   build/benchmarks/scheduler_bench [--steps N] [--stream-interval N]
//
// Prints, per case: the CPU time of the scheduler's own handlers per step (what the goal in
// docs/performance.md is about: planning, block bookkeeping, results, chunks — measured by the
// scheduler with the thread CPU clock and reported in get_server_info), wall-clock µs per step
// (including the two thread hops to the runner and back), process CPU per step (all threads,
// including CAF workers polling for work), and the messages per step: forward request + reply,
// the scheduler's step self-message, and the TokenChunks messages its sinks receive.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "actors/scheduler_actor.hpp"
#include "caf/all.hpp"

using namespace rlserve;

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

using clock_type = std::chrono::steady_clock;

struct step_clock {
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> chunk_messages{0};
  std::atomic<int64_t> finished{0};
  std::atomic<int64_t> runner_ns{0}; // time the runner spent building its answers
};

// A runner without a model: every position that samples answers token 7 with logprob -1.
runner_actor::behavior_type modelless_runner(runner_actor::pointer, RunnerManifest manifest,
                                             step_clock* clock) {
  return {
    [manifest](manifest_atom) { return manifest; },
    [clock](ForwardBatch& batch) {
      auto t0 = clock_type::now();
      ForwardBatchOutput out;
      out.step = batch.step;
      out.tokens.assign(batch.size(), 7);
      out.logprobs.assign(batch.size(), -1.0f);
      out.details.resize(batch.work.size());
      for (std::size_t i = 0; i < batch.work.size(); ++i)
        if (!batch.work[i].sample) {
          out.tokens[i] = -1;
          out.logprobs[i] = 0.0f;
        }
      clock->steps.fetch_add(1);
      clock->runner_ns.fetch_add((clock_type::now() - t0).count());
      return out;
    },
    [](ReleaseSequences&) {},
    [](restore_atom) { return RunnerReply{}; },
    [](StageTensors&) { return RunnerReply{}; },
    [](StageDeviceTensors&) { return RunnerReply{}; },
    [](commit_atom) { return RunnerReply{}; },
    [](discard_atom) { return RunnerReply{}; },
    [](CheckWeightsReqInput&) { return RunnerCheckOutput{}; },
    [](GetWeightsByNameReqInput&) { return GetWeightsByNameReqOutput{}; },
    [](ReleaseMemoryOccupationReqInput&) { return RunnerReply{}; },
    [](ResumeMemoryOccupationReqInput&) { return RunnerReply{}; },
  };
}

caf::behavior chunk_counter(caf::event_based_actor*, step_clock* clock) {
  return {
    [clock](TokenChunks& chunks) {
      clock->chunk_messages.fetch_add(1);
      for (auto& c : chunks.chunks)
        if (c.finished)
          clock->finished.fetch_add(1);
    },
  };
}

struct result {
  double scheduler_us, wall_us, cpu_us, runner_us, messages;
};

GetServerInfoReqOutput server_info(caf::actor_system& sys, const scheduler_actor& scheduler) {
  caf::scoped_actor self{sys};
  GetServerInfoReqOutput out;
  self->request(scheduler, caf::infinite, GetServerInfoReqInput{})
    .receive([&](GetServerInfoReqOutput& o) { out = std::move(o); }, [](caf::error&) {});
  return out;
}

// A wait of the benchmark that ends in 60 s at most: a scheduler that stops stepping or never
// finishes the aborted requests is a bug to see, not a hang. Says what the scheduler reports.
// `poll` 0 yields between looks instead of sleeping.
template <class Done>
void wait_or_fail(caf::actor_system& sys, const scheduler_actor& scheduler, const step_clock& clock,
                  const char* what, std::chrono::microseconds poll, Done done) {
  const auto deadline = clock_type::now() + std::chrono::seconds(60);
  while (!done()) {
    if (clock_type::now() > deadline) {
      auto info = server_info(sys, scheduler);
      std::fprintf(stderr,
                   "scheduler_bench: stuck %s: runner steps %lld, finished %lld, chunk messages %lld; the "
                   "scheduler says running %d, waiting %d, scheduler steps %llu, paused %d\n",
                   what, static_cast<long long>(clock.steps.load()), static_cast<long long>(clock.finished.load()),
                   static_cast<long long>(clock.chunk_messages.load()), info.running_requests,
                   info.waiting_requests, static_cast<unsigned long long>(info.scheduler_steps), int(info.paused));
      std::exit(2);
    }
    if (poll.count() == 0)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(poll);
  }
}

result run_case(caf::actor_system& sys, int batch, bool stream, int64_t steps, int32_t stream_interval) {
  step_clock clock;
  RunnerManifest manifest;
  manifest.role = "target";
  manifest.vocab_size = 512;
  manifest.max_context_length = 1 << 20;
  manifest.kv_block_size = 16;
  // Requests outlive the measurement whatever happens before it: the main thread, descheduled on a
  // small machine between the warm-up and the start of the measurement, once let 65 steps pass,
  // and requests of `steps + 64` new tokens ended before the measured steps did.
  const int64_t prompt = 16, max_new = 2 * steps + 256;
  manifest.kv_num_blocks = batch * ((prompt + max_new) / 16 + 2);
  auto runner = sys.spawn<caf::detached>(modelless_runner, manifest, &clock);
  scheduler_options options;
  options.max_running_requests = batch;
  options.max_batch_tokens = batch * prompt;
  options.stream_interval = stream_interval;
  // A real weight updater (it stays idle): the scheduler monitors the one it is given.
  auto updater = spawn_weight_updater(sys, {{runner, manifest}}, "0");
  auto scheduler = spawn_scheduler(sys, options, runner, runner_actor{}, manifest, updater, "0",
                                   nullptr);
  auto sink = sys.spawn(chunk_counter, &clock);
  for (int i = 0; i < batch; ++i) {
    TokenizedGenerateReqInput req;
    req.rid = "r" + std::to_string(i);
    req.input_ids.assign(prompt, 3);
    req.sampling_params.max_new_tokens = static_cast<int32_t>(max_new);
    req.sampling_params.ignore_eos = true;
    req.stream = stream;
    caf::anon_send(scheduler, std::move(req), sink);
  }
  // Warm up past admission and prefill, then measure `steps` decode steps.
  wait_or_fail(sys, scheduler, clock, "warming up", std::chrono::microseconds(0), [&] { return clock.steps >= 8; });
  auto info0 = server_info(sys, scheduler);
  auto s0 = clock.steps.load();
  auto m0 = clock.chunk_messages.load();
  auto r0 = clock.runner_ns.load();
  auto t0 = clock_type::now();
  auto c0 = cpu_seconds();
  wait_or_fail(sys, scheduler, clock, "decoding", std::chrono::microseconds(200), [&] {
    if (clock.finished > 0) {
      std::fprintf(stderr, "scheduler_bench: requests ended after %lld steps, before the %lld measured ones\n",
                   static_cast<long long>(clock.steps.load()), static_cast<long long>(steps));
      std::exit(2);
    }
    return clock.steps >= s0 + steps;
  });
  auto t1 = clock_type::now();
  auto c1 = cpu_seconds();
  auto info1 = server_info(sys, scheduler);
  auto n = double(clock.steps.load() - s0);
  result out;
  out.scheduler_us = (info1.scheduler_cpu_us - info0.scheduler_cpu_us) /
                     double(info1.scheduler_steps - info0.scheduler_steps);
  out.wall_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
  out.cpu_us = (c1 - c0) * 1e6 / n;
  out.runner_us = double(clock.runner_ns.load() - r0) / 1e3 / n;
  // forward request + reply + the step self-message, and the chunk messages to sinks.
  out.messages = 3.0 + double(clock.chunk_messages.load() - m0) / n;
  caf::anon_send(scheduler, AbortReq{"", true, "benchmark over"});
  wait_or_fail(sys, scheduler, clock, "finishing the aborted requests", std::chrono::milliseconds(1),
               [&] { return clock.finished >= batch; });
  caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(updater, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(runner, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
  return out;
}

} // namespace

int main(int argc, char** argv) {
  int64_t steps = 2000;
  int32_t stream_interval = 1; // output tokens per streamed chunk (scheduler_options::stream_interval)
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--steps") == 0)
      steps = std::stoll(argv[i + 1]);
    else if (std::strcmp(argv[i], "--stream-interval") == 0)
      stream_interval = std::max(1, std::stoi(argv[i + 1]));
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::rlserve>();
  caf::actor_system sys{cfg};
  std::printf("| batch | streaming | scheduler CPU µs / step | wall µs / step | process CPU µs / "
              "step | model-less runner µs / step | messages / step |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int batch : {64, 256})
    for (bool stream : {false, true}) {
      auto r = run_case(sys, batch, stream, steps, stream_interval);
      const std::string streaming = !stream ? "off" : stream_interval == 1 ? "on" : "every " + std::to_string(stream_interval);
      std::printf("| %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f |\n", batch, streaming.c_str(),
                  r.scheduler_us, r.wall_us, r.cpu_us, r.runner_us, r.messages);
      std::fflush(stdout);
    }
  return 0;
}
