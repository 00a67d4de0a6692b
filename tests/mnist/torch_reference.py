"""PyTorch's side of torch_reference_test.cc: the MNIST example Net (examples/python/mnist_ddp.py)
with cpprun-mnist's parameters, its forward pass, autograd gradients, and torch's optimizers.

Usage: torch_reference.py DIR BATCH. Reads DIR/params.f32 (the flat parameters in the Net's
parameter order), DIR/x.f32 (BATCH x 1 x 28 x 28) and DIR/labels.u8; writes DIR/logits.f32,
DIR/loss.txt, DIR/grads.f32 and, after 3 steps of each optimizer with those gradients,
DIR/adadelta.f32, DIR/sgd.f32 and DIR/adamw.f32.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

# The Net of examples/python/mnist_ddp.py: pytorch/examples' MNIST network, defined once.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "python"))
from mnist_ddp import Net  # noqa: E402


def load_flat(net, flat):
    at = 0
    with torch.no_grad():
        for p in net.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(flat[at:at + n]).view_as(p))
            at += n
    assert at == flat.size, (at, flat.size)


def flat_of(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy().astype(np.float32)


def main():
    out, batch = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    params = np.fromfile(f"{out}/params.f32", dtype=np.float32)
    x = torch.from_numpy(np.fromfile(f"{out}/x.f32", dtype=np.float32).reshape(batch, 1, 28, 28))
    labels = torch.from_numpy(np.fromfile(f"{out}/labels.u8", dtype=np.uint8).astype(np.int64))

    net = Net().eval()  # no dropout: masks are the one thing drawn differently
    load_flat(net, params)
    logits = net(x)
    loss = F.nll_loss(logits, labels)
    loss.backward()
    logits.detach().numpy().astype(np.float32).tofile(f"{out}/logits.f32")
    with open(f"{out}/loss.txt", "w") as f:
        f.write(repr(loss.item()))
    grads = [p.grad.clone() for p in net.parameters()]
    flat_of(grads).tofile(f"{out}/grads.f32")

    for name, make in [("adadelta", lambda ps: torch.optim.Adadelta(ps, lr=1.0)),
                       ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)),
                       ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3))]:
        load_flat(net, params)
        ps = list(net.parameters())
        opt = make(ps)
        for _ in range(3):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opt.step()
        flat_of(ps).tofile(f"{out}/{name}.f32")
    print("REFERENCE OK")


if __name__ == "__main__":
    main()
