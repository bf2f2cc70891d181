// The runtime's one lock as clang's thread-safety analysis names it.
//
// Core::mu guards the tensor table and the state of every part of the runtime (core.h). Each part
// reaches the core through a reference of its own, so that what one part holds as `core_.mu_`
// another asks for as `other_.core_.mu_`: one mutex, two expressions, and the analysis cannot tell
// that they are the same. The annotations of lib/runtime therefore name `runtime_lock`, a
// capability with no state that stands for Core::mu: the core's Lock, Unlock and Wait (and
// CoreLock) take and give it back with the mutex, so that the analysis checks, precisely and
// across the parts, that the lock is held wherever guarded state is read or a part asks for it.
// What it cannot check is which runtime's lock is held: no code path holds two runtimes' locks.
#pragma once

#include "absl/base/thread_annotations.h"

namespace tiermem {

class ABSL_LOCKABLE RuntimeLock final {};
inline RuntimeLock runtime_lock;

}  // namespace tiermem
