// The process-wide generation counter of the slot tables.
#include "lib/base/slot_table.h"

#include <atomic>

namespace tiermem {

uint32_t NextSlotGeneration() {
  static std::atomic<uint32_t> generation{0};
  uint32_t previous = generation.load();
  while (!generation.compare_exchange_weak(previous, NextHandleGeneration(previous))) {
  }
  return NextHandleGeneration(previous);
}

}  // namespace tiermem
