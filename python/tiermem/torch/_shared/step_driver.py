"""The bucketed optimizer step, one driver per optimizer, shared by optimizer-state offload
(optim) and parameter offload (params)."""

import weakref

import torch

import tiermem

from .tensors import _eager


def _chunks(optimizer, bucket_bytes):
    """(group, params) pieces of at most bucket_bytes of parameters (one parameter at least)."""
    for group in optimizer.param_groups:
        piece, size = [], 0
        for p in group["params"]:
            n = p.numel() * p.element_size()
            if piece and size + n > bucket_bytes:
                yield group, piece
                piece, size = [], 0
            piece.append(p)
            size += n
        if piece:
            yield group, piece


def _all_params(optimizer):
    return [p for group in optimizer.param_groups for p in group["params"]]


def _ranges(marks):
    """"0-14, 20" of the True positions."""
    ranges, i = [], 0
    while i < len(marks):
        if marks[i]:
            j = i
            while j + 1 < len(marks) and marks[j + 1]:
                j += 1
            ranges.append(str(i) if i == j else "%d-%d" % (i, j))
            i = j + 1
        else:
            i += 1
    return ", ".join(ranges)


def _which_stepped(optimizer, stepped, failing=()):
    """Which of the optimizer's parameters (by their index in its param_groups, in order) a step
    that failed part way updated, as ranges: "parameters 0-14 of 24 updated, the others not";
    failing: those of the bucket whose own optimizer step raised, which it may have updated in
    part (torch's step goes parameter by parameter)."""
    done = {id(p) for p in stepped}
    params = _all_params(optimizer)
    marks = [id(p) in done for p in params]
    partly = {id(p) for p in failing}
    maybe = [id(p) in partly for p in params]
    tail = ("; %s %s (the bucket being stepped when the optimizer raised) may be updated in part"
            % ("parameter" if sum(maybe) == 1 else "parameters", _ranges(maybe))
            if any(maybe) else "")
    if not any(marks):
        return ("the step is taken in part: no bucket's update finished%s%s" % (
            tail, "" if all(maybe) else "; the others are untouched"))
    if all(marks):
        # It failed after the last bucket's update (sending its state back): the step is
        # whole, and a step() again would update every parameter twice.
        return ("the step was taken whole: all %d parameters updated, so do not repeat it; the "
                "state is as the step left it, what could not go back to tiermem in torch "
                "memory" % len(params))
    one = sum(marks) == 1
    return ("the step is taken in part: %s %s of %d (their index in param_groups, in order) "
            "updated, the others not%s; the state of %s is as the step left it" % (
                "parameter" if one else "parameters", _ranges(marks), len(params), tail,
                "that one" if one else "those updated"))


# optimizer -> a weak reference to its _StepDriver: the driver's offloads hold the optimizer, so
# a strong value kept every key alive (and the offloads' runtime); the optimizer keeps its
# driver through the hooks it holds.
_drivers = weakref.WeakKeyDictionary()


def _driver_of(optimizer):
    ref = _drivers.get(optimizer)
    return None if ref is None else ref()


