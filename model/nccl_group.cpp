#include "model/nccl_group.hpp"

#include <fmt/format.h>

#if RLSERVE_HAVE_NCCL

#include <cstring>
#include <thread>

#include <cuda_runtime.h>
#include <nccl.h>

namespace rlserve::model {

namespace {

std::string nccl_text(ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string out = ncclGetErrorString(r);
  if (comm)
    if (const char* last = ncclGetLastError(comm); last && *last)
      out += std::string(" (") + last + ")";
  return out;
}

expected<ncclDataType_t> nccl_type(dtype t) {
  switch (t) {
  case dtype::f32: return ncclFloat32;
  case dtype::f16: return ncclFloat16;
  case dtype::bf16: return ncclBfloat16;
  case dtype::f64: return ncclFloat64;
  case dtype::i8: return ncclInt8;
  case dtype::u8: return ncclUint8;
  case dtype::boolean: return ncclUint8;
  case dtype::i32: return ncclInt32;
  case dtype::i64: return ncclInt64;
  case dtype::i16: break; // NCCL has no 16-bit integer type
  }
  return fail(fmt::format("NCCL cannot broadcast {} tensors", torch_name(t)));
}

// Polls the communicator (and `done`, an event of the work, when given) every millisecond until
// neither is in progress: ncclSuccess, an error, or ncclInProgress when `deadline` passed.
ncclResult_t wait_for(ncclComm_t comm, cudaEvent_t done, nccl_group::clock::time_point deadline) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    if (auto r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess)
      return r;
    if (state != ncclSuccess && state != ncclInProgress)
      return state;
    if (state == ncclSuccess) {
      if (!done)
        return ncclSuccess;
      auto e = cudaEventQuery(done);
      if (e == cudaSuccess)
        return ncclSuccess;
      if (e != cudaErrorNotReady)
        return ncclUnhandledCudaError;
    }
    if (nccl_group::clock::now() >= deadline)
      return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

} // namespace

struct nccl_group::impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  int device = 0;
  int rank = 0;
  int world_size = 0;
  std::string name;
  bool broken = false;

  ~impl() {
    if (comm) {
      cudaSetDevice(device);
      if (broken) {
        ncclCommAbort(comm);
      } else {
        // Finalize flushes issued work; bounded, then abort if it does not finish.
        auto f = ncclCommFinalize(comm);
        if ((f == ncclSuccess || f == ncclInProgress) &&
            wait_for(comm, nullptr, clock::now() + std::chrono::seconds(10)) == ncclSuccess)
          ncclCommDestroy(comm);
        else
          ncclCommAbort(comm);
      }
    }
    if (done)
      cudaEventDestroy(done);
    if (stream)
      cudaStreamDestroy(stream);
  }
};

nccl_group::nccl_group(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
nccl_group::~nccl_group() = default;

bool nccl_group::broken() const { return impl_->broken; }
int nccl_group::rank() const { return impl_->rank; }
int nccl_group::world_size() const { return impl_->world_size; }
const std::string& nccl_group::name() const { return impl_->name; }

std::string nccl_group::version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess)
    return "NCCL (version unknown)";
  return fmt::format("NCCL {}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

expected<std::vector<uint8_t>> nccl_group::new_unique_id() {
  ncclUniqueId id;
  if (auto r = ncclGetUniqueId(&id); r != ncclSuccess)
    return fail("ncclGetUniqueId failed: " + nccl_text(r));
  std::vector<uint8_t> out(sizeof(id.internal));
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

expected<std::unique_ptr<nccl_group>> nccl_group::create(std::span<const uint8_t> unique_id, int world_size,
                                                         int rank, int device, std::string name,
                                                         clock::time_point deadline) {
  const auto what = fmt::format("weight-update group \"{}\" (rank {} of {})", name, rank, world_size);
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES)
    return fail(fmt::format("{}: an NCCL unique id is {} bytes, got {}", what, NCCL_UNIQUE_ID_BYTES,
                            unique_id.size()));
  if (world_size < 1 || rank < 0 || rank >= world_size)
    return fail(fmt::format("{}: rank must be in 0 .. world_size - 1", what));
  auto p = std::make_unique<impl>();
  p->device = device;
  p->rank = rank;
  p->world_size = world_size;
  p->name = std::move(name);
  if (auto e = cudaSetDevice(device); e != cudaSuccess)
    return fail(fmt::format("{}: cudaSetDevice({}): {}", what, device, cudaGetErrorString(e)));
  if (auto e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking); e != cudaSuccess)
    return fail(fmt::format("{}: cudaStreamCreate: {}", what, cudaGetErrorString(e)));
  if (auto e = cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming); e != cudaSuccess)
    return fail(fmt::format("{}: cudaEventCreate: {}", what, cudaGetErrorString(e)));
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0; // init and every later call return at once; wait_for polls them
  config.commName = p->name.c_str();
  auto r = ncclCommInitRankConfig(&p->comm, world_size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    p->broken = true;
    return fail(fmt::format("{}: ncclCommInitRankConfig failed: {}", what, nccl_text(r, p->comm)));
  }
  r = wait_for(p->comm, nullptr, deadline);
  if (r == ncclInProgress) {
    p->broken = true; // the destructor aborts the half-made communicator
    return fail(fmt::format("{}: the other ranks did not join before the deadline (is the trainer "
                            "creating its communicator for this group, with world_size {}?); "
                            "the group was aborted", what, world_size));
  }
  if (r != ncclSuccess) {
    p->broken = true;
    return fail(fmt::format("{}: creating the communicator failed: {}", what, nccl_text(r, p->comm)));
  }
  return std::unique_ptr<nccl_group>(new nccl_group(std::move(p)));
}

