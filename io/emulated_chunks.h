// The emulated device's physical chunks for TIERMEM_HBM_LAYOUT=mapped (io/emulated_chunks.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "io/device.h"

namespace tiermem::io {

// `bytes` rounded down to 2 MiB chunks, with a copies' range `range_multiple` times as large.
// `forget` runs with the range's base when the mapper goes. InvalidArgument below one chunk;
// ResourceExhausted when the range cannot be reserved or the chunks could use up the process's
// memory mappings (vm.max_map_count).
absl::StatusOr<std::unique_ptr<ChunkMapper>> CreateEmulatedChunkMapper(
    uint64_t bytes, uint64_t range_multiple, std::function<void(void*)> forget);

}  // namespace tiermem::io
