"""AdamW's hyperparameter checks and the error of a closed optimizer, shared by CPUAdam (optim)
and FSDPCPUAdam (fsdp)."""

import tiermem
from tiermem import _capi


def _check_hyper(lr, betas, eps, weight_decay):
    """torch.optim.AdamW's checks of the hyperparameters, made when the optimizer is (the C step
    checks them again each step, as a scheduler or the user may change param_groups)."""
    def number(name, v):
        try:
            return float(v)
        except (TypeError, ValueError):
            raise TypeError("%s=%r: want a number" % (name, v)) from None

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


def _closed_error(what):
    return tiermem.TiermemError(
        _capi.STATUS_NAMES.index("TM_ERR_INVALID_HANDLE"),
        "%s: the optimizer was closed (close() freed its state): make a new one, and load a "
        "state_dict() taken before close() into it" % what)
