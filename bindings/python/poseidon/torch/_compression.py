"""Horovod's gradient compression classes."""
import torch as _torch


class _Cast:
    """Compression to the floating type `wire` (subclasses set it); other dtypes pass as they
    are."""
    wire = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


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

    class fp16(_Cast):  # noqa: N801
        wire = _torch.float16

    class bf16(_Cast):  # noqa: N801 (Poseidon's addition, in the same style)
        wire = _torch.bfloat16
