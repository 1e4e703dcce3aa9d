"""The front doors behind ``jitops.load``, ``jitops.load_inline``, ``register_kernel_dir`` and ``warm``.

Owns: ``dropin`` (torch.utils.cpp_extension's ``load`` / ``load_inline`` parameters), ``cpp_ext_style``
(sources written for cpp_extension), ``user`` (jitops-style user libraries), ``warm`` (many entries
ahead of time). ``jitops/__init__.py`` exports them.

May import: ``jitops.loading`` and everything below it (``jitops.registry`` included).
"""
