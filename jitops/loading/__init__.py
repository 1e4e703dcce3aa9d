"""Subpackage ``jitops.loading`` (stage 12): a verified entry into this process.

Owns: ``loader`` (dlopen, schemas, the per-process memo), ``ops`` (the callable ``Op``), ``functionalize``
(in-place and ``out=`` ops inside ``torch.compile``).

Public names (from their modules): ``loader.get`` / ``reference`` / ``load_library``; ``ops.Op`` / ``ScalarOp``.

May import (tests/test_layout.py): ``jitops.build`` (``entry.ensure_entry``) and every stage below it (remote,
plan, store, key, target, registry, kernels, spec, base, errors, _version).
"""
