"""The module's state_dict() and load_state_dict() while its parameters are offloaded: out of a
unit, a parameter has no memory of its own (its placeholder's storage is freed), so state_dict()
gets a copy read from tiermem for it, and load_state_dict() brings every parameter in for the
load and lets each go after, written back when the load changed it."""

import torch

from .._shared.transfers import _fetch


def _keys(offload, prefix):
    """state_dict key -> record, tied parameters under each of their names."""
    out = {}
    for name, m in offload.module.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            record = offload.records.get(id(p)) if p is not None else None
            if record is not None:
                out[prefix + (name + "." if name else "") + pname] = record
    return out


def install(offload):
    """Hooks on offload.module; returns their handles (removed by ParameterOffload.remove). A
    copy of the module (copy.deepcopy inside gathered()) carries them: they leave it alone."""
    module = offload.module

    def after_state_dict(mod, state_dict, prefix, local_metadata):
        if mod is not module:
            return state_dict
        for key, record in _keys(offload, prefix).items():
            value = state_dict.get(key)
            if value is None or isinstance(value, torch.nn.Parameter) or record.resident:
                continue  # keep_vars gets the parameter itself; one in is its own bytes
            p = record.tensor
            copy = torch.empty(p.shape, dtype=p.dtype, device=p.device)
            _fetch(record.tm, copy, record.nbytes)
            state_dict[key] = copy
        return state_dict

    def before_load(mod, state_dict, prefix, local_metadata, *args):
        if mod is not module:
            return
        if local_metadata.get("assign_to_params_buffers"):
            # Raised before anything is loaded: the new Parameter objects would be neither
            # offloaded nor the optimizer's, so training would go on without them.
            raise RuntimeError(
                "load_state_dict(assign=True) on a module whose parameters tiermem holds "
                "(offload_parameters) would replace them with parameters that are neither "
                "offloaded nor stepped by the optimizer: load without assign=True (the values "
                "are copied into the offloaded parameters), or call the handle's remove() first")
        if offload._loading == 0:
            for s in offload.records.values():
                offload._hold(s)
        offload._loading += 1

    def after_load(mod, incompatible_keys):
        if mod is not module:
            return
        offload._loading -= 1
        if offload._loading == 0:
            for s in offload.records.values():
                offload._unhold(s)  # a loaded value changed the version: written back

    return [module._register_state_dict_hook(after_state_dict),
            module._register_load_state_dict_pre_hook(before_load, with_module=True),
            module.register_load_state_dict_post_hook(after_load)]
