"""Loss and accuracy curves of a training run, as PNG files next to the checkpoint."""
from __future__ import annotations

from pathlib import Path

SMOOTHING = 20


def write_plots(history: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    steps = [r["step"] for r in history if "loss" in r]
    evals = [r for r in history if "heldout_exact" in r]
    paths = []
    figure, axis = pyplot.subplots(figsize=(7, 4))
    for key, label in (("loss", "next token"), ("mtp_loss", "MTP (token after next)")):
        axis.plot(steps, _smooth([r[key] for r in history if "loss" in r]), label=label)
    axis.set(xlabel="step", ylabel="cross-entropy (assistant tokens)", yscale="log",
             title="Training loss")
    axis.legend()
    paths.append(_save(figure, out_dir / "loss.png"))
    figure, axis = pyplot.subplots(figsize=(7, 4))
    for key, label in (("token_accuracy", "train token accuracy"),
                       ("mtp_accuracy", "train MTP accuracy")):
        axis.plot(steps, _smooth([r[key] for r in history if "loss" in r]), label=label)
    if evals:
        axis.plot([r["step"] for r in evals], [r["heldout_exact"] for r in evals], "o-",
                  label="held-out exact completions")
    axis.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title="Accuracy")
    axis.legend(loc="lower right")
    paths.append(_save(figure, out_dir / "accuracy.png"))
    return paths


def _smooth(values: list[float]) -> list[float]:
    out, window = [], []
    for value in values:
        window = (window + [value])[-SMOOTHING:]
        out.append(sum(window) / len(window))
    return out


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    from matplotlib import pyplot

    pyplot.close(figure)
    return path
