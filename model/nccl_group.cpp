#include "model/nccl_group.hpp"

#include <fmt/format.h>

#include <utility>

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
// neither is in progress: ncclSuccess, an error, or ncclInProgress when the limit came first.
ncclResult_t wait_for(ncclComm_t comm, cudaEvent_t done, nccl_group::limit until) {
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
    if (nccl_group::clock::now() >= until.deadline || until.cancelled())
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
            wait_for(comm, nullptr, limit{clock::now() + std::chrono::seconds(10)}) == ncclSuccess)
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

// Why a wait that ended in ncclInProgress gave up.
static std::string gave_up(const nccl_group::limit& until, const std::string& timed_out) {
  return until.cancelled() ? "the group was destroyed while it waited" : timed_out;
}

bool nccl_group::broken() const { return impl_->broken; }
bool nccl_group::available() { return true; }

expected<device_buffer> device_buffer::allocate(int device, std::size_t bytes) {
  device_buffer out;
  out.device_ = device;
  out.bytes_ = bytes;
  if (bytes == 0)
    return out;
  if (auto e = cudaSetDevice(device); e != cudaSuccess)
    return fail(fmt::format("cudaSetDevice({}): {}", device, cudaGetErrorString(e)));
  void* p = nullptr;
  if (auto e = cudaMalloc(&p, bytes); e != cudaSuccess) {
    (void)cudaGetLastError(); // an allocation failure is not sticky; clear it for the next call
    return fail(fmt::format("cannot allocate {} MiB on CUDA device {} to receive the broadcast: {}",
                            (bytes + (1u << 20) - 1) >> 20, device, cudaGetErrorString(e)));
  }
  out.data_ = static_cast<std::byte*>(p);
  return out;
}

void device_buffer::free() {
  if (data_) {
    cudaSetDevice(device_);
    cudaFree(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
}
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
                                                         limit until) {
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
  r = wait_for(p->comm, nullptr, until);
  if (r == ncclInProgress) {
    p->broken = true; // the destructor aborts the half-made communicator
    return fail(fmt::format("{}: {}; the group was aborted", what,
                            gave_up(until, fmt::format("the other ranks did not join before the deadline "
                                                       "(is the trainer creating its communicator for "
                                                       "this group, with world_size {}?)",
                                                       world_size))));
  }
  if (r != ncclSuccess) {
    p->broken = true;
    return fail(fmt::format("{}: creating the communicator failed: {}", what, nccl_text(r, p->comm)));
  }
  return std::unique_ptr<nccl_group>(new nccl_group(std::move(p)));
}

status nccl_group::broadcast(std::span<const nccl_buffer> buffers, int root, limit until) {
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
  if (auto w = wait_for(p.comm, nullptr, until); w != ncclSuccess) {
    p.broken = true;
    return fail(fmt::format("{}: {}; the group was aborted", what,
                            w == ncclInProgress
                              ? gave_up(until, "enqueueing the broadcasts did not finish before the deadline")
                              : "enqueueing the broadcasts failed: " + nccl_text(w, p.comm)));
  }
  if (auto e = cudaEventRecord(p.done, p.stream); e != cudaSuccess) {
    p.broken = true;
    return fail(fmt::format("{}: cudaEventRecord: {}", what, cudaGetErrorString(e)));
  }
  r = wait_for(p.comm, p.done, until);
  if (r == ncclInProgress) {
    p.broken = true;
    return fail(fmt::format("{}: {}; the group was aborted and the received bytes are not used", what,
                            gave_up(until, fmt::format("{} broadcasts from rank {} did not complete before "
                                                       "the deadline (the trainer stopped sending, or sent "
                                                       "other tensors)",
                                                       buffers.size(), root))));
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
                                                         limit) {
  return fail(k_no_nccl);
}
bool nccl_group::available() { return false; }
expected<device_buffer> device_buffer::allocate(int, std::size_t) { return fail(k_no_nccl); }
void device_buffer::free() {}
expected<std::vector<uint8_t>> nccl_group::new_unique_id() { return fail(k_no_nccl); }
std::string nccl_group::version() { return k_no_nccl; }
status nccl_group::broadcast(std::span<const nccl_buffer>, int, limit) { return fail(k_no_nccl); }
bool nccl_group::broken() const { return true; }
int nccl_group::rank() const { return 0; }
int nccl_group::world_size() const { return 0; }
const std::string& nccl_group::name() const { return impl_->name; }

} // namespace rlserve::model

#endif

namespace rlserve::model {

device_buffer::device_buffer(device_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

device_buffer& device_buffer::operator=(device_buffer&& other) noexcept {
  if (this != &other) {
    free();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

device_buffer::~device_buffer() { free(); }

} // namespace rlserve::model
