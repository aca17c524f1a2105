"""Train a tiny ternary MLP whose every matmul is the int8 layer step (TernaryLinear).

    python examples/train_demo.py                     # 300 steps, writes docs/train_demo.png
    python examples/train_demo.py --steps 100 --out /tmp/demo.png
    python examples/train_demo.py --backend emulator  # the step's PTX on the CPU emulator (slow)

The task is synthetic: 4-way classification of Gaussian points in 16 dimensions by a
fixed random linear teacher (label = argmax of x A). The model is TernaryLinear(16, 32)
-> ReLU -> TernaryLinear(32, 4), bias-free: per step, five products (forward, dX, dW for
the second layer; forward, dW for the first, whose input needs no gradient), on the
'cpu' backend (the kernels' integers through float BLAS) or the PTX emulator. The same model
with float matmuls on the same STE ternary weights (``kernels=False``), and the same MLP
with plain float weights, train from the same initial weights on the same batches. The
plot shows the three losses per step (faint) and their 20-step means; the script prints
wall and CPU time and held-out accuracy.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hslm_ptx import TernaryLinear  # noqa: E402

IN, HIDDEN, CLASSES, BATCH = 16, 32, 4, 32


def mlp(kernels: bool | None, backend: str = "cpu") -> torch.nn.Module:
    """The model; ``kernels`` None means plain float weights (torch.nn.Linear)."""
    def layer(k: int, n: int) -> torch.nn.Module:
        if kernels is None:
            return torch.nn.Linear(k, n, bias=False)
        return TernaryLinear(k, n, bias=False, kernels=kernels, backend=backend)

    return torch.nn.Sequential(layer(IN, HIDDEN), torch.nn.ReLU(), layer(HIDDEN, CLASSES))


def batches(steps: int, seed: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` training batches and one held-out set, labelled by a random linear teacher."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((IN, CLASSES))

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = rng.standard_normal((n, IN)).astype(np.float32)
        return torch.from_numpy(x), torch.from_numpy((x @ teacher).argmax(axis=1))

    return [draw(BATCH) for _ in range(steps)], draw(1024)


def train(model: torch.nn.Module, data: list, lr: float) -> list[float]:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for x, label in data:
        loss = torch.nn.functional.cross_entropy(model(x), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def accuracy(model: torch.nn.Module, held_out: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return float((model(held_out[0]).argmax(dim=1) == held_out[1]).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "train_demo.png")
    parser.add_argument("--backend", choices=("cpu", "emulator"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny matmuls: threads cost more than they give
    data, held_out = batches(args.steps, args.seed)
    torch.manual_seed(args.seed)
    models = {f"int8 step ({args.backend} backend)": mlp(kernels=True, backend=args.backend),
              "float matmuls, same ternary weights": mlp(kernels=False),
              "float weights": mlp(kernels=None)}
    first = next(iter(models.values())).state_dict()
    for model in models.values():
        model.load_state_dict(first)  # one initialization for all three
    curves, seconds = {}, {}
    for name, model in models.items():
        start = time.perf_counter(), time.process_time()
        curves[name] = train(model, data, args.lr)
        seconds[name] = time.perf_counter() - start[0], time.process_time() - start[1]
    kernel, reference = list(curves.values())[:2]
    for name, model in models.items():
        tail = float(np.mean(curves[name][-20:]))
        wall, cpu = seconds[name]
        print(f"{name:<36} {wall:6.1f} s wall {cpu:6.1f} s CPU  loss (last 20 steps) {tail:.4f}  "
              f"held-out accuracy {accuracy(model, held_out):.3f}")
    print(f"max |loss difference| kernels vs float matmuls over {args.steps} steps: "
          f"{np.max(np.abs(np.subtract(kernel, reference))):.4f}")
    plot(curves, args.out, args.steps)
    print(f"wrote {args.out}")


def plot(curves: dict[str, list[float]], out: Path, steps: int) -> None:
    import matplotlib  # optional: only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=90)
    window = min(20, steps)
    for (name, losses), color in zip(curves.items(), ("C0", "C1", "C2")):
        ax.plot(np.arange(1, steps + 1), losses, color=color, linewidth=0.6, alpha=0.35)
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(np.arange(window, steps + 1), smooth, color=color, linewidth=1.6,
                label=f"{name} ({window}-step mean)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.set_title(f"TernaryLinear MLP {IN}-{HIDDEN}-{CLASSES}, batch {BATCH}, Adam")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp)
    tmp.replace(out)  # never a half-written PNG


if __name__ == "__main__":
    main()
