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


@pytest.mark.parametrize("field,value", [
    ("io_block_size", 2**40),      # uint32: would wrap to 0, "unset"
    ("numa_node", 2**32),          # int32: would wrap to node 0
    ("prefetch_depth", 2**31),     # int32: would read as -2**31
    ("io_threads", -1),            # uint32: would read as 2**32 - 1
    ("io_queue_depth", 2**32 + 8),
    ("cuda_device", -2**31 - 1),
])
def test_int_setting_out_of_its_c_type_is_refused(make_runtime, field, value):
    with pytest.raises(ValueError, match=field):
        make_runtime(**{field: value})


@pytest.mark.parametrize("field", ["nvme_paths", "trace"])
def test_path_with_a_nul_byte_is_refused(make_runtime, nvme_dir, field):
    # A C string ends at its first NUL: "/tmp/a\0b" would silently name /tmp/a.
    with pytest.raises(ValueError, match="NUL"):
        make_runtime(**{field: str(nvme_dir) + "\0x"})


def test_nvme_paths_as_bytes(make_runtime, nvme_dir):
    with make_runtime(nvme_paths=str(nvme_dir).encode()) as rt:
        assert rt.config_value("TIERMEM_NVME_PATHS") == str(nvme_dir)


_SPANS = [(2**64 + 4, 2), (-1, 2), (0, 2**64 + 2), (0, -2)]


# write takes its length from its data: only its offset can be out of range.
@pytest.mark.parametrize("call,offset,nbytes", [
    (call, offset, nbytes) for call in ("write", "read", "copy_in", "copy_in_async", "copy_out")
    for offset, nbytes in _SPANS if call != "write" or offset != 0])
def test_offsets_and_counts_outside_uint64_are_refused(make_runtime, call, offset, nbytes):
    # ctypes would pass 2**64 + 4 as 4 and -1 as 2**64 - 1: a write at the wrong place, or a read
    # of the wrong bytes, reported as success. Each is a ValueError naming the argument, and the
    # tensor's bytes stay as they were.
    import ctypes
    with make_runtime() as rt:
        t = rt.tensor(16, home="dram", name="x")
        t.write(bytes(range(16)))
        buf = ctypes.create_string_buffer(16)
        args = {
            "write": lambda: t.write(b"\xff\xff", offset=offset),
            "read": lambda: t.read(nbytes, offset=offset),
            "copy_in": lambda: t.copy_in(ctypes.addressof(buf), nbytes, offset),
            "copy_in_async": lambda: t.copy_in_async(ctypes.addressof(buf), nbytes, offset),
            "copy_out": lambda: t.copy_out(ctypes.addressof(buf), nbytes, offset),
        }
        with pytest.raises(ValueError, match="offset|nbytes"):
            args[call]()
        rt.sync()
        assert t.read() == bytes(range(16))


def test_addresses_outside_uint64_are_refused(make_runtime):
    with make_runtime() as rt:
        t = rt.tensor(16, home="dram", name="x")
        with pytest.raises(ValueError, match="src_ptr"):
            t.copy_in(2**64 + 4096, 16)
        with pytest.raises(ValueError, match="dst_ptr"):
            t.copy_out(-4096, 16)


@pytest.mark.parametrize("value", ["x", "node0", -5])
def test_numa_node_names_what_it_takes(make_runtime, value):
    # "x" was a TypeError "expected an int", though "auto" and "off" are strings it takes.
    with pytest.raises(ValueError, match=r"numa_node=.*\"auto\", \"off\" or a node number"):
        make_runtime(numa_node=value)


def test_numa_node_words(make_runtime):
    with make_runtime(numa_node="OFF") as rt:
        assert rt.config_value("TIERMEM_NUMA") == "off"
    with make_runtime(numa_node="0") as rt:  # a node number as a string, as the variable takes
        assert rt.config_value("TIERMEM_NUMA") == "0"
