// HBM chunks through the CUDA driver's virtual memory management: one physical allocation per
// chunk (cuMemCreate), created up front, and one reserved address range (cuMemAddressReserve) in
// which Map places any chunk at any chunk-aligned offset (cuMemMap, then cuMemSetAccess).
#include "io/cuda_chunks.h"

#ifdef TIERMEM_HAVE_CUDA

#include <cuda.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "io/log.h"

namespace tiermem::io {
namespace {

// The driver's functions, found through the runtime so that nothing links libcuda.
struct Driver {
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuDeviceGetAttribute) attribute = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
};

template <typename F>
absl::Status Find(const char* symbol, F& f) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (Cudart().cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::UnimplementedError(
        absl::StrFormat("the CUDA driver has no %s (virtual memory management)", symbol));
  }
  f = reinterpret_cast<F>(p);
  return absl::OkStatus();
}

absl::StatusOr<Driver> LoadDriver() {
  Driver d;
  for (absl::Status s :
       {Find("cuMemGetAllocationGranularity", d.granularity), Find("cuMemCreate", d.create),
        Find("cuMemRelease", d.release), Find("cuMemAddressReserve", d.reserve),
        Find("cuMemAddressFree", d.address_free), Find("cuMemMap", d.map),
        Find("cuMemUnmap", d.unmap), Find("cuMemSetAccess", d.set_access),
        Find("cuDeviceGetAttribute", d.attribute), Find("cuGetErrorName", d.error_name)}) {
    if (!s.ok()) return s;
  }
  return d;
}

