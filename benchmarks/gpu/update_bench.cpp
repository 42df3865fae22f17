// Weight update by CUDA IPC at Qwen3-30B-A3B shape on one GPU: a PyTorch trainer process
// (benchmarks/gpu/ipc_trainer.py) holds a random BF16 model and hands it over bucket by bucket; the
// engine's device model (random weights of the same shape, INT4-asym g128 experts, or BF16
// experts with --bf16) opens each bucket's handles, scans and quantizes/copies into its staging
// area, closes them; then commits and hashes every served tensor. Beside it, in the same run, a
// device-to-device copy of the same bytes: the physical floor of an update.
//
// The engine side runs the runner's code path (model::ipc_mapping, qwen3_gpu_model::stage /
// commit_staged / digests) without the actor graph: the actors add one message per bucket.
//
//   update_bench [--layers 48] [--bucket-mib 1024] [--bf16] [--trainer benchmarks/gpu/ipc_trainer.py]
//                [--json FILE]
#include <cstdio>
#include <cstdlib>
#include <string>

#if RLSERVE_HAVE_CUDA

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "benchmarks/gpu/qwen3_30b_a3b.hpp"
#include "messages/base64.hpp"
#include "model/cuda_ipc.hpp"
#include "model/qwen3_gpu.hpp"

using namespace rlserve;
using namespace rlserve::model;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// A child process with its stdin and stdout as pipes.
struct child {
  pid_t pid = -1;
  FILE* in = nullptr;  // its stdout
  FILE* out = nullptr; // its stdin
  explicit child(const std::vector<std::string>& argv) {
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0)
      std::exit(2);
    pid = fork();
    if (pid == 0) {
      dup2(to[0], 0);
      dup2(from[1], 1);
      close(to[1]);
      close(from[0]);
      std::vector<char*> args;
      for (auto& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::perror("exec");
      std::_Exit(127);
    }
    close(to[0]);
    close(from[1]);
    out = fdopen(to[1], "w");
    in = fdopen(from[0], "r");
  }
  bool read_line(std::string& line) {
    line.clear();
    char buf[1 << 16];
    while (std::fgets(buf, sizeof buf, in)) {
      line += buf;
      if (!line.empty() && line.back() == '\n')
        return true;
    }
    return !line.empty();
  }
  void write_line(const char* s) {
    std::fputs(s, out);
    std::fputc('\n', out);
    std::fflush(out);
  }
  int wait() {
    int st = 0;
    std::fclose(out);
    waitpid(pid, &st, 0);
    return st;
  }
};

} // namespace

