"""poseidon.torch.DistributedOptimizer under mpirun against a torch.distributed gloo reference
that implements Horovod's optimizer semantics exactly: every case trains a tiny model for
STEPS steps both ways and the parameters must agree to within TOL (max abs difference) on every
rank. One line per case on rank 0; exit code 0 only when every rank passed every case."""
import socket
import sys
import time
import warnings

try:
    import torch
except ImportError:  # no PyTorch here: skipped (ctest SKIP_RETURN_CODE 77)
    print("hvd_optimizer_test: torch is not importable; skipped")
    sys.exit(77)

import torch.distributed as dist
import torch.nn.functional as F

import poseidon
import poseidon.torch as hvd
from poseidon.torch._optimizer import _join_optimizers  # hvd.join's work for the optimizers

STEPS = 20
BATCH = 8
TOL = 1e-6
AFTER_JOIN = 2
IN, HID, OUT = 6, 8, 3


class Net(torch.nn.Module):
    """fc1 -> relu -> fc2 (optionally twice) -> head, plus an optional extra head and an aux
    head whose output may be left out of the loss."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HID)
        self.fc2 = torch.nn.Linear(HID, HID)
        self.head = torch.nn.Linear(HID, OUT)
        self.extra = torch.nn.Linear(HID, OUT)
        self.aux = torch.nn.Linear(HID, OUT)

    def forward(self, x, twice=False, extra=False, aux=False, aux_in_loss=False):
        h = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        if twice:
            h = torch.relu(self.fc2(h))
        out = self.head(h)
        if extra:
            out = out + self.extra(h)
        if aux:
            a = self.aux(h)  # computed; in the loss only when aux_in_loss
            if aux_in_loss:
                out = out + a
        return out


def batch(rank, step, rep, n=BATCH):
    g = torch.Generator().manual_seed(100000 * rank + 100 * step + rep + 1)
    return torch.randn(n, IN, generator=g), torch.randint(0, OUT, (n,), generator=g)


class Case:
    def __init__(self, name, opt="sgd", op=hvd.Average, passes=1, predivide=1.0,
                 compression=hvd.Compression.none, sfb=False, clip=False, sync_then_step=False,
                 frozen=False, twice=False, extra=None, aux=None, batch_of=None, lr=0.05,
                 bcast_state=False, join=False, set_passes=False):
        self.name, self.opt, self.op, self.passes = name, opt, op, passes
        self.predivide, self.compression, self.sfb = predivide, compression, sfb
        self.clip, self.sync_then_step, self.frozen, self.twice = clip, sync_then_step, frozen, \
            twice
        self.extra = extra or (lambda rank, step: False)
        self.aux = aux  # None: no aux head; else (rank, step) -> aux output in the loss
        self.batch_of = batch_of or (lambda step: BATCH)
        self.lr, self.bcast_state, self.join = lr, bcast_state, join
        self.set_passes = set_passes  # construct with 1 pass, then set_backward_passes_per_step


def make(case, rank, lr_scale=1.0):
    torch.manual_seed(7)
    model = Net()
    if case.frozen:
        model.fc1.weight.requires_grad_(False)
    if case.opt == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * lr_scale)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=case.lr * lr_scale, momentum=0.9,
                              weight_decay=1e-3)
    return model, opt


def local_pre_step(model, opt, rank):
    """A rank-local step (different per rank) so that broadcasting params and state matters."""
    x, y = batch(rank, 999, 0)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def forward_loss(case, model, rank, step, rep):
    x, y = batch(rank, step, rep, case.batch_of(step))
    out = model(x, twice=case.twice, extra=case.extra(rank, step), aux=case.aux is not None,
                aux_in_loss=case.aux is not None and case.aux(rank, step))
    return F.cross_entropy(out, y)


def round_to(t, compression):
    if compression is hvd.Compression.fp16:
        t.copy_(t.half().float())
    elif compression is hvd.Compression.bf16:
        t.copy_(t.bfloat16().float())


def reference_exchange(case, params, size):
    """Horovod's DistributedOptimizer on the gradients: zeros for a missing gradient, compress,
    prescale 1/f, sum, postscale f/size (Average), decompress."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = p.grad
        round_to(g, case.compression)
        if case.op == hvd.Average and case.predivide != 1.0:
            g.mul_(1.0 / case.predivide)
        dist.all_reduce(g)
        if case.op == hvd.Average:
            g.mul_(case.predivide / size)
        round_to(g, case.compression)


