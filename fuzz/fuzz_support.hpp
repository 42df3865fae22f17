// Helpers shared by the libFuzzer targets of fuzz/.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace rlserve_fuzz {

// The input as text (JSON parsers take any bytes).
inline std::string_view as_text(const uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A property of the code under test that the input broke: print it and abort, so libFuzzer
// saves the input as a crash.
[[noreturn]] inline void broken(std::string_view what) {
  std::fprintf(stderr, "fuzz property broken: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

// The loaders under test read files (safetensors by mmap, config.json and tokenizer.json with
// streams); each input is written to a file in a per-process folder, in memory where /dev/shm
// exists, so the fuzzers exercise the same open/read path as the engine.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::exists("/dev/shm")
                                ? std::filesystem::path("/dev/shm")
                                : std::filesystem::temp_directory_path();
    d /= "rlserve_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

inline std::filesystem::path write_scratch_file(std::string_view file_name, const uint8_t* data,
                                                std::size_t size) {
  auto path = scratch_dir() / std::string(file_name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out)
    broken("cannot write the scratch file " + path.string());
  return path;
}

} // namespace rlserve_fuzz