int main(int argc, char** argv) {
  int64_t layers = 48, bucket_mib = 1024;
  bool bf16 = false;
  std::string trainer = "benchmarks/gpu/ipc_trainer.py", json_out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--layers") layers = std::stoll(next());
    else if (a == "--bucket-mib") bucket_mib = std::stoll(next());
    else if (a == "--bf16") bf16 = true;
    else if (a == "--trainer") trainer = next();
    else if (a == "--json") json_out = next();
    else {
      std::fprintf(stderr, "update_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const auto c = bench::qwen3_30b_a3b(layers);
  gpu_options o;
  o.kv_num_blocks = 256;
  o.max_batch_tokens = 256;
  o.max_sequences = 8;
  auto t_create = clock_type::now();
  auto made = qwen3_gpu_model::create_random(c, bf16 ? std::nullopt : std::optional<random_int4>(random_int4{128, false}), 1, o);
  if (!made) {
    std::fprintf(stderr, "update_bench: %s\n", made.error().c_str());
    return 1;
  }
  auto& gpu = **made;
  std::printf("engine: %s, %lld layers, %s experts, %.1f GB of weights (created in %.1f s)\n",
              gpu.device_name().c_str(), static_cast<long long>(layers), bf16 ? "BF16" : "INT4-asym g128",
              gpu.weight_bytes() / 1e9, seconds_since(t_create));

  child t({"python3", trainer, "--layers", std::to_string(layers), "--bucket-mib", std::to_string(bucket_mib)});
  double open_s = 0, stage_s = 0, close_s = 0;
  uint64_t bytes = 0;
  int64_t buckets = 0, tensors = 0;
  std::vector<std::string> names;
  std::string line;
  auto t_update = clock_type::now();
  double trainer_wait_s = 0;
  while (true) {
    auto t_wait = clock_type::now();
    if (!t.read_line(line)) {
      std::fprintf(stderr, "update_bench: the trainer stopped early\n");
      return 1;
    }
    trainer_wait_s += seconds_since(t_wait);
    auto j = nlohmann::json::parse(line);
    if (j.contains("done"))
      break;
    std::vector<NamedDeviceTensor> refs;
    for (auto& r : j["tensors"]) {
      NamedDeviceTensor nt;
      nt.name = r["name"].get<std::string>();
      nt.tensor.type = dtype::bf16;
      nt.tensor.shape = r["shape"].get<std::vector<int64_t>>();
      auto handle = hex_decode(r["ipc_handle"].get<std::string>());
      if (!handle) {
        std::fprintf(stderr, "update_bench: the trainer sent a bad handle: %s\n", handle.error().c_str());
        return 1;
      }
      nt.tensor.ipc_handle = std::move(*handle);
      nt.tensor.offset = r["offset"].get<uint64_t>();
      nt.tensor.nbytes = r["nbytes"].get<uint64_t>();
      nt.tensor.device_uuid = r["device_uuid"].get<std::string>();
      bytes += nt.tensor.nbytes;
      refs.push_back(std::move(nt));
    }
    auto t0 = clock_type::now();
    auto map = ipc_mapping::open(refs, 0);
    if (!map) {
      std::fprintf(stderr, "update_bench: %s\n", map.error().c_str());
      return 1;
    }
    if (auto w = (*map)->wait_for_producer(); !w) {
      std::fprintf(stderr, "update_bench: %s\n", w.error().c_str());
      return 1;
    }
    auto t1 = clock_type::now();
    std::vector<qwen3_gpu_model::update_source> src;
    for (std::size_t i = 0; i < refs.size(); ++i)
      src.push_back({refs[i].name, (*map)->data(i), dtype::bf16, refs[i].tensor.shape});
    auto s = gpu.stage(src, false);
    auto t2 = clock_type::now();
    if (!s) {
      std::fprintf(stderr, "update_bench: %s\n", s.error().c_str());
      return 1;
    }
    if (auto cl = (*map)->close(); !cl) {
      std::fprintf(stderr, "update_bench: %s\n", cl.error().c_str());
      return 1;
    }
    auto t3 = clock_type::now();
    open_s += std::chrono::duration<double>(t1 - t0).count();
    stage_s += std::chrono::duration<double>(t2 - t1).count();
    close_s += std::chrono::duration<double>(t3 - t2).count();
    ++buckets;
    tensors += static_cast<int64_t>(refs.size());
    for (auto& r : refs) {
      if (!bf16 && r.name.find(".mlp.experts.") != std::string::npos) {
        auto p = r.name.substr(0, r.name.size() - 7); // strip ".weight"
        for (const char* sfx : {".weight_packed", ".weight_scale", ".weight_zero_point"})
          names.push_back(p + sfx);
      } else {
        names.push_back(r.name);
      }
    }
    t.write_line("next");
  }
  const double engine_bucket_s = open_s + stage_s + close_s;
  const double wall_with_trainer_s = seconds_since(t_update);
  const std::size_t peak = gpu.staging_peak_bytes();
  auto t_commit = clock_type::now();
  auto done = gpu.commit_staged();
  const double commit_s = seconds_since(t_commit);
  if (!done) {
    std::fprintf(stderr, "update_bench: %s\n", done.error().c_str());
    return 1;
  }
  auto t_hash = clock_type::now();
  auto digests = gpu.digests(names);
  const double hash_s = seconds_since(t_hash);
  if (!digests) {
    std::fprintf(stderr, "update_bench: %s\n", digests.error().c_str());
    return 1;
  }
  t.wait();

  // The floor: a device-to-device copy of the same bytes, in bucket-sized copies.
  const std::size_t chunk = static_cast<std::size_t>(bucket_mib) << 20;
  void *a = nullptr, *b = nullptr;
  cudaMalloc(&a, chunk);
  cudaMalloc(&b, chunk);
  cudaMemcpy(b, a, chunk, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  auto t_copy = clock_type::now();
  for (uint64_t done_bytes = 0; done_bytes < bytes; done_bytes += chunk)
    cudaMemcpy(b, a, std::min<uint64_t>(chunk, bytes - done_bytes), cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const double copy_s = seconds_since(t_copy);
  cudaFree(a);
  cudaFree(b);

  const double update_s = engine_bucket_s + commit_s;
  std::printf("update: %lld tensors, %.2f GB BF16 in %lld buckets of %lld MiB\n", static_cast<long long>(tensors),
              bytes / 1e9, static_cast<long long>(buckets), static_cast<long long>(bucket_mib));
  std::printf("  engine side        %8.3f s  (IPC open+wait %.3f, scan+%s into staging %.3f, close %.3f)\n",
              engine_bucket_s, open_s, bf16 ? "copy" : "quantize", stage_s, close_s);
  std::printf("  commit             %8.3f s  (%s)\n", commit_s, done->c_str());
  std::printf("  update total       %8.3f s  = engine side + commit (trainer's bucket filling excluded; "
              "wall with it %.3f s)\n", update_s, wall_with_trainer_s);
  std::printf("  checksum           %8.3f s  (%zu tensors, XXH3-64 of the served bytes)\n", hash_s, names.size());
  std::printf("  staging peak       %8.2f GB\n", peak / 1e9);
  std::printf("  D2D copy, same bytes %6.3f s  (%.0f GB/s read)  -> update / copy = %.2fx\n", copy_s,
              bytes / copy_s / 1e9, update_s / copy_s);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << nlohmann::json{{"layers", layers}, {"experts", bf16 ? "bf16" : "int4-asym-g128"}, {"bucket_mib", bucket_mib},
                        {"tensors", tensors}, {"bytes", bytes}, {"buckets", buckets}, {"open_s", open_s},
                        {"stage_s", stage_s}, {"close_s", close_s}, {"commit_s", commit_s}, {"update_s", update_s},
                        {"checksum_s", hash_s}, {"staging_peak_bytes", peak}, {"copy_s", copy_s},
                        {"wall_with_trainer_s", wall_with_trainer_s}}
             .dump(1);
  }
  return 0;
}

#else

int main() {
  std::fprintf(stderr, "update_bench: this build has no CUDA\n");
  return 1;
}

#endif
