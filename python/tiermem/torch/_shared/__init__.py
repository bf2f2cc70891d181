"""What several features of tiermem.torch share, and the only modules one feature imports from
beside another feature's public names: bytes between torch and tiermem tensors (transfers), a
tensor freed between uses (swapped), what touching an offloaded tensor does (offloaded), tensors
viewing tiermem's bytes (views), the bucketed step driver (step_driver), the units policy (units),
parameter checks (tensors) and AdamW's checks (adam). Internal: their names, underscored or not,
are this package's API for the features, not the users'."""