def train(case, rank, size, poseidon_side):
    model, opt = make(case, rank, lr_scale=(1.0 + rank) if poseidon_side else 1.0)
    if case.bcast_state:
        local_pre_step(model, opt, rank if poseidon_side else 0)
    if poseidon_side:
        state = opt.state_dict()
        kw = {}
        if case.sfb:
            kw = dict(model=model, strategy={n: "sfb" for n, p in model.named_parameters()
                                             if n.endswith("weight") and p.requires_grad})
        opt = hvd.DistributedOptimizer(
            opt, named_parameters=model.named_parameters(), compression=case.compression,
            backward_passes_per_step=1 if case.set_passes else case.passes, op=case.op,
            gradient_predivide_factor=case.predivide, **kw)
        if case.set_passes:
            opt.set_backward_passes_per_step(case.passes)
        # As in Horovod, wrapping starts a fresh state: the rank's own state goes back in, then
        # rank 0's parameters, hyperparameters (lr differs per rank) and state replace it.
        if case.bcast_state:
            opt.load_state_dict(state)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    elif not opt.state_dict()["state"]:
        # broadcast_optimizer_state on an optimizer without state first steps it with zero
        # gradients (Horovod's way to create every state entry: SGD's momentum becomes
        # weight_decay * p, Adam counts one step), then puts the parameters back.
        saved = [p.detach().clone() for p in model.parameters()]
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        opt.step()
        with torch.no_grad():
            for p, value in zip(model.parameters(), saved):
                p.copy_(value)
                p.grad = None
    params = [p for p in model.parameters() if p.requires_grad]
    problems = []
    # join: rank r runs out of data after STEPS - 3 r steps and joins (Poseidon) or sends zeros
    # without stepping (the reference); then every rank trains AFTER_JOIN more steps.
    mine = STEPS - 3 * rank if case.join else STEPS
    for step in range(STEPS + (AFTER_JOIN if case.join else 0)):
        if poseidon_side and case.join and step == mine:
            last = _join_optimizers()
            if last != 0:
                problems.append("join returned %r; expected 0 (the last to join)" % (last,))
        if mine <= step < STEPS:
            if not poseidon_side:
                opt.zero_grad()
                for p in params:
                    p.grad = torch.zeros_like(p)
                reference_exchange(case, params, size)
            continue
        opt.zero_grad()
        for rep in range(case.passes):
            forward_loss(case, model, rank, step, rep).backward()
            if poseidon_side and step == 0 and rep + 1 < case.passes:
                try:
                    opt.zero_grad()
                    problems.append("zero_grad() between backward passes did not raise")
                except AssertionError:
                    pass
        if not poseidon_side:
            reference_exchange(case, params, size)
            if case.clip:
                torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
        elif case.clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            with opt.skip_synchronize():
                opt.step()
        elif case.sync_then_step:
            opt.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                opt.step()
            if not any("skip_synchronize" in str(w.message) for w in caught):
                problems.append("step() after synchronize() did not warn")
        else:
            opt.step()
    if poseidon_side and case.sfb:
        chosen = opt.strategies()
        want = {n for n, p in model.named_parameters() if n.endswith("weight") and p.requires_grad}
        if any(chosen[n] != "sfb" for n in want):
            problems.append("sfb was not used: %s" % chosen)
    return model, problems


def max_diff(a, b):
    return max((pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters()))


def cases():
    def some_ranks(rank, step):  # some ranks use it, others not; step % 5 == 0: nobody
        return (rank + step) % 2 == 0 and step % 5 != 0

    def aux_in_loss(rank, step):  # only rank 0, one step in three
        return rank == 0 and step % 3 == 0

    return [
        Case("plain_sgd"),
        Case("op_sum", op=hvd.Sum, lr=0.02),
        Case("adam_bcast_state", opt="adam", bcast_state=True),
        Case("passes_2", passes=2),
        Case("set_passes_3", passes=3, set_passes=True),
        Case("unused_some_ranks", extra=some_ranks, aux=aux_in_loss),
        Case("clip_skip_synchronize", clip=True, lr=0.2),
        Case("sync_then_step_sum", op=hvd.Sum, sync_then_step=True, lr=0.02),
        Case("frozen", frozen=True),
        Case("fp16", compression=hvd.Compression.fp16),
        Case("bf16", compression=hvd.Compression.bf16),
        Case("predivide_3", predivide=3.0),
        Case("sfb_plain", sfb=True),
        Case("sfb_twice", sfb=True, twice=True),
        Case("sfb_not_run", sfb=True, extra=some_ranks),
        Case("sfb_not_in_loss", sfb=True, aux=aux_in_loss),
        Case("sfb_passes_2", sfb=True, passes=2, twice=True),
        Case("sfb_batch_grows", sfb=True, batch_of=lambda step: BATCH + 4 * (step % 2)),
        Case("sfb_sum", sfb=True, op=hvd.Sum, lr=0.02),
        Case("sfb_predivide_3", sfb=True, predivide=3.0),
        Case("join_uneven", join=True, extra=some_ranks),
        Case("join_sfb_passes_2", join=True, sfb=True, passes=2),
    ]


