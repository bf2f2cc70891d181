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