status nccl_group::broadcast(std::span<const nccl_buffer> buffers, int root, clock::time_point deadline) {
  auto& p = *impl_;
  const auto what = fmt::format("weight-update group \"{}\"", p.name);
  if (p.broken)
    return fail(what + " is broken after an earlier failure: destroy it and init a new one");
  if (root < 0 || root >= p.world_size)
    return fail(fmt::format("{}: root {} is not a rank of {}", what, root, p.world_size));
  std::vector<ncclDataType_t> types;
  for (const auto& b : buffers) {
    auto t = nccl_type(b.type);
    if (!t)
      return fail(what + ": " + t.error());
    if (b.count < 0 || (b.count > 0 && !b.data))
      return fail(what + ": a buffer without memory");
    types.push_back(*t);
  }
  if (auto e = cudaSetDevice(p.device); e != cudaSuccess)
    return fail(fmt::format("{}: cudaSetDevice: {}", what, cudaGetErrorString(e)));
  auto r = ncclGroupStart();
  for (std::size_t i = 0; r == ncclSuccess && i < buffers.size(); ++i) {
    const auto& b = buffers[i];
    r = ncclBroadcast(b.data, b.data, static_cast<size_t>(b.count), types[i], root, p.comm, p.stream);
  }
  auto end = ncclGroupEnd();
  if (r == ncclSuccess)
    r = end;
  if (r != ncclSuccess && r != ncclInProgress) {
    p.broken = true;
    return fail(fmt::format("{}: enqueueing {} broadcasts failed: {}", what, buffers.size(), nccl_text(r, p.comm)));
  }
  // Work may still be enqueueing (non-blocking); the event follows it on the stream.
  if (auto w = wait_for(p.comm, nullptr, deadline); w != ncclSuccess) {
    p.broken = true;
    return fail(fmt::format("{}: {} ; the group was aborted", what,
                            w == ncclInProgress ? "enqueueing the broadcasts did not finish before the deadline"
                                                : "enqueueing the broadcasts failed: " + nccl_text(w, p.comm)));
  }
  if (auto e = cudaEventRecord(p.done, p.stream); e != cudaSuccess) {
    p.broken = true;
    return fail(fmt::format("{}: cudaEventRecord: {}", what, cudaGetErrorString(e)));
  }
  r = wait_for(p.comm, p.done, deadline);
  if (r == ncclInProgress) {
    p.broken = true;
    return fail(fmt::format("{}: {} broadcasts from rank {} did not complete before the deadline (the "
                            "trainer stopped sending, or sent other tensors); the group was aborted "
                            "and the received bytes are not used",
                            what, buffers.size(), root));
  }
  if (r != ncclSuccess) {
    p.broken = true;
    return fail(fmt::format("{}: the broadcasts failed: {}", what, nccl_text(r, p.comm)));
  }
  return {};
}

} // namespace rlserve::model

#else // no NCCL in this build

namespace rlserve::model {

namespace {
const char* k_no_nccl = "this build of rlserve has no NCCL (configure on a machine with CUDA and NCCL; "
                        "see the NCCL section of CMakeLists.txt)";
}

struct nccl_group::impl {
  std::string name;
};

nccl_group::nccl_group(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
nccl_group::~nccl_group() = default;
expected<std::unique_ptr<nccl_group>> nccl_group::create(std::span<const uint8_t>, int, int, int, std::string,
                                                         clock::time_point) {
  return fail(k_no_nccl);
}
expected<std::vector<uint8_t>> nccl_group::new_unique_id() { return fail(k_no_nccl); }
std::string nccl_group::version() { return k_no_nccl; }
status nccl_group::broadcast(std::span<const nccl_buffer>, int, clock::time_point) { return fail(k_no_nccl); }
bool nccl_group::broken() const { return true; }
int nccl_group::rank() const { return 0; }
int nccl_group::world_size() const { return 0; }
const std::string& nccl_group::name() const { return impl_->name; }

} // namespace rlserve::model

#endif
