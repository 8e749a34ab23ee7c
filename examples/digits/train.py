"""A real, small model: a one-hidden-layer MLP on scikit-learn's bundled digits (8x8 images).

Reports train_loss, val_loss and val_acc every epoch with ``autoresearch.report``
(so the loop can stop a poor trial early) and ends with a karpathy-style summary
block. Runs standalone too: ``python train.py --lr 0.01 --hidden 64``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import warnings

import numpy as np
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import accuracy_score, log_loss
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

from autoresearch import report


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--alpha", type=float, default=1e-4, help="L2 penalty")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="weight init and shuffling (the split is fixed)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped early: exit at once

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)
    model = MLPClassifier(hidden_layer_sizes=(args.hidden,), learning_rate_init=args.lr, alpha=args.alpha,
                          batch_size=args.batch, random_state=args.seed)
    classes = np.arange(10)
    rng = np.random.default_rng(args.seed)
    start = time.time()
    val_loss = val_acc = float("nan")
    warnings.simplefilter("ignore", ConvergenceWarning)
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        model.partial_fit(x_train[order], y_train[order], classes=classes)
        proba = model.predict_proba(x_val)
        val_loss = float(log_loss(y_val, proba, labels=classes))
        val_acc = float(accuracy_score(y_val, proba.argmax(axis=1)))
        report(step=epoch, train_loss=float(model.loss_), val_loss=val_loss, val_acc=val_acc)
    print("---")
    print(f"val_loss:          {val_loss:.6f}")
    print(f"val_acc:           {val_acc:.6f}")
    print(f"training_seconds:  {time.time() - start:.2f}")
    print(f"num_params_K:      {(64 * args.hidden + args.hidden + args.hidden * 10 + 10) / 1000:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
