"""AdamW's hyperparameter checks, its parameter-group keys and the error of a closed optimizer,
shared by CPUAdam (optim) and FSDPCPUAdam (fsdp)."""

import torch

import tiermem
from tiermem import _capi


def _adamw_defaults(adamw=True):
    """torch.optim.AdamW's parameter-group keys in this torch, with its defaults: DCP loads a
    checkpoint only when it holds every key of the loading optimizer's state_dict, so our groups
    carry all of AdamW's (differentiable, fused, ...) for its checkpoints and ours to load into
    each other. adamw=False: Adam's decoupled_weight_decay (torch 2.6+), off."""
    defaults = dict(torch.optim.AdamW([torch.zeros(0, requires_grad=True)]).defaults)
    if "decoupled_weight_decay" in defaults:  # AdamW is Adam with it on (torch 2.6+)
        defaults["decoupled_weight_decay"] = bool(adamw)
    return defaults


def _adamw_flags(given, adamw, who):
    """torch.optim.AdamW's keyword flags given to a CPU optimizer (a configuration written for
    AdamW, passed on as it is): foreach, fused and capturable choose how torch steps and are
    carried in the groups, changing nothing here; maximize and differentiable only as False (the
    kernel minimizes, and its step is not differentiable); decoupled_weight_decay only as adamw
    says. Returns them for the groups' defaults; a TypeError for a keyword AdamW does not take."""
    known = ("foreach", "fused", "capturable", "maximize", "differentiable",
             "decoupled_weight_decay")
    for key, value in given.items():
        if key not in known:
            raise TypeError("%s got an unexpected keyword argument %r" % (who, key))
        if key in ("foreach", "fused") and value is not None and not isinstance(value, bool):
            raise TypeError("%s: %s=%r; want None, True or False" % (who, key, value))
        if key in ("capturable", "maximize", "differentiable") and not isinstance(value, bool):
            raise TypeError("%s: %s=%r; want True or False" % (who, key, value))
    for key, why in (("maximize", "it steps to minimize the loss only (negate the loss)"),
                     ("differentiable", "its step is not differentiable")):
        if given.get(key):
            raise ValueError("%s: %s=True cannot be honoured: %s" % (who, key, why))
    decoupled = given.get("decoupled_weight_decay")
    if decoupled is not None and decoupled != bool(adamw):
        raise ValueError("%s: decoupled_weight_decay=%r, but adamw=%r steps %s; give adamw=%r" % (
            who, decoupled, adamw, "AdamW (decoupled)" if adamw else "Adam (L2)",
            bool(decoupled)))
    return {k: v for k, v in given.items() if k != "decoupled_weight_decay"}


def _check_hyper(lr, betas, eps, weight_decay, amsgrad=False, max_grad_norm=None, who=None):
    """torch.optim.AdamW's checks of the hyperparameters, made when the optimizer is (the C step
    checks them again each step, as a scheduler or the user may change param_groups); and
    amsgrad (a bool: a string such as "no" would turn it on) and max_grad_norm (a positive
    number or None), naming the argument."""
    prefix = "%s: " % who if who else ""

    def number(name, v):
        # A number (a 0-dim tensor too, as AdamW takes for lr); a string is not one, even "1".
        if isinstance(v, (str, bytes)) or (torch.is_tensor(v) and v.numel() != 1):
            raise TypeError("%s%s=%r: want a number" % (prefix, name, v))
        try:
            return float(v)
        except (TypeError, ValueError):
            raise TypeError("%s%s=%r: want a number" % (prefix, name, v)) from None

    if not 0.0 <= number("lr", lr):
        raise ValueError("Invalid learning rate: %s" % (lr,))
    if not 0.0 <= number("eps", eps):
        raise ValueError("Invalid epsilon value: %s" % (eps,))
    try:
        beta1, beta2 = betas
    except (TypeError, ValueError):
        raise ValueError("Invalid betas: %r, want a pair (beta1, beta2)" % (betas,)) from None
    for i, beta in enumerate((beta1, beta2)):
        if not 0.0 <= number("betas[%d]" % i, beta) < 1.0:
            raise ValueError("Invalid beta parameter at index %d: %s" % (i, beta))
    if not 0.0 <= number("weight_decay", weight_decay):
        raise ValueError("Invalid weight_decay value: %s" % (weight_decay,))
    if not isinstance(amsgrad, bool):
        raise TypeError("%samsgrad=%r: want True or False" % (prefix, amsgrad))
    if max_grad_norm is not None and not number("max_grad_norm", max_grad_norm) > 0:
        raise ValueError("%smax_grad_norm=%r, want a positive number or None" %
                         (prefix, max_grad_norm))


def _closed_error(what):
    return tiermem.TiermemError(
        _capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
        "%s: the optimizer was closed (close() freed its state): make a new one, and load a "
        "state_dict() taken before close() into it" % what)


def _tier_word(value, what, who, optional=False):
    """A tier argument of the CPU optimizers ("dram" or "nvme", any case, as the offloads' tier=
    takes it; None too when optional), as the lower-case word."""
    if value is None and optional:
        return None
    word = value.lower() if isinstance(value, str) else value
    if word not in ("dram", "nvme"):
        raise ValueError("%s: %s=%r; want \"dram\" or \"nvme\"%s" % (
            who, what, value, " or None" if optional else ""))
    return word


def _check_threads(threads, who):
    """threads: an int from 0 (the library's choice) to 1024, refused here as a ValueError as the
    other arguments are (tm_adam_create's TiermemError named a C field)."""
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError("%s: threads=%r; want an int, 0 (the cores of the DRAM tier's NUMA node) "
                        "to 1024" % (who, threads))
    if not 0 <= threads <= 1024:
        raise ValueError("%s: threads=%d; want 0 (the cores of the DRAM tier's NUMA node) to 1024"
                         % (who, threads))
    return threads
