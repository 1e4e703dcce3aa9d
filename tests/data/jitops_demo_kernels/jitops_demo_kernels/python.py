"""Python side of demo_kernels: reference and fake kernel."""

import torch


def axpy_reference(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return x + alpha * y


REFERENCES = {"demo_axpy": axpy_reference}


def register(ns: str) -> None:
    def fake(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
        torch._check(
            x.shape == y.shape,
            lambda: f"demo_axpy: shapes differ, {tuple(x.shape)} vs {tuple(y.shape)}",
        )
        return x.new_empty(x.shape)

    torch.library.register_fake(f"{ns}::demo_axpy", fake)
