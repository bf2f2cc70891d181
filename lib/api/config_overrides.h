// The fields of a caller's tm_config as overrides of the environment (lib/config).
#pragma once

#include "absl/status/statusor.h"
#include "lib/config/config.h"
#include "tiermem/tiermem.h"

namespace tiermem {

// TM_ERR_INVALID_ARGUMENT for a struct_size no TM_CONFIG_INIT ever wrote; TM_ERR_CONFIG naming
// the field for a value out of range. nullptr: no overrides.
absl::StatusOr<ConfigOverrides> OverridesFrom(const tm_config* c);

}  // namespace tiermem
