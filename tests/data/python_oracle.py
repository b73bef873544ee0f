#!/usr/bin/env python3
"""EPL's data sources against readers written here with Python's gzip module and numpy.

1. Fashion-MNIST (Debian's dataset-fashion-mnist): every pixel (as float32 byte / 255) and
   every label of both files of each pair, with the test pair as validation; and without
   it, validation as the last 10% of the training files.
2. Token windows of a random uint16 file: each window's input and next-token targets.

Usage: python_oracle.py EPL_DATA_TOOL
"""
import gzip
import os
import subprocess
import sys
import tempfile

import numpy as np

FASHION = "/usr/share/datasets/fashion-mnist/"


def idx_images(path):
    raw = gzip.open(path).read()
    assert int.from_bytes(raw[:4], "big") == 0x803
    n, rows, cols = (int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
    return np.frombuffer(raw, np.uint8, offset=16).reshape(n, rows * cols)


def idx_labels(path):
    raw = gzip.open(path).read()
    assert int.from_bytes(raw[:4], "big") == 0x801
    return np.frombuffer(raw, np.uint8, offset=8).astype(np.int32)


def run(tool, *args):
    out = subprocess.run([tool, *args], check=True, capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def check_fashion(tool, folder):
    files = {k: FASHION + f for k, f in [
        ("images", "train-images-idx3-ubyte.gz"), ("labels", "train-labels-idx1-ubyte.gz"),
        ("test_images", "t10k-images-idx3-ubyte.gz"), ("test_labels", "t10k-labels-idx1-ubyte.gz")]}
    train_x, train_y = idx_images(files["images"]), idx_labels(files["labels"])
    test_x, test_y = idx_images(files["test_images"]), idx_labels(files["test_labels"])
    out = os.path.join(folder, "fashion")

    def compare(split, pair, want_x, want_y, want_sizes):
        sizes = run(tool, "idx", out, split, "784", *pair)
        assert sizes[:2] == want_sizes, sizes
        got_x = np.fromfile(out + ".f32", np.float32).reshape(-1, 784)
        got_y = np.fromfile(out + ".i32", np.int32)
        want = want_x.astype(np.float32) / np.float32(255)
        assert got_x.shape == want.shape, (got_x.shape, want.shape)
        assert np.array_equal(got_x, want), f"{split}: pixels differ"
        assert np.array_equal(got_y, want_y), f"{split}: labels differ"
        print(f"fashion-mnist {split} ({len(pair) // 2} pairs): {len(got_y)} samples match")

    both = [files[k] for k in ("images", "labels", "test_images", "test_labels")]
    compare("train", both, train_x, train_y, [60000, 10000])
    compare("validation", both, test_x, test_y, [60000, 10000])
    one = both[:2]
    compare("train", one, train_x[:54000], train_y[:54000], [54000, 6000])
    compare("validation", one, train_x[54000:], train_y[54000:], [54000, 6000])


def check_tokens(tool, folder):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 65536, size=10007, dtype=np.uint16)
    path = os.path.join(folder, "corpus.bin")
    tokens.astype("<u2").tofile(path)
    seq, val_fraction = 64, 0.1
    n_val = int(len(tokens) * val_fraction)
    parts = {"train": tokens[:len(tokens) - n_val], "validation": tokens[len(tokens) - n_val:]}
    out = os.path.join(folder, "tokens")
    for split, part in parts.items():
        sizes = run(tool, "tokens", out, split, path, str(seq), str(val_fraction))
        windows = (len(part) - 1) // seq
        assert sizes == [(len(parts["train"]) - 1) // seq, (n_val - 1) // seq, int(tokens.max())]
        got_in = np.fromfile(out + ".in.i32", np.int32).reshape(-1, seq)
        got_next = np.fromfile(out + ".next.i32", np.int32).reshape(-1, seq)
        starts = np.arange(windows) * seq
        want_in = np.stack([part[s:s + seq] for s in starts]).astype(np.int32)
        want_next = np.stack([part[s + 1:s + seq + 1] for s in starts]).astype(np.int32)
        assert np.array_equal(got_in, want_in), f"{split}: inputs differ"
        assert np.array_equal(got_next, want_next), f"{split}: next tokens differ"
        print(f"tokens {split}: {windows} windows of {seq} + 1 match")


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="epl-data-") as folder:
        check_tokens(tool, folder)
        if not os.path.exists(FASHION + "train-images-idx3-ubyte.gz"):
            sys.exit(f"error: {FASHION} is missing: tools/setup.sh installs dataset-fashion-mnist")
        check_fashion(tool, folder)


if __name__ == "__main__":
    main()
