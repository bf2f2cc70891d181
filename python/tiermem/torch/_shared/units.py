"""The blocks a `units` policy chooses in a model: parameter offload's units, and fit's blocks."""

import torch


def _largest_module_list(module):
    best, best_size = None, 0
    for m in module.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 0:
            size = sum(p.numel() for p in m.parameters())
            if size > best_size:
                best, best_size = m, size
    return list(best) if best is not None else []


def _outermost(module, chosen):
    """The modules under module (not module itself) for which chosen(m), none inside another."""
    out = []

    def walk(m):
        for child in m.children():
            if chosen(child):
                out.append(child)
            else:
                walk(child)

    walk(module)
    return out


def _unit_modules(module, units):
    """The blocks the policy `units` chooses: None (each block of the largest ModuleList), a
    collection of module classes (their outermost instances), a callable(module) -> bool, or a
    collection of modules."""
    if units is None:
        return _largest_module_list(module)
    if isinstance(units, torch.nn.ModuleList):
        units = list(units)  # its blocks (a module is callable, but not a policy)
    elif isinstance(units, torch.nn.Module):
        raise TypeError("units: expected None, module classes, modules or a callable(module), "
                        "got a %s: give [module] for it as one unit" % type(units).__name__)
    if callable(units) and not isinstance(units, type):
        return _outermost(module, units)
    if isinstance(units, type):
        units = [units]
    elif isinstance(units, (str, bytes)) or not hasattr(units, "__iter__"):
        raise TypeError("units: expected None, module classes, modules or a callable(module), "
                        "got %s" % type(units).__name__)
    units = list(units)
    if all(isinstance(u, type) for u in units):
        classes = tuple(units)
        return _outermost(module, lambda m: isinstance(m, classes))
    if all(isinstance(u, torch.nn.Module) for u in units):
        inside = {id(m) for m in module.modules()}
        for u in units:
            if id(u) not in inside or u is module:
                raise ValueError("units: %s is not a submodule of the offloaded module" %
                                 type(u).__name__)
        return units
    raise TypeError("units: expected None, module classes, modules or a callable(module), "
                    "got a collection of %s" % ", ".join(sorted({type(u).__name__
                                                                 for u in units})))
