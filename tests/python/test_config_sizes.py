"""Sizes the Python package hands to tm_config: values of 2**64 and more are a ValueError naming the field."""

import pytest

import tiermem


@pytest.mark.parametrize("field", ["hbm_bytes", "dram_bytes", "nvme_bytes", "prefetch_bytes"])
@pytest.mark.parametrize("value", [2**64, 2**64 + 4096])
def test_size_above_uint64_is_refused(make_runtime, field, value):
    # A size that does not fit tm_config's uint64_t must be a ValueError (docs/pytorch.md: "a bad
    # value a ValueError"); ctypes wraps it silently instead: 2**64 becomes 0 ("unset": the
    # default budget), 2**64 + 4096 a budget of 4096 bytes.
    with pytest.raises(ValueError, match=field):
        make_runtime(**{field: value})
