"""A small, real training job: softmax regression on scikit-learn's bundled digits.

Shows the whole trial contract of autoresearch:
* config from arguments (--lr, --epochs, --seed);
* metrics through `autoresearch.report` (stdlib only) and a karpathy-style summary block;
* checkpoints in $AUTORESEARCH_CHECKPOINT_DIR, resumed on the next attempt;
* a clean stop on SIGTERM within the grace period (preemption, cancel, timeout).
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import sys
import time

import numpy as np
from sklearn.datasets import load_digits

from autoresearch import report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    digits = load_digits()
    x = digits.data / 16.0
    y = digits.target
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(x))
    split = int(0.8 * len(x))
    train, val = order[:split], order[split:]
    onehot = np.eye(10)[y]

    ckpt_dir = os.environ.get("AUTORESEARCH_CHECKPOINT_DIR")
    ckpt = os.path.join(ckpt_dir, "model.pkl") if ckpt_dir else None
    state = {"epoch": 0, "w": np.zeros((64, 10)), "b": np.zeros(10)}
    if ckpt and os.path.exists(ckpt):
        with open(ckpt, "rb") as f:
            state = pickle.load(f)
        print(f"resumed from epoch {state['epoch']}")

    def save(*_: object) -> None:
        if ckpt:
            with open(ckpt + ".tmp", "wb") as f:
                pickle.dump(state, f)
            os.replace(ckpt + ".tmp", ckpt)
        print(f"stopping at epoch {state['epoch']} (checkpoint saved: {bool(ckpt)})")
        sys.exit(0)

    signal.signal(signal.SIGTERM, save)
    t0 = time.time()
    w, b = state["w"], state["b"]
    val_loss = val_acc = float("nan")
    for epoch in range(state["epoch"], args.epochs):
        for batch in np.array_split(rng.permutation(train), 12):
            logits = x[batch] @ w + b
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            grad = (p - onehot[batch]) / len(batch)
            w -= args.lr * x[batch].T @ grad
            b -= args.lr * grad.sum(0)
        logits = x[val] @ w + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        val_loss = float(-np.log(p[np.arange(len(val)), y[val]] + 1e-12).mean())
        val_acc = float((p.argmax(1) == y[val]).mean())
        state.update(epoch=epoch + 1, w=w, b=b)
        report(step=epoch, val_loss=val_loss, val_acc=val_acc)
        print(f"epoch {epoch:3d} | val_loss {val_loss:.4f} | val_acc {val_acc:.3f}", flush=True)
    print("---")
    print(f"val_loss:         {val_loss:.6f}")
    print(f"val_acc:          {val_acc:.6f}")
    print(f"training_seconds: {time.time() - t0:.1f}")


if __name__ == "__main__":
    main()
