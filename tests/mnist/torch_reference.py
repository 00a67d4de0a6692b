"""PyTorch's side of torch_reference_test.cc: the MNIST example Net (as in pytorch/examples)
with cpprun-mnist's parameters, its forward pass, autograd gradients, and torch's optimizers.

Usage: torch_reference.py DIR BATCH. Reads DIR/params.f32 (the flat parameters in the Net's
parameter order), DIR/x.f32 (BATCH x 1 x 28 x 28) and DIR/labels.u8; writes DIR/logits.f32,
DIR/loss.txt, DIR/grads.f32 and, after 3 steps of each optimizer with those gradients,
DIR/adadelta.f32, DIR/sgd.f32 and DIR/adamw.f32.
"""
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


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
