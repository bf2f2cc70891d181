// Callers' memory in and out of tiermem, side by side in one run: copy_in + offload to NVMe
// against write + offload, and prefetch to DRAM + copy_out against read (which stages from
// NVMe), with a plain memcpy of the same bytes as the ceiling of a host copy. Rounds alternate
// the paths so that the machine's drift hits all of them alike; medians are printed, with each
// path's ratio to memcpy. The caller's buffers are host memory, on whichever device the
// environment selects (TIERMEM_DEVICE); the DRAM <-> NVMe legs dominate both paths.
//
// usage: caller_copy_bench [--dir DIR] [--tensors N] [--bytes SIZE] [--rounds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tiermem/tiermem.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "caller_copy_bench: %s: %s\n", what, tm_last_error());
  std::exit(1);
}
#define CHECK_TM(call)               \
  do {                               \
    if ((call) != TM_OK) Die(#call); \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp";
  int tensors = 12;
  uint64_t bytes = (24ull << 20) + 4093;  // odd on purpose: no path gets aligned sizes for free
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "caller_copy_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dir") {
      dir = next();
    } else if (a == "--tensors") {
      tensors = std::max(1, std::atoi(next()));
    } else if (a == "--bytes") {
      bytes = std::max<uint64_t>(1, std::strtoull(next(), nullptr, 10));
    } else if (a == "--rounds") {
      rounds = std::max(1, std::atoi(next()));
    } else {
      std::fprintf(stderr,
                   "usage: caller_copy_bench [--dir DIR] [--tensors N] [--bytes N] [--rounds N]\n");
      return 2;
    }
  }
  const uint64_t total = bytes * static_cast<uint64_t>(tensors);
  tm_config c = TM_CONFIG_INIT;
  c.nvme_paths = dir.c_str();
  c.dram_bytes = total + (total / 2) + (256ull << 20);
  c.nvme_bytes = 2 * total + (256ull << 20);
  c.prefetch_depth = 0;  // prefetches are issued by hand below, the same for both paths
  tm_runtime rt{0};
  CHECK_TM(tm_runtime_create(&c, &rt));
  tm_info info = TM_INFO_INIT;
  CHECK_TM(tm_runtime_info(rt, &info));

  // Each path starts from the same state: fresh tensors (DRAM home, never written) going in,
  // every tensor on NVMe alone coming out.
  std::vector<tm_tensor> ts(tensors);
  auto fresh = [&] {
    for (int i = 0; i < tensors; ++i) {
      if (ts[i].bits != 0) CHECK_TM(tm_tensor_destroy(rt, ts[i]));
      tm_tensor_desc d = TM_TENSOR_DESC_INIT;
      d.bytes = bytes;
      d.home_tier = TM_TIER_DRAM;
      CHECK_TM(tm_tensor_create(rt, &d, &ts[i]));
    }
  };
  for (auto& t : ts) t.bits = 0;
  std::vector<std::vector<char>> src(tensors), dst(tensors);
  for (int i = 0; i < tensors; ++i) {
    src[i].assign(bytes, static_cast<char>(i + 1));
    dst[i].assign(bytes, 0);
  }

  auto gbps = [&](const std::function<void()>& f) {
    const auto t0 = Clock::now();
    f();
    return static_cast<double>(total) / 1e9 /
           std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto check = [&] {
    for (int i = 0; i < tensors; ++i) {
      if (std::memcmp(dst[i].data(), src[i].data(), bytes) != 0) {
        std::fprintf(stderr, "caller_copy_bench: tensor %d came back wrong\n", i);
        std::exit(1);
      }
      std::memset(dst[i].data(), 0, bytes);
    }
  };
  std::vector<double> memcpy_in, memcpy_out, copy_in, write_in, copy_out, read_out;
  for (int r = 0; r < rounds; ++r) {
    memcpy_in.push_back(gbps([&] {
      for (int i = 0; i < tensors; ++i) std::memcpy(dst[i].data(), src[i].data(), bytes);
    }));
    check();
    // In: caller memory -> DRAM copy -> NVMe, every tensor, then one sync.
    fresh();
    copy_in.push_back(gbps([&] {
      for (int i = 0; i < tensors; ++i) {
        CHECK_TM(tm_tensor_copy_in(rt, ts[i], 0, src[i].data(), bytes, nullptr));
        CHECK_TM(tm_tensor_offload(rt, ts[i], TM_TIER_NVME));
      }
      CHECK_TM(tm_runtime_sync(rt));
    }));
    // Out: prefetch every tensor to DRAM, then copy each out as it arrives.
    copy_out.push_back(gbps([&] {
      for (int i = 0; i < tensors; ++i) CHECK_TM(tm_tensor_prefetch(rt, ts[i], TM_TIER_DRAM));
      for (int i = 0; i < tensors; ++i) {
        CHECK_TM(tm_tensor_copy_out(rt, ts[i], 0, dst[i].data(), bytes, nullptr));
      }
      CHECK_TM(tm_runtime_sync(rt));
    }));
    check();
    CHECK_TM(tm_runtime_sync(rt));
    fresh();
    write_in.push_back(gbps([&] {
      for (int i = 0; i < tensors; ++i) {
        CHECK_TM(tm_tensor_write(rt, ts[i], 0, src[i].data(), bytes));
        CHECK_TM(tm_tensor_offload(rt, ts[i], TM_TIER_NVME));
      }
      CHECK_TM(tm_runtime_sync(rt));
    }));
    read_out.push_back(gbps([&] {
      for (int i = 0; i < tensors; ++i)
        CHECK_TM(tm_tensor_read(rt, ts[i], 0, dst[i].data(), bytes));
    }));
    check();
    memcpy_out.push_back(gbps([&] {
      for (int i = 0; i < tensors; ++i) std::memcpy(dst[i].data(), src[i].data(), bytes);
    }));
    check();
  }
  const double ref = Median(memcpy_in) / 2 + Median(memcpy_out) / 2;
  std::printf("caller_copy_bench: %d tensors of %llu bytes (%.0f MiB), %d rounds, %s, %s I/O\n",
              tensors, static_cast<unsigned long long>(bytes),
              static_cast<double>(total) / (1 << 20), rounds, info.device_name,
              info.io_engine == TM_IO_ENGINE_URING ? "uring" : "posix");
  std::printf("%-34s %9s %10s\n", "path", "GB/s", "of memcpy");
  auto row = [&](const char* name, const std::vector<double>& v) {
    std::printf("%-34s %9.2f %9.2fx\n", name, Median(v), Median(v) / ref);
  };
  row("memcpy (reference)", memcpy_in);
  row("copy_in + offload to nvme", copy_in);
  row("write + offload to nvme", write_in);
  row("prefetch to dram + copy_out", copy_out);
  row("read (staged from nvme)", read_out);
  std::printf("copy_in+offload / write+offload   %.2fx\n", Median(copy_in) / Median(write_in));
  std::printf("prefetch+copy_out / read          %.2fx\n", Median(copy_out) / Median(read_out));
  for (auto t : ts) CHECK_TM(tm_tensor_destroy(rt, t));
  CHECK_TM(tm_runtime_destroy(rt));
  return 0;
}
