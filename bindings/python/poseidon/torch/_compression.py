"""Horovod's gradient compression classes."""
import torch as _torch


class Compression:
    """Gradient compression for allreduce, as in Horovod (fp16 halves the bytes; bf16 keeps
    float32's range). The optimizer's engine exchanges float32: there the gradient is rounded
    through the compressed type before and after the exchange (see _optimizer.py)."""

    class none:  # noqa: N801 (Horovod's spelling)
        @staticmethod
        def compress(tensor):
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor

    class fp16:  # noqa: N801
        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating_point and tensor.dtype != _torch.float16:
                return tensor.to(_torch.float16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tensor.to(ctx)

    class bf16:  # noqa: N801 (Poseidon's addition, in the same style)
        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating_point and tensor.dtype != _torch.bfloat16:
                return tensor.to(_torch.bfloat16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tensor.to(ctx)
