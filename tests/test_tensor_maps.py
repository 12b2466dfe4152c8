"""Tensor maps for TMA launches (tkc/runtime/tensor_maps.py), with the driver call replaced: which matrix a tensor
is read as, what is refused and why, and the cache."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tkc.errors import KernelArgumentError  # noqa: E402
from tkc.runtime import tensor_maps  # noqa: E402


def test_contiguous_leading_dimensions_fold_into_rows() -> None:
    assert tensor_maps.as_matrix((4, 16, 1024, 128), (16 * 1024 * 128, 1024 * 128, 128, 1)) == (4 * 16 * 1024, 128, 128)
    assert tensor_maps.as_matrix((300, 70), (80, 1)) == (300, 70, 80)  # a padded row pitch stays
    assert tensor_maps.as_matrix((64,), (1,)) == (1, 64, 64)


@pytest.mark.parametrize("shape, strides, message", [
    ((2, 8, 64), (1024, 64, 1), "do not collapse"),
    ((8, 64), (64, 2), "last dimension must be contiguous"),
])
def test_layouts_tma_cannot_read_are_refused(shape: tuple, strides: tuple, message: str) -> None:
    with pytest.raises(KernelArgumentError, match=message):
        tensor_maps.as_matrix(shape, strides, "q")


def test_maps_are_cached_and_alignment_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc.runtime import driver

    calls = []
    monkeypatch.setattr(driver, "tensor_map_2d", lambda *args: calls.append(args) or bytes(128))
    monkeypatch.setattr(tensor_maps, "_cache", tensor_maps.OrderedDict())
    x = torch.empty(4, 256, 64, dtype=torch.bfloat16)
    assert tensor_maps.tensor_map(x, 64, 64, 128) == bytes(128)
    tensor_maps.tensor_map(x, 64, 64, 128)
    assert len(calls) == 1 and calls[0][1:] == (4 * 256, 64, 128, 64, 64, 128, "bf16", [])
    tensor_maps.tensor_map(x, 128, 64, 128)  # another box: another map
    assert len(calls) == 2
    with pytest.raises(KernelArgumentError, match="16-byte aligned"):
        tensor_maps.tensor_map(torch.empty(64, 37, dtype=torch.bfloat16), 64, 32, 64, "a")
    # stacked: (B, H, N, D) as matrices of N × D, boxes stopping at each one's end, any outer strides (a (B, N, H, D)
    # tensor seen as (B, H, N, D))
    q = torch.empty(2, 3, 100, 64, dtype=torch.bfloat16)
    tensor_maps.tensor_map(q, 64, 64, 128, "q", stack=True)
    assert calls[-1][1:] == (100, 64, 128, 64, 64, 128, "bf16", [(3, 100 * 64 * 2), (2, 3 * 100 * 64 * 2)])
    tensor_maps.tensor_map(torch.empty(2, 100, 3, 64, dtype=torch.bfloat16).transpose(1, 2), 64, 64, 128, "q", stack=True)
    assert calls[-1][1:] == (100, 64, 3 * 64 * 2, 64, 64, 128, "bf16", [(3, 128), (2, 100 * 3 * 64 * 2)])


def test_empty_tensors_get_an_unused_map() -> None:
    """A tensor with no elements (K = 0) has nothing to copy: its map is 128 zero bytes, and no driver call."""
    import torch

    assert tensor_maps.tensor_map(torch.empty(64, 0, dtype=torch.bfloat16), 64, 64, 128) == bytes(128)


def test_what_the_driver_refuses_names_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc.runtime import driver

    def refuse(*args):
        raise driver.TkcRuntimeError("cuTensorMapEncodeTiled failed: CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(driver, "tensor_map_2d", refuse)
    monkeypatch.setattr(tensor_maps, "_cache", tensor_maps.OrderedDict())
    x = torch.empty(1, 64, dtype=torch.bfloat16).expand(128, 64)  # every row the same memory
    with pytest.raises(KernelArgumentError, match=r"argument `A`: TMA cannot read this tensor \(shape \(128, 64\), "
                                                  r"strides \(0, 1\)\).*INVALID_VALUE; make it contiguous"):
        tensor_maps.tensor_map(x, 64, 64, 128, "argument `A`")
