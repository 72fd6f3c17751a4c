"""A Horovod-style PyTorch trainer over Poseidon: the only Poseidon line is the import.

    mpirun -np 4 python3 examples/python/train_torch.py [--steps 200]
        [--strategy auto|allreduce|sfb|topk]

Each rank trains on its own shard of a synthetic 10-class task; DistributedOptimizer exchanges
each parameter's gradient as soon as autograd produces it (wait-free backprop) with the
strategy the planner picks per parameter (model=... lets the Linear weights use sufficient
factors). Rank 0 prints the plan, the loss and the test accuracy.
"""
import argparse

import torch
import torch.nn.functional as F

import poseidon.torch as hvd  # was: import horovod.torch as hvd


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--density", type=float, default=0.1)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(1234)
    teacher = torch.randn(64, 10)
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(args.batch * 64, 64, generator=g)
    y = (x @ teacher).argmax(dim=1)
    x_test = torch.randn(2000, 64, generator=torch.Generator().manual_seed(99))
    y_test = (x_test @ teacher).argmax(dim=1)

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    # Scale the learning rate by the number of workers, as Horovod recommends.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), model=model,
        strategy=args.strategy, sparse=args.strategy == "topk", density=args.density)

    for step in range(args.steps):
        i = (step * args.batch) % x.shape[0]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[i:i + args.batch]), y[i:i + args.batch])
        loss.backward()
        optimizer.step()
        if step == 0 and hvd.rank() == 0:
            print(optimizer.plan(), end="")
        if (step % 50 == 0 or step == args.steps - 1):
            avg = hvd.allreduce(loss.detach(), name="loss").item()
            if hvd.rank() == 0:
                print("step %4d  loss %.4f" % (step, avg))

    with torch.no_grad():
        acc = (model(x_test).argmax(dim=1) == y_test).float().mean()
    acc = hvd.allreduce(acc).item()
    if hvd.rank() == 0:
        print("ranks %d  test accuracy %.3f" % (hvd.size(), acc))
    hvd.shutdown()


if __name__ == "__main__":
    main()
