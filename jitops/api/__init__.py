"""Subpackage ``jitops.api`` (stage 13): the front doors behind ``jitops.load``, ``jitops.load_inline``,
``register_kernel_dir`` and ``warm``.

Owns: ``dropin`` (torch.utils.cpp_extension's ``load`` / ``load_inline`` parameters), ``cpp_ext_style``
(sources written for cpp_extension), ``user`` (jitops-style user libraries), ``warm`` (many entries ahead of
time).

Public names (from their modules): ``dropin.load`` / ``load_inline``, ``user.register_kernel_dir`` /
``UserLibrary`` (``jitops/__init__.py`` exports these four, on first use); ``warm.warm`` (``jitops warm``).

May import (tests/test_layout.py): ``jitops.loading`` and every stage below it (build, remote, plan, store, key,
target, registry, kernels, spec, base, errors, _version).
"""
