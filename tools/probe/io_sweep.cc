#include "tools/probe/io_sweep.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_format.h"
#include "io/io_engine.h"

namespace tiermem {

absl::StatusOr<std::unique_ptr<IoSweep>> IoSweep::Create(const std::vector<std::string>& dirs,
                                                         uint64_t bytes, IoEngineKind engine) {
  if (dirs.empty() || bytes == 0) return absl::InvalidArgumentError("no directory or no bytes");
  std::unique_ptr<IoSweep> s(new IoSweep());
  s->bytes_ = bytes;
  s->engine_kind_ = engine;
  for (const std::string& d : dirs) {
    auto f = io::SwapFile::Create(d, bytes / dirs.size());
    if (!f.ok()) return f.status();
    s->files_.push_back(std::move(*f));
  }
  auto src = io::HostRegion::Create(bytes, nullptr, -1);
  if (!src.ok()) return src.status();
  auto dst = io::HostRegion::Create(bytes, nullptr, -1);
  if (!dst.ok()) return dst.status();
  s->src_ = std::move(*src);
  s->dst_ = std::move(*dst);
  // A pattern that differs in every 8 bytes, so a misplaced block cannot pass the check.
  auto* p = static_cast<uint64_t*>(s->src_->data());
  for (uint64_t i = 0; i < bytes / 8; ++i) p[i] = i * 0x9E3779B97F4A7C15ull + 1;
  std::memset(s->dst_->data(), 0, bytes);
  return s;
}

absl::StatusOr<IoPoint> IoSweep::Measure(uint32_t block_size, uint32_t queue_depth,
                                         uint32_t threads, int repeats) {
  const uint64_t n = files_.size();
  const uint64_t per_file = bytes_ / n;
  for (const auto& f : files_) {
    if (block_size < f->alignment() || block_size % f->alignment() != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("block size %u is below the O_DIRECT alignment %u of %s", block_size,
                          f->alignment(), f->dir()));
    }
  }
  if (per_file % block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("block size %u does not divide the %llu bytes per file", block_size,
                        static_cast<unsigned long long>(per_file)));
  }
  io::IoEngineOptions o;
  o.block_size = block_size;
  o.queue_depth = queue_depth;
  o.threads = threads;
  o.buffers = {{src_->data(), bytes_}, {dst_->data(), bytes_}};
  for (const auto& f : files_) o.files.push_back(f->fd());
  std::unique_ptr<io::IoEngine> engine;
  if (engine_kind_ != IoEngineKind::kPosix) {
    auto e = io::CreateUringEngine(o);
    if (e.ok()) {
      engine = std::move(*e);
    } else if (engine_kind_ == IoEngineKind::kUring) {
      return e.status();
    }
  }
  if (engine == nullptr) engine = io::CreatePosixEngine(o);
  engine_name_ = std::string(engine->name());

  // Block i of the buffer goes to file i % n at (i / n) * block: the NVMe tier's striping.
  auto requests = [&](void* buffer, bool write) {
    std::vector<io::IoRequest> rs;
    if (n == 1) {
      rs.push_back({files_[0]->fd(), 0, buffer, bytes_, write, files_[0]->alignment(),
                    files_[0]->dir().c_str()});
      return rs;
    }
    for (uint64_t i = 0; i < bytes_ / block_size; ++i) {
      const io::SwapFile& f = *files_[i % n];
      rs.push_back({f.fd(), (i / n) * block_size, static_cast<char*>(buffer) + i * block_size,
                    block_size, write, f.alignment(), f.dir().c_str()});
    }
    return rs;
  };
  const auto writes = requests(src_->data(), true);
  const auto reads = requests(dst_->data(), false);
  auto timed = [&](const std::vector<io::IoRequest>& rs) -> absl::StatusOr<double> {
    auto t0 = std::chrono::steady_clock::now();
    if (auto s = engine->Run(rs); !s.ok()) return s;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Write then read, in turns: each read follows one write, as a fio write job then a read job
  // would, rather than several writes whose writeback (on a virtual disk, the host's) slows the
  // reads after them.
  std::vector<double> w, r;
  for (int i = 0; i < repeats; ++i) {
    auto t = timed(writes);
    if (!t.ok()) return t.status();
    w.push_back(*t);
    if (i == repeats - 1) std::memset(dst_->data(), 0, bytes_);  // the checked read
    t = timed(reads);
    if (!t.ok()) return t.status();
    r.push_back(*t);
  }
  if (std::memcmp(src_->data(), dst_->data(), bytes_) != 0) {
    return absl::DataLossError("the I/O sweep read back different bytes than it wrote");
  }
  std::sort(w.begin(), w.end());
  std::sort(r.begin(), r.end());
  IoPoint p;
  p.block_size = block_size;
  p.queue_depth = queue_depth;
  p.threads = threads;
  const double gb = static_cast<double>(bytes_) / 1e9;
  p.write_gbps = gb / w[w.size() / 2];
  p.read_gbps = gb / r[r.size() / 2];
  return p;
}

}  // namespace tiermem
