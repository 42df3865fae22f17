// model/safetensors.hpp's reader on untrusted files: a checkpoint from a trainer must never make
// the engine read outside the mapping. Every tensor the header validates is read byte by byte,
// so a wrong bounds check is an ASan report (or a SEGV past the mapping).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_support.hpp"
#include "model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  auto path = rlserve_fuzz::write_scratch_file("model.safetensors", data, size);
  auto file = rlserve::model::safetensors_file::open(path);
  if (!file)
    return 0;
  volatile unsigned sink = 0;
  for (const auto& name : file->names()) {
    auto t = file->tensor(name);
    if (!t)
      rlserve_fuzz::broken("a listed tensor does not load: " + t.error());
    auto n = rlserve::model::tensor_byte_count(t->type, t->shape);
    if (!n || *n != t->nbytes)
      rlserve_fuzz::broken("tensor " + name + ": byte count does not match its shape");
    for (auto b : t->bytes())
      sink = sink + static_cast<unsigned>(b);
  }
  return 0;
}
