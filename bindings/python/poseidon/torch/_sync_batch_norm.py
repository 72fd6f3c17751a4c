"""SyncBatchNorm: batch normalization whose statistics are those of the batch of every rank of
a process set together (Horovod's algorithm): the forward pass allgathers each rank's row
count, mean and inverse standard deviation per channel; the backward pass allreduces the
per-channel sums of dy and dy * (x - mean). Works on CPU and CUDA tensors (plain torch
arithmetic, in float64 for the statistics)."""
import torch as _torch
from torch.nn.modules.batchnorm import _BatchNorm

from poseidon.torch._collectives import allgather, allreduce
from poseidon.torch._core import Sum
from poseidon.torch._process_sets import comm_of as _comm_of, global_process_set


def _channel_view(t, channels):
    """(N, C, ...) -> (C, N * ...)"""
    return t.transpose(0, 1).reshape(channels, -1)


class _SyncBatchNormFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        channels = x.shape[1]
        xc = _channel_view(x.detach(), channels).to(_torch.float64)
        count = xc.shape[1]
        mean = xc.mean(dim=1)
        invstd = 1.0 / _torch.sqrt(xc.var(dim=1, unbiased=False) + eps)
        # One row per rank: count, mean (C), invstd (C).
        row = _torch.cat([_torch.tensor([float(count)], dtype=_torch.float64), mean, invstd])
        every = allgather(row.unsqueeze(0), process_set=process_set)
        counts = every[:, 0]
        means = every[:, 1:1 + channels]
        variances = 1.0 / every[:, 1 + channels:] ** 2 - eps
        total = counts.sum()
        gmean = (counts[:, None] * means).sum(0) / total
        gvar = (counts[:, None] * (variances + (means - gmean) ** 2)).sum(0) / total
        ginvstd = 1.0 / _torch.sqrt(gvar + eps)
        if running_mean is not None:
            unbiased = gvar * total / max(float(total) - 1.0, 1.0)
            running_mean.mul_(1.0 - momentum).add_(gmean.to(running_mean.dtype) * momentum)
            running_var.mul_(1.0 - momentum).add_(unbiased.to(running_var.dtype) * momentum)
        shape = [1, channels] + [1] * (x.dim() - 2)
        xhat = (x.detach().to(_torch.float64) - gmean.view(shape)) * ginvstd.view(shape)
        out = xhat
        if weight is not None:
            out = out * weight.detach().to(_torch.float64).view(shape)
        if bias is not None:
            out = out + bias.detach().to(_torch.float64).view(shape)
        ctx.save_for_backward(x, weight)
        ctx.stats = (gmean, ginvstd, total)
        ctx.process_set = process_set
        ctx.has_bias = bias is not None
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        gmean, ginvstd, total = ctx.stats
        channels = x.shape[1]
        shape = [1, channels] + [1] * (x.dim() - 2)
        dy64 = dy.to(_torch.float64)
        xmu = x.detach().to(_torch.float64) - gmean.view(shape)
        sum_dy = _channel_view(dy64, channels).sum(1)
        sum_dy_xmu = _channel_view(dy64 * xmu, channels).sum(1)
        # This rank's parameter gradients (the optimizer averages them over ranks).
        grad_weight = (sum_dy_xmu * ginvstd).to(weight.dtype) if weight is not None else None
        grad_bias = sum_dy.to(weight.dtype if weight is not None else dy.dtype) \
            if ctx.has_bias else None
        grad_input = None
        if ctx.needs_input_grad[0]:
            both = allreduce(_torch.cat([sum_dy, sum_dy_xmu]), op=Sum,
                             process_set=ctx.process_set)
            mean_dy = (both[:channels] / total).view(shape)
            mean_dy_xmu = (both[channels:] / total).view(shape)
            scale = ginvstd.view(shape)
            if weight is not None:
                scale = scale * weight.detach().to(_torch.float64).view(shape)
            grad_input = ((dy64 - mean_dy - xmu * ginvstd.view(shape) ** 2 * mean_dy_xmu)
                          * scale).to(x.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batch of every rank of ``process_set`` (a drop-in for
    torch.nn.BatchNorm1d/2d/3d in training; in eval mode it uses the running statistics like
    them). Input: (N, C, ...) with at least 2 dimensions."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("SyncBatchNorm: expected at least 2D input (got %dD input)"
                             % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        if not self.training and self.track_running_stats:
            return _torch.nn.functional.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, False,
                factor, self.eps)
        _comm_of(self.process_set, "SyncBatchNorm")
        running_mean = self.running_mean if self.training else None
        running_var = self.running_var if self.training else None
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                            running_var, self.eps, factor, self.process_set)
