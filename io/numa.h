// NUMA topology (hwloc): which node is local to a GPU or to this thread, and binding memory.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tiermem::io {

class Topology {
 public:
  // `with_pci`: discover PCI devices too, needed only to place memory near a GPU. (Skipping it
  // is faster, and avoids a leak in hwloc's PCI plugin that LeakSanitizer reports.)
  static absl::StatusOr<std::unique_ptr<Topology>> Load(bool with_pci);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  int NodeCount() const;
  // Whether the machine has the NUMA node with this OS index.
  bool HasNode(int node) const;
  // Node local to a PCI device ("0000:17:00.0"), or -1 when unknown.
  int NodeOfPciDevice(const std::string& bus_id) const;
  // Node of the CPU the calling thread runs on, or -1.
  int NodeOfCallingThread() const;
  // Binds [addr, addr+len) to `node` before first touch. Fails when the node does not exist.
  absl::Status BindArea(void* addr, size_t len, int node) const;
  // Binds the calling thread to the cores of `node` (for workers that stream memory bound
  // there). Fails when the node does not exist or has no cores.
  absl::Status BindCallingThreadToNode(int node) const;
  // Physical cores of `node` (every node's when node < 0); at least 1.
  int CoresOfNode(int node) const;

 private:
  Topology() = default;
  struct Handle;
  std::unique_ptr<Handle> handle_;
};

}  // namespace tiermem::io