CUmemAllocationProp DeviceProp(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

class CudaChunkMapper final : public ChunkMapper {
 public:
  CudaChunkMapper(const Driver& d, int device, uint64_t chunk)
      : d_(d), device_(device), chunk_(chunk) {}
  ~CudaChunkMapper() override {
    // The arena has unmapped every chunk (MappedArena's destructor). A failure here leaks device
    // memory or address space until the process exits: logged, since a destructor cannot
    // return it.
    DeviceGuard guard(device_);
    auto said = [&](CUresult r, const char* what) {
      if (r != CUDA_SUCCESS)
        Log(LogSeverity::kError, "%s", std::string(Failed(r, what).message()).c_str());
    };
    if (base_ != 0) said(d_.address_free(base_, range_), "cuMemAddressFree");
    for (CUmemGenericAllocationHandle h : handles_) said(d_.release(h), "cuMemRelease");
  }

  absl::Status Init(uint64_t chunks, uint64_t range_multiple) {
    const CUmemAllocationProp prop = DeviceProp(device_);
    handles_.reserve(chunks);
    for (uint64_t i = 0; i < chunks; ++i) {
      CUmemGenericAllocationHandle h = 0;
      if (CUresult r = d_.create(&h, chunk_, &prop, 0); r != CUDA_SUCCESS) {
        return Failed(r, absl::StrFormat("cuMemCreate (chunk %llu of %llu)",
                                         static_cast<unsigned long long>(i),
                                         static_cast<unsigned long long>(chunks)));
      }
      handles_.push_back(h);
    }
    range_ = chunks * chunk_ * range_multiple;
    if (CUresult r = d_.reserve(&base_, range_, chunk_, 0, 0); r != CUDA_SUCCESS) {
      base_ = 0;
      return Failed(r, "cuMemAddressReserve");
    }
    return absl::OkStatus();
  }

  uint64_t chunk_bytes() const override { return chunk_; }
  uint64_t chunks() const override { return handles_.size(); }
  char* base() const override { return reinterpret_cast<char*>(base_); }
  uint64_t range_bytes() const override { return range_; }

  absl::Status Map(uint64_t offset, const uint64_t* chunks, uint64_t count) override {
    if (offset % chunk_ != 0 || count == 0 || offset > range_ ||
        count > (range_ - offset) / chunk_) {
      return absl::InvalidArgumentError("CUDA: a mapping outside the range");
    }
    DeviceGuard guard(device_);
    uint64_t done = 0;
    CUresult r = CUDA_SUCCESS;
    for (; done < count; ++done) {
      if (chunks[done] >= handles_.size()) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      r = d_.map(base_ + offset + done * chunk_, chunk_, 0, handles_[chunks[done]], 0);
      if (r != CUDA_SUCCESS) break;
    }
    if (r != CUDA_SUCCESS) {
      absl::Status s = Failed(r, "cuMemMap");
      if (done > 0) s = Undone(std::move(s), offset, done);
      return s;
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (r = d_.set_access(base_ + offset, count * chunk_, &access, 1); r != CUDA_SUCCESS) {
      return Undone(Failed(r, "cuMemSetAccess"), offset, count);
    }
    return absl::OkStatus();
  }
  void Unmap(uint64_t offset, const uint64_t*, uint64_t count) override {
    DeviceGuard guard(device_);
    // Nothing to return to: the caller frees the range either way. A chunk left mapped there
    // makes a later cuMemMap at that offset fail, so the cause is logged where it happened.
    if (CUresult r = d_.unmap(base_ + offset, count * chunk_); r != CUDA_SUCCESS) {
      Log(LogSeverity::kError, "%s",
          std::string(Failed(r, absl::StrFormat("cuMemUnmap of %llu bytes at offset %llu",
                                                static_cast<unsigned long long>(count * chunk_),
                                                static_cast<unsigned long long>(offset)))
                          .message())
              .c_str());
    }
  }

 private:
  // `failed` after unmapping the first `count` chunks a failed Map had mapped at `offset`, with
  // cuMemUnmap's error added when that failed too (the range then still holds them).
  absl::Status Undone(absl::Status failed, uint64_t offset, uint64_t count) const {
    const CUresult r = d_.unmap(base_ + offset, count * chunk_);
    if (r == CUDA_SUCCESS) return failed;
    return absl::Status(failed.code(), absl::StrFormat("%s; then %s", failed.message(),
                                                       Failed(r, "cuMemUnmap").message()));
  }
  absl::Status Failed(CUresult r, absl::string_view what) const {
    const char* name = nullptr;
    if (d_.error_name(r, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown error";
    std::string msg = absl::StrFormat("%s: %s", what, name);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? absl::ResourceExhaustedError(msg)
                                         : absl::InternalError(msg);
  }

  const Driver d_;
  const int device_;
  const uint64_t chunk_;
  std::vector<CUmemGenericAllocationHandle> handles_;
  CUdeviceptr base_ = 0;
  uint64_t range_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkMapper>> CreateCudaChunkMapper(int device, uint64_t bytes,
                                                                   uint64_t range_multiple) {
  DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) {
    return absl::InternalError(absl::StrFormat("cudaSetDevice(%d): %s", device,
                                               Cudart().cudaGetErrorName(guard.status())));
  }
  auto d = LoadDriver();
  if (!d.ok()) return d.status();
  int vmm = 0;
  if (d->attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) !=
          CUDA_SUCCESS ||
      vmm == 0) {
    return absl::UnimplementedError(
        absl::StrFormat("CUDA device %d has no virtual memory management", device));
  }
  const CUmemAllocationProp prop = DeviceProp(device);
  size_t granularity = 0;
  if (d->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
      granularity == 0) {
    return absl::UnimplementedError("cuMemGetAllocationGranularity failed");
  }
  const uint64_t chunks = bytes / granularity;
  if (chunks == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%llu bytes is below one chunk (%zu bytes)",
                                                      static_cast<unsigned long long>(bytes),
                                                      granularity));
  }
  if (range_multiple == 0 || chunks > UINT64_MAX / granularity / range_multiple) {
    return absl::ResourceExhaustedError("the address range to reserve is too large");
  }
  auto m = std::make_unique<CudaChunkMapper>(*d, device, granularity);
  if (auto s = m->Init(chunks, range_multiple); !s.ok()) return s;
  return std::unique_ptr<ChunkMapper>(std::move(m));
}

}  // namespace tiermem::io

#endif  // TIERMEM_HAVE_CUDA
