"""Quickstart: get jitops's softmax, check it against torch, show the cache.

The first run compiles the op for this machine (a few seconds) and caches it;
every later run, in any process, loads it from the cache in milliseconds.
"""

import logging
import time

import torch

import jitops

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

start = time.perf_counter()
softmax = jitops.get("softmax")
print(f"jitops.get('softmax') took {time.perf_counter() - start:.3f}s -> {softmax!r}")

x = torch.randn(64, 1000)
y = softmax(x, dim=-1)
torch.testing.assert_close(y, torch.softmax(x, dim=-1))
print("matches torch.softmax:", True)

x = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
print("gradcheck:", torch.autograd.gradcheck(lambda t: softmax(t, 1), (x,)))

compiled = torch.compile(lambda t: softmax(t * 2, dim=0), fullgraph=True)
t = torch.randn(16, 16)
torch.testing.assert_close(compiled(t), torch.softmax(t * 2, dim=0))
print("torch.compile(fullgraph=True) matches eager:", True)
print("ops:", ", ".join(jitops.list_ops()))