class _StepDriver:
    """One per optimizer, shared by its state and parameter offloads: the bucketed step, and
    torch's optimizer hooks that keep the optimizer's own step(), state_dict() and
    load_state_dict() correct. Removed, hooks and all, when neither offload uses it."""

    def __init__(self, optimizer, bucket_bytes):
        if not hasattr(optimizer, "register_load_state_dict_post_hook"):
            raise TypeError("%s is not a torch.optim.Optimizer with torch's optimizer hooks "
                            "(torch 2.1 and later; this is torch %s): tiermem steps it through "
                            "them" % (type(optimizer).__name__, torch.__version__))
        self._optimizer = weakref.ref(optimizer)
        self.bucket_bytes = bucket_bytes
        self.state = None  # OptimizerStateOffload
        self.params = None  # ParameterOffload
        self._bucketing = False  # the bucketed step is calling optimizer.step() per bucket
        self._held = None  # what the step pre-hook brought in, until the post-hook
        self._state_dict_held = None
        # Eager under torch.compile (a compiled function calling opt.step()): dynamo traced into
        # them and failed on the offloaded tensors they bring in.
        step_pre = optimizer.register_step_pre_hook(_eager(self._before_step))
        self._step_post = optimizer.register_step_post_hook(_eager(self._after_step))
        self._hooks = [
            step_pre, self._step_post,
            optimizer.register_state_dict_pre_hook(self._before_state_dict, prepend=True),
            optimizer.register_state_dict_post_hook(self._after_state_dict, prepend=True),
            optimizer.register_load_state_dict_pre_hook(self._before_load, prepend=True),
            optimizer.register_load_state_dict_post_hook(self._after_load),
        ]
        # The step pre-hook first, so that pre-hooks of the caller's own find the state in
        # (register_step_pre_hook has no prepend; torch runs the hooks in their dict's order).
        pre_hooks = getattr(optimizer, "_optimizer_step_pre_hooks", None)
        if pre_hooks is not None and hasattr(pre_hooks, "move_to_end"):
            pre_hooks.move_to_end(step_pre.id, last=False)

    @staticmethod
    def _of(optimizer, bucket_bytes):
        from .. import OptimizerStateOffload  # here: optim's module imports this one
        if isinstance(optimizer, OptimizerStateOffload):
            optimizer = optimizer.optimizer  # the wrapper handed on as the optimizer
        driver = _driver_of(optimizer)
        if driver is None:
            driver = _StepDriver(optimizer, bucket_bytes)
            _drivers[optimizer] = weakref.ref(driver)
        else:  # shared by both offloads: the smaller bucket, the bound one of them asked for
            driver.bucket_bytes = min(driver.bucket_bytes, bucket_bytes)
        return driver

    @staticmethod
    def _existing(optimizer):
        """The optimizer's driver, or None when it has none."""
        from .. import OptimizerStateOffload  # here: optim's module imports this one
        if isinstance(optimizer, OptimizerStateOffload):
            optimizer = optimizer.optimizer
        return _driver_of(optimizer)

    def _detach_if_unused(self):
        if self.state is None and self.params is None:
            for h in self._hooks:
                h.remove()
            self._hooks = []
            opt = self._optimizer()
            if opt is not None and _driver_of(opt) is self:
                del _drivers[opt]

    def _swapped(self, ps):
        out = []
        for p in ps:
            if self.params is not None and id(p) in self.params.records:
                out.append(("param", self.params.records[id(p)]))
            if self.state is not None:
                out.extend(("state", s) for s in self.state.records.get(id(p), {}).values())
        return out

    def _bring_in(self, swapped):
        """Brings each in (parameters held); on a failure lets go of those brought in and
        raises."""
        done = []
        try:
            for kind, s in swapped:
                if kind == "param":
                    self.params._hold(s)
                else:
                    s.bring_in()
                done.append((kind, s))
        except BaseException:
            self._let_go_quietly(done)
            raise

    def _let_go(self, swapped, dirty=True):
        for kind, s in swapped:
            if kind == "param":
                self.params._unhold(s, dirty=dirty)
            else:
                s.let_go(dirty=dirty)

    def _let_go_quietly(self, swapped):
        """After a failure: lets go of what it can (written back: it may have changed), so that
        the first error is the one raised."""
        for item in swapped:
            try:
                self._let_go([item])
            except Exception:
                pass

    # --- the bucketed step (OptimizerStateOffload.step, ParameterOffload.step) ----------------
    def _check_open(self):
        """Raises (TiermemError) when a runtime holding tensors of this optimizer was closed:
        before the step changes anything, so that it is not half taken."""
        for offload in (self.state, self.params):
            if offload is not None:
                offload.runtime._handle()

    def step(self, closure=None):
        opt = self._optimizer()
        self._check_open()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._held is not None:  # a step of the optimizer's own raised before its post-hook
            held, self._held = self._held, None
            self._let_go(held)
        pieces = list(_chunks(opt, self.bucket_bytes))
        groups = opt.param_groups
        every_group = list(groups)
        swapped = [self._swapped(ps) for _, ps in pieces]
        for _, s in swapped[0] if swapped else ():
            s.prefetch()
        self._bucketing = True
        stepped = []  # the parameters whose update this step made, bucket by bucket
        failing = ()  # the bucket whose optimizer step raised
        try:
            for i, (group, ps) in enumerate(pieces):
                if i + 1 < len(pieces):
                    for _, s in swapped[i + 1]:
                        s.prefetch()  # NVMe -> DRAM while this bucket updates
                self._bring_in(swapped[i])
                all_params = group["params"]
                try:
                    # The optimizer's own step (through whatever wraps it: an LR scheduler's
                    # counter) on this bucket alone: its groups narrowed in place, not replaced.
                    group["params"] = ps
                    groups[:] = [group]
                    opt.step()
                except BaseException:
                    failing = ps
                    self._let_go_quietly(swapped[i])
                    raise
                finally:
                    group["params"] = all_params
                    groups[:] = every_group
                stepped.extend(ps)
                if self.state is not None:
                    self.state._adopt(ps)
                self._let_go(swapped[i])
        except tiermem.TiermemError as e:
            if not stepped and not failing:
                raise
            raise tiermem.TiermemError(e.status, "%s (%s)" % (
                e.message, _which_stepped(opt, stepped, failing)), e.call) from e
        except BaseException as e:
            # Anything else (the optimizer's own error, a KeyboardInterrupt) says it in a note,
            # as tracebacks show them: a step repeated would update those parameters twice.
            if (stepped or failing) and hasattr(e, "add_note"):  # Python 3.11 and later
                e.add_note("tiermem: %s" % _which_stepped(opt, stepped, failing))
            raise
        finally:
            self._bucketing = False
        return loss

    # --- hooks on the optimizer: its own step(), state_dict(), load_state_dict() --------------
    def _before_step(self, optimizer, args, kwargs):
        """optimizer.step() called on the optimizer itself: every offloaded state tensor and
        parameter of it in (not bucketed: all at once), sent back by the post-hook."""
        if self._bucketing or self._held is not None:
            return None
        self._check_open()
        # Our post-hook last, so that post-hooks of the caller's own (registered since) run
        # while the state is in.
        post_hooks = getattr(optimizer, "_optimizer_step_post_hooks", None)
        if post_hooks is not None and hasattr(post_hooks, "move_to_end"):
            post_hooks.move_to_end(self._step_post.id)
        swapped = self._swapped(_all_params(optimizer))
        for _, s in swapped:
            s.prefetch()  # NVMe -> DRAM for all of them first, then one by one in
        self._bring_in(swapped)
        self._held = swapped
        return None

    def _after_step(self, optimizer, args, kwargs):
        if self._bucketing or self._held is None:
            return
        held, self._held = self._held, None
        if self.state is not None:
            self.state._adopt(_all_params(optimizer))  # state the step created (the first)
        self._let_go(held)

    def _before_state_dict(self, optimizer):
        if self.state is None or self._state_dict_held is not None:
            return
        held = [s for per_param in self.state.records.values() for s in per_param.values()]
        done = []
        try:
            for s in held:
                s.bring_in()
                done.append(s)
        except BaseException:
            for s in done:
                s.let_go()
            raise
        self._state_dict_held = held

    def _after_state_dict(self, optimizer, state_dict):
        """The offloaded tensors copied into the state_dict (theirs are freed again), each
        parameter's state a dict of its own; the rest as torch gives it."""
        held, self._state_dict_held = self._state_dict_held, None
        if held is None:
            return None
        try:
            ours = {id(s.tensor) for s in held}
            state_dict["state"] = {
                k: {n: (v.clone() if torch.is_tensor(v) and id(v) in ours else v)
                    for n, v in st.items()}
                for k, st in state_dict["state"].items()}
        finally:
            for s in held:
                s.let_go()
        return state_dict

    def _before_load(self, optimizer, state_dict):
        """The state back in ordinary tensors: a load that fails keeps it whole."""
        if self.state is not None:
            self.state._release_all()
        return None

    def _after_load(self, optimizer):
        if self.state is not None:
            self.state._adopt(_all_params(optimizer))  # the loaded state, offloaded again
