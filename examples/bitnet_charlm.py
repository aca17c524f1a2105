"""Train a small character-level LM on Python's own standard library sources, four ways.

    python examples/bitnet_charlm.py                 # writes docs/bitnet_charlm.png and .md
    python examples/bitnet_charlm.py --steps 50 --out /tmp/charlm   # a quick look

The text is the ``.py`` files of the running Python's standard library (every interpreter
ships them), read as bytes: a 256-symbol vocabulary, the last tenth held out. The model is
a small GPT (pre-norm blocks of causal self-attention and a ReLU MLP, an embedding and a
float LM head). Its linear layers in the blocks are, from one initialization:

1. ``nn.Linear``: full precision, the baseline;
2. Figure 3's BitLinear, as published (the code below marked FIGURE 3), with the block
   pre-norms removed as the paper's FAQ says (each BitLinear has its own RMSNorm);
3. ``hslm_ptx.nn.bitlinear.BitLinear``: the same layer on the int8 step, made by
   ``ternarize_model(model, norm=True)``, pre-norms removed likewise;
4. ``hslm_ptx.TernaryLinear``: a plain swap (``ternarize_model(model)``), pre-norms kept.

Each trains on the same batches with AdamW. The script writes a loss-curve PNG and a
Markdown table of the final training and validation losses and the CPU time per step
(``time.process_time``, one torch thread), both atomically.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hslm_ptx.nn.convert import ternarize_model  # noqa: E402

VOCAB = 256


# ---- FIGURE 3: BitLinear as printed in "The Era of 1-bit LLMs: Training Tips, Code and FAQ" ----
# (Microsoft, 2024). The two quantizers and the forward are the paper's code; the paper
# leaves RMSNorm's form open, so it is torch.nn.RMSNorm with a learnable gain here.

def activation_quant(x: torch.Tensor) -> torch.Tensor:
    """FIGURE 3: per-token quantization to 8 bits (absmax, clamped at 1e-5)."""
    scale = 127.0 / x.abs().max(dim=-1, keepdim=True).values.clamp_(min=1e-5)
    return (x * scale).round().clamp_(-128, 127) / scale


def weight_quant(w: torch.Tensor) -> torch.Tensor:
    """FIGURE 3: per-tensor quantization to 1.58 bits (mean|W|, clamped at 1e-5)."""
    scale = 1.0 / w.abs().mean().clamp_(min=1e-5)
    return (w * scale).round().clamp_(-1, 1) / scale


def figure3_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """FIGURE 3's product with both straight-through estimators (``x`` already normalized)."""
    x_quant = x + (activation_quant(x) - x).detach()
    w_quant = w + (weight_quant(w) - w).detach()
    return F.linear(x_quant, w_quant, bias)


class Figure3BitLinear(torch.nn.Linear):
    """FIGURE 3: ``nn.Linear`` whose forward is RMSNorm, then the quantized product."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, norm_eps: float = 1e-6) -> None:
        super().__init__(in_features, out_features, bias)
        self.rms_norm = torch.nn.RMSNorm(in_features, eps=norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return figure3_linear(self.rms_norm(x), self.weight, self.bias)
# ---- end of FIGURE 3 -------------------------------------------------------------------------


class Figure3Product(torch.nn.Linear):
    """FIGURE 3's quantized product without its RMSNorm: what a plain TernaryLinear
    computes, and torchao's / Hugging Face's online BitLinear layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return figure3_linear(x, self.weight, self.bias)


class Block(torch.nn.Module):
    """A pre-norm transformer block; its four linear layers are what the variants swap."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(width), torch.nn.RMSNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.proj = torch.nn.Linear(width, width, bias=False)
        self.up = torch.nn.Linear(width, 4 * width, bias=False)
        self.down = torch.nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.relu(self.up(self.norm2(x))))


class CharLM(torch.nn.Module):
    def __init__(self, width: int, blocks: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.position = torch.nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(blocks))
        self.norm = torch.nn.RMSNorm(width)
        self.lm_head = torch.nn.Linear(width, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def without_block_prenorms(model: CharLM) -> CharLM:
    """The FAQ's change for BitLinear models: each BitLinear normalizes its own input."""
    for block in model.blocks:
        block.norm1, block.norm2 = torch.nn.Identity(), torch.nn.Identity()
    return model


def with_figure3(model: CharLM) -> CharLM:
    """Every linear layer of the blocks becomes FIGURE 3's BitLinear, same weights."""
    for block in model.blocks:
        for name in ("qkv", "proj", "up", "down"):
            linear = getattr(block, name)
            layer = Figure3BitLinear(linear.in_features, linear.out_features)
            layer.weight = linear.weight
            setattr(block, name, layer)
    return without_block_prenorms(model)


