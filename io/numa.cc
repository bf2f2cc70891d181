// hwloc calls for NUMA placement of the pinned DRAM tier.
#include "io/numa.h"

#include <hwloc.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "io/errno_status.h"

namespace tiermem::io {

struct Topology::Handle {
  hwloc_topology_t topo = nullptr;
  ~Handle() {
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }
};

absl::StatusOr<std::unique_ptr<Topology>> Topology::Load(bool with_pci) {
  std::unique_ptr<Topology> t(new Topology());
  t->handle_ = std::make_unique<Handle>();
  if (hwloc_topology_init(&t->handle_->topo) != 0) {
    return absl::InternalError("hwloc_topology_init failed");
  }
  // PCI devices are needed to find a GPU's locality; bridges and OS devices are not.
  hwloc_topology_set_io_types_filter(t->handle_->topo, HWLOC_TYPE_FILTER_KEEP_NONE);
  if (with_pci) {
    hwloc_topology_set_type_filter(t->handle_->topo, HWLOC_OBJ_PCI_DEVICE,
                                   HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  }
  if (hwloc_topology_load(t->handle_->topo) != 0) {
    return absl::InternalError(absl::StrFormat("hwloc_topology_load: %s", std::strerror(errno)));
  }
  return t;
}

Topology::~Topology() = default;

int Topology::NodeCount() const {
  int n = hwloc_get_nbobjs_by_type(handle_->topo, HWLOC_OBJ_NUMANODE);
  return n > 0 ? n : 1;
}

bool Topology::HasNode(int node) const {
  return node >= 0 &&
         hwloc_get_numanode_obj_by_os_index(handle_->topo, static_cast<unsigned>(node)) != nullptr;
}

int Topology::NodeOfPciDevice(const std::string& bus_id) const {
  hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(handle_->topo, bus_id.c_str());
  if (dev == nullptr) return -1;
  hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(handle_->topo, dev);
  if (parent == nullptr || parent->nodeset == nullptr) return -1;
  const int node = hwloc_bitmap_first(parent->nodeset);
  const int weight = hwloc_bitmap_weight(parent->nodeset);
  // One node: the GPU's. Several but not all: a socket split into NUMA nodes (Intel SNC, AMD
  // NPS), whose nodes are all local to the GPU's root port: the first of them. Every node: the
  // topology says nothing about locality (a VM, a flat machine): none, and the caller falls
  // back to its own thread's node.
  if (weight == 1 || (weight > 1 && weight < NodeCount())) return node;
  return -1;
}

int Topology::NodeOfCallingThread() const {
  hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
  hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
  int node = -1;
  if (hwloc_get_last_cpu_location(handle_->topo, cpus, HWLOC_CPUBIND_THREAD) == 0) {
    hwloc_cpuset_to_nodeset(handle_->topo, cpus, nodes);
    node = hwloc_bitmap_first(nodes);
  }
  hwloc_bitmap_free(cpus);
  hwloc_bitmap_free(nodes);
  return node;
}

absl::Status Topology::BindArea(void* addr, size_t len, int node) const {
  hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(handle_->topo, static_cast<unsigned>(node));
  if (obj == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TIERMEM_NUMA=%d: no such NUMA node (this machine has %d)", node, NodeCount()));
  }
  if (hwloc_set_area_membind(handle_->topo, addr, len, obj->nodeset, HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET) != 0) {
    int err = errno;
    return ErrnoStatus(err, absl::StrFormat("binding host memory to NUMA node %d", node));
  }
  return absl::OkStatus();
}

absl::Status Topology::BindCallingThreadToNode(int node) const {
  hwloc_obj_t obj = hwloc_get_numanode_obj_by_os_index(handle_->topo, static_cast<unsigned>(node));
  if (obj == nullptr || obj->cpuset == nullptr || hwloc_bitmap_iszero(obj->cpuset)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "NUMA node %d: no such node with cores (this machine has %d nodes)", node, NodeCount()));
  }
  if (hwloc_set_cpubind(handle_->topo, obj->cpuset, HWLOC_CPUBIND_THREAD) != 0) {
    int err = errno;
    return ErrnoStatus(err, absl::StrFormat("binding a thread to NUMA node %d's cores", node));
  }
  return absl::OkStatus();
}

int Topology::CoresOfNode(int node) const {
  hwloc_const_cpuset_t cpus = hwloc_topology_get_topology_cpuset(handle_->topo);
  if (node >= 0) {
    hwloc_obj_t obj =
        hwloc_get_numanode_obj_by_os_index(handle_->topo, static_cast<unsigned>(node));
    if (obj != nullptr && obj->cpuset != nullptr) cpus = obj->cpuset;
  }
  const int cores = hwloc_get_nbobjs_inside_cpuset_by_type(handle_->topo, cpus, HWLOC_OBJ_CORE);
  return cores > 0 ? cores : 1;
}

}  // namespace tiermem::io