def construction_errors():
    """Refused at construction, on every rank alike (no exchange starts)."""
    problems = []
    model = Net()
    for kw, what in ((dict(op=hvd.Adasum), "Adasum"),
                     (dict(op=hvd.Sum, gradient_predivide_factor=2.0), "predivide with Sum"),
                     (dict(process_set=object()), "a process set other than the global one"),
                     (dict(backward_passes_per_step=0), "backward_passes_per_step 0")):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(), **kw)
            problems.append("%s was accepted" % what)
        except (ValueError, NotImplementedError, RuntimeError):
            pass
    return problems


def terms_differ(rank, size):
    """An optimizer whose op differs on the last rank only (there it would sum, elsewhere
    average: the replicas would diverge) fails the first step on every rank with MismatchError
    naming both ops."""
    torch.manual_seed(7)
    model = Net()
    odd = rank == size - 1
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   op=hvd.Sum if odd else hvd.Average)
    x, y = batch(rank, 0, 0)
    try:
        F.cross_entropy(model(x), y).backward()
        opt.step()
        return ["an op that differs on rank %d was accepted" % (size - 1)]
    except poseidon.MismatchError as e:
        msg = str(e)
        if "op sum" not in msg or "op average" not in msg:
            return ["the mismatch does not name both ops: %s" % msg]
    return []


def report(rank, name, problems, what):
    """Prints this rank's problems of a check and, on rank 0, its line; 1 when any rank had
    one (collective)."""
    for p in problems:
        print("rank %d: %s: FAIL %s" % (rank, name, p), file=sys.stderr)
    bad = hvd.allreduce(torch.tensor([float(len(problems))]), op=hvd.Sum).item()
    if rank == 0:
        print("%-24s %s  %s" % (name, "ok  " if bad == 0 else "FAIL", what))
    return int(bad > 0)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    port = hvd.broadcast_object(free_port() if rank == 0 else None, 0)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    failures = 0
    only = set(sys.argv[1:])
    for case in cases():
        if only and case.name not in only:
            continue
        t0 = time.time()
        problems = []
        try:
            ref, _ = train(case, rank, size, poseidon_side=False)
            got, problems = train(case, rank, size, poseidon_side=True)
            d = max_diff(got, ref)
            if not d <= TOL:
                problems.append("parameters differ from the reference by %.3g" % d)
            flat = torch.cat([p.detach().reshape(-1) for p in got.parameters()])
            # (After a join the ranks differ: a joined rank does not step, as in Horovod.)
            if not case.join and not torch.equal(hvd.broadcast(flat, 0), flat):
                problems.append("ranks hold different parameters")
        except Exception as e:  # noqa: BLE001 (reported, then the job fails)
            d = float("nan")
            problems.append("%s: %s" % (type(e).__name__, e))
            for p in problems:
                print("rank %d: %s: FAIL %s" % (rank, case.name, p), file=sys.stderr)
            raise
        worst = hvd.allgather(torch.tensor([d])).max().item()
        bad = hvd.allreduce(torch.tensor([float(len(problems))]), op=hvd.Sum).item()
        for p in problems:
            print("rank %d: %s: FAIL %s" % (rank, case.name, p), file=sys.stderr)
        failures += int(bad > 0)
        if rank == 0:
            print("%-24s %s  max |param - reference| = %.3g  (%.1f s)"
                  % (case.name, "ok  " if bad == 0 else "FAIL", worst, time.time() - t0),
                  flush=True)
    failures += report(rank, "construction_errors", construction_errors(),
                       "Adasum, predivide with Sum, other process sets, 0 passes refused")
    failures += report(rank, "terms_differ", terms_differ(rank, size) if size > 1 else [],
                       "an op that differs on one rank fails every rank, naming both")
    dist.destroy_process_group()
    if rank == 0:
        print("hvd_optimizer_test: %s" % ("PASSED" if failures == 0 else "FAILED"))
    hvd.shutdown()
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