def variants(base: CharLM) -> dict[str, CharLM]:
    ours = without_block_prenorms(copy.deepcopy(base))
    ternarize_model(ours, norm=True)
    plain = copy.deepcopy(base)
    ternarize_model(plain)
    return {"nn.Linear (float)": base, "Figure 3 BitLinear (paper's code)": with_figure3(copy.deepcopy(base)),
            "BitLinear (int8 step, norm=True)": ours, "TernaryLinear (plain swap)": plain}


def stdlib_text() -> bytes:
    """The standard library's top-level ``.py`` sources, in name order."""
    home = Path(os.__file__).parent
    return b"\n".join(path.read_bytes() for path in sorted(home.glob("*.py")))


def batches(data: np.ndarray, steps: int, batch: int, context: int, seed: int) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data) - context - 1, (steps, batch))
    return [torch.from_numpy(np.stack([data[s: s + context + 1] for s in row]).astype(np.int64)) for row in starts]


def loss_of(model: torch.nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    logits = model(chunk[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), chunk[:, 1:].reshape(-1))


def train(model: torch.nn.Module, data: list[torch.Tensor], held_out: list[torch.Tensor],
          lr: float) -> tuple[list[float], float, float]:
    """(training losses per step, validation loss after training, CPU seconds per step)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    start = time.process_time()
    for chunk in data:
        loss = loss_of(model, chunk)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    per_step = (time.process_time() - start) / len(data)
    with torch.no_grad():
        validation = float(np.mean([loss_of(model, chunk).item() for chunk in held_out]))
    return losses, validation, per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=96)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bitnet_charlm",
                        help="writes OUT.png and OUT.md")
    args = parser.parse_args()
    started = time.perf_counter(), time.process_time()
    torch.set_num_threads(1)
    text = np.frombuffer(stdlib_text(), dtype=np.uint8)
    split = len(text) * 9 // 10
    data = batches(text[:split], args.steps, args.batch, args.context, args.seed)
    held_out = batches(text[split:], 8, args.batch, args.context, args.seed + 1)
    torch.manual_seed(args.seed)
    models = variants(CharLM(args.width, args.blocks, heads=4, context=args.context))
    results = {}
    for name, model in models.items():
        results[name] = train(model, data, held_out, args.lr)
        losses, validation, per_step = results[name]
        print(f"{name:<36} train loss (last 20) {np.mean(losses[-20:]):.4f}  validation {validation:.4f}  "
              f"{per_step * 1e3:7.1f} ms CPU / step", flush=True)
    setting = (f"{len(text):,} bytes of stdlib source, {args.steps} steps, batch {args.batch} x "
               f"{args.context}, width {args.width}, {args.blocks} blocks, AdamW lr {args.lr}, seed {args.seed}")
    whole = f"{time.process_time() - started[1]:.0f} s CPU, {time.perf_counter() - started[0]:.0f} s wall"
    write_table(results, args.out.with_suffix(".md"), f"{setting}; the whole run (four trainings) took {whole}")
    plot(results, args.out.with_suffix(".png"), setting)
    print(whole)
    print(f"wrote {args.out.with_suffix('.png')} and {args.out.with_suffix('.md')}")


def atomic_write(path: Path, write: object) -> None:
    """Write through a temporary file and a rename, so no reader sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)  # type: ignore[operator]
    tmp.replace(path)


def write_table(results: dict, out: Path, setting: str) -> None:
    baseline = results["nn.Linear (float)"][2]
    rows = ["| layers | train loss (last 20 steps) | validation loss | CPU ms / step | vs nn.Linear |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for name, (losses, validation, per_step) in results.items():
        rows.append(f"| {name} | {np.mean(losses[-20:]):.4f} | {validation:.4f} | {per_step * 1e3:.1f} | "
                    f"{per_step / baseline:.2f}x |")
    text = (f"<!-- written by examples/bitnet_charlm.py -->\n{setting} (one torch thread).\n\n"
            + "\n".join(rows) + "\n")
    atomic_write(out, lambda tmp: tmp.write_text(text))


def plot(results: dict, out: Path, setting: str) -> None:
    import matplotlib  # optional: only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 4.0), dpi=90)
    for (name, (losses, validation, _)), color in zip(results.items(), ("C0", "C1", "C2", "C3")):
        window = min(20, len(losses))
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(np.arange(window, len(losses) + 1), smooth, color=color, linewidth=1.5,
                label=f"{name}: validation {validation:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss ({min(20, len(losses))}-step mean, nats/byte)")
    ax.set_title(setting, fontsize=7)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png"))


if __name__ == "__main__":
    main()
