"""Input checks shared by the problems. Every error names the argument and what was expected,
and is raised on the host before any kernel launch. Device checks come last, so
that shape and dtype mistakes are reported the same way on machines without a GPU."""
from __future__ import annotations

import torch


def require_tensor(name: str, value: object, *, dtypes: tuple[torch.dtype, ...], ndim: int) -> torch.Tensor:
    """Check that ``value`` is a non-empty tensor of one of ``dtypes`` with ``ndim`` dimensions.

    Raises:
        TypeError: not a tensor, or a dtype outside ``dtypes``.
        ValueError: wrong number of dimensions, or empty.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {allowed}, got {value.dtype}")
    if value.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(value.shape)}")
    if value.numel() == 0:
        raise ValueError(f"{name}: expected a non-empty tensor, got shape {tuple(value.shape)}")
    return value


def require_cuda(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless every one of ``tensors`` is on the same CUDA device."""
    for name, tensor in tensors.items():
        if tensor.device.type != "cuda":
            raise ValueError(f"{name}: expected a CUDA tensor, got a tensor on {tensor.device} "
                             f"(move it with .cuda())")
    devices = [t.device for t in tensors.values()]
    if any(device != devices[0] for device in devices[1:]):  # a list, not a set: torch.compile traces it
        listed = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ValueError(f"expected all inputs on one device, got {listed}")


def require_no_grad(name: str, tensor: torch.Tensor) -> None:
    """Raise ValueError if ``tensor`` requires grad: the kernels give no gradient for it."""
    if tensor.requires_grad:
        raise ValueError(f"{name}: gradients w.r.t. {name} are not supported; "
                         f"pass {name}.detach()")
