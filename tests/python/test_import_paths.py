"""tiermem.torch's import paths: the package's names, and the modules users imported before the
package was split by feature (saved_tensors, optimizer_state, parameters, cpu_adam,
cpu_adam_overlap, fsdp, fit, allocator), with the public names each had."""

import importlib

import pytest

import tiermem.torch as tt

OLD_PATHS = {
    "saved_tensors": ["SavedTensorOffload", "offload_saved_tensors"],
    "optimizer_state": ["OptimizerStateOffload", "offload_optimizer_state"],
    "parameters": ["ParameterOffload", "offload_parameters"],
    "cpu_adam": ["CPUAdam", "isa", "set_isa_limit"],
    "cpu_adam_overlap": ["Overlap"],
    "fsdp": ["FSDPCPUAdam"],
    "fit": ["fit", "FittedPlan", "FitError", "CHOICES", "KEEP", "DRAM", "NVME", "RECOMPUTE"],
    "allocator": ["caching_allocator", "runtime"],
}


def test_package_names():
    for name in tt.__all__:
        assert getattr(tt, name) is not None, name
    assert tt.FitError.__module__ == "tiermem.torch"
    assert callable(tt.fit)  # the function, not the subpackage of the same name


@pytest.mark.parametrize("path", sorted(OLD_PATHS))
def test_old_path_has_its_names(path):
    module = importlib.import_module("tiermem.torch." + path)
    for name in OLD_PATHS[path]:
        assert hasattr(module, name), "tiermem.torch.%s.%s" % (path, name)
    for name in set(OLD_PATHS[path]) & set(tt.__all__):
        assert getattr(module, name) is getattr(tt, name), name
