// Network front benchmarks on loopback (results: docs/performance.md), all in one run so the
// numbers compare:
//
//   1. large binary frames: update_weights_from_tensor frames of --frame-mib through the real
//      server (read, parsed, handed to the engine, answered) against raw TCP moving the same
//      bytes between two sockets of this process, one acknowledgement per frame in both;
//      goal: websocket >= 80% of raw TCP;
//   2. small messages per second through one I/O thread (pipelined pings from 4 connections,
//      whole round trips through the connection actors);
//   3. round-trip latency of one 1 KB .. 100 KB message at a time: a Nagle-type stall would show
//      as ~40 ms.
//
//   ws_bench [--frame-mib 64] [--frames 8] [--rounds 5] [--seconds 3]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "actors/engine.hpp"
#include "net/client.hpp"
#include "net/log.hpp"
#include "net/server.hpp"

using namespace rlserve;
using clock_type = std::chrono::steady_clock;
namespace asio = boost::asio;

namespace {

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double raw_tcp_gbps(std::size_t bytes, int frames) {
  asio::io_context ioc;
  asio::ip::tcp::acceptor acceptor(ioc, {asio::ip::make_address("127.0.0.1"), 0});
  auto port = acceptor.local_endpoint().port();
  std::thread server([&] {
    auto sock = acceptor.accept();
    sock.set_option(asio::ip::tcp::no_delay(true));
    std::vector<char> buf(bytes);
    for (int i = 0; i < frames; ++i) {
      asio::read(sock, asio::buffer(buf));
      char ack = 1;
      asio::write(sock, asio::buffer(&ack, 1));
    }
  });
  asio::ip::tcp::socket sock(ioc);
  sock.connect({asio::ip::make_address("127.0.0.1"), port});
  sock.set_option(asio::ip::tcp::no_delay(true));
  std::vector<char> payload(bytes, 'x');
  auto t0 = clock_type::now();
  for (int i = 0; i < frames; ++i) {
    asio::write(sock, asio::buffer(payload));
    char ack;
    asio::read(sock, asio::buffer(&ack, 1));
  }
  double s = since(t0);
  server.join();
  return static_cast<double>(bytes) * frames / s / 1e9;
}

// `route`: update_weights_from_tensor (the engine validates and refuses the unknown name) or
// anything else (the connection actor parses the frame and refuses it: transport only).
double ws_gbps(net::client& c, std::size_t bytes, int frames, const char* route = "update_weights_from_tensor") {
  // One tensor under a name the model lacks: the server reads and parses the whole frame, the
  // engine validates and refuses it, so nothing is applied and every frame costs the same.
  std::vector<std::byte> data(bytes, std::byte{1});
  std::vector<NamedTensor> tensors = {
    {"bench.payload", HostTensor::copy_of(dtype::u8, {static_cast<int64_t>(bytes)}, data)}};
  auto frame = net::make_binary_frame(0, route, net::json::object(), tensors);
  auto t0 = clock_type::now();
  for (int i = 0; i < frames; ++i) {
    if (!c.send_raw(frame, true)) {
      std::fprintf(stderr, "send failed\n");
      return 0;
    }
    auto m = c.receive();
    if (!m) {
      std::fprintf(stderr, "receive failed: %s\n", m.error().c_str());
      return 0;
    }
  }
  return static_cast<double>(frame.size()) * frames / since(t0) / 1e9;
}

double pings_per_second(const net::client_options& o, double seconds, int connections, int window) {
  std::atomic<long> total{0};
  std::vector<std::thread> threads;
  auto t0 = clock_type::now();
  for (int k = 0; k < connections; ++k)
    threads.emplace_back([&] {
      auto c = net::client::connect(o);
      if (!c)
        return;
      const net::json body = {{"seq", 0}};
      int in_flight = 0;
      while (in_flight < window && (*c)->send("ping", body))
        ++in_flight;
      long n = 0;
      while (since(t0) < seconds) {
        if (!(*c)->receive())
          return;
        ++n;
        if (!(*c)->send("ping", body))
          return;
      }
      for (; in_flight > 0; --in_flight)
        (void)(*c)->receive();
      total += n;
    });
  for (auto& t : threads)
    t.join();
  return static_cast<double>(total) / since(t0);
}

struct rtt {
  double p50_ms, p99_ms, max_ms;
};

rtt ping_rtt(net::client& c, std::size_t bytes, int rounds) {
  const net::json body = {{"pad", std::string(bytes, 'p')}};
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = clock_type::now();
    auto m = c.call("ping", body);
    if (!m)
      break;
    ms.push_back(since(t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  auto at = [&](double p) { return ms.empty() ? 0.0 : ms[static_cast<std::size_t>(p * (ms.size() - 1))]; };
  return {at(0.5), at(0.99), ms.empty() ? 0.0 : ms.back()};
}

} // namespace

int main(int argc, char** argv) {
  std::size_t frame_mib = 64;
  int frames = 8;
  double seconds = 3;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--frame-mib")
      frame_mib = std::stoul(argv[i + 1]);
    else if (a == "--frames")
      frames = std::stoi(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::stod(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::stoi(argv[i + 1]);
  }
  net::set_log_level(net::log_level::error);
  auto engine = Engine::start({});
  if (!engine) {
    std::fprintf(stderr, "%s\n", engine.error().c_str());
    return 1;
  }
  net::server_options so;
  so.port = 0;
  so.io_threads = 1;
  so.max_message_bytes = (frame_mib + 1) << 20;
  auto srv = net::server::start(**engine, so);
  if (!srv) {
    std::fprintf(stderr, "%s\n", srv.error().c_str());
    return 1;
  }
  net::client_options co;
  co.port = (*srv)->port();
  co.timeout = std::chrono::seconds(120);
  auto c = net::client::connect(co);
  if (!c) {
    std::fprintf(stderr, "%s\n", c.error().c_str());
    return 1;
  }
  std::printf("server: 1 I/O thread; %u hardware threads on this machine\n", std::thread::hardware_concurrency());

  std::size_t bytes = frame_mib << 20;
  (void)ws_gbps(**c, bytes, 2); // warm-up: the server's receive buffers reach their size
  // Rounds alternate the three so that load from elsewhere on the machine hits all of them; the
  // best round of each is the least disturbed one, the median says how steady it was.
  std::vector<double> raw, ws, transport;
  for (int r = 0; r < rounds; ++r) {
    raw.push_back(raw_tcp_gbps(bytes, frames));
    ws.push_back(ws_gbps(**c, bytes, frames));
    transport.push_back(ws_gbps(**c, bytes, frames, "bench_transport_only"));
  }
  auto best = [](std::vector<double> v) { return *std::max_element(v.begin(), v.end()); };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("large frames (%d x %zu MiB, best of %d rounds): raw TCP %.2f GB/s; websocket into the engine %.2f "
              "GB/s = %.0f%% of raw TCP; websocket transport only %.2f GB/s = %.0f%%\n",
              frames, frame_mib, rounds, best(raw), best(ws), 100.0 * best(ws) / best(raw), best(transport),
              100.0 * best(transport) / best(raw));
  std::printf("large frames, medians: raw TCP %.2f GB/s; websocket into the engine %.2f GB/s = %.0f%%; transport "
              "only %.2f GB/s = %.0f%%\n",
              median(raw), median(ws), 100.0 * median(ws) / median(raw), median(transport),
              100.0 * median(transport) / median(raw));

  double pps = pings_per_second(co, seconds, 4, 64);
  std::printf("small messages: %.0f round trips/s through 1 I/O thread (4 connections x 64 in flight)\n", pps);

  for (std::size_t kb : {1, 4, 16, 64, 100}) {
    auto r = ping_rtt(**c, kb * 1024, 300);
    std::printf("round trip of one %3zu KB message: p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", kb, r.p50_ms,
                r.p99_ms, r.max_ms);
  }
  (*c)->close();
  (*srv)->stop();
  return 0;
}
