"""The load stage: a verified entry into this process.

Owns: ``loader`` (dlopen, schemas, the per-process memo; ``load_library``, ``get_op``), ``ops`` (the
callable ``Op``), ``functionalize`` (in-place and ``out=`` ops inside ``torch.compile``).

May import: ``jitops.build`` (``ensure_entry``), ``jitops.plan``, ``jitops.store``, ``jitops.key``,
``jitops.spec``, ``jitops.base``, ``jitops.errors``.
"""
