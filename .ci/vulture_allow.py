"""Names that vulture (CI's dead-code check: `vulture jitops .ci/vulture_allow.py`) would call
unused, and why each stays. Vulture reads this file; nothing runs it."""
# ruff: noqa: F821, B018

# required by a signature jitops does not choose
keep_intermediates  # a parameter of torch's load / load_inline, accepted by the drop-in
frame  # a signal handler's second argument
exc  # the context manager protocol's __exit__(exc_type, exc, tb)
__getattr__, __dir__  # module-level protocol (PEP 562): jitops, jitops.loader import lazily
__annotations__, _field_type  # what dataclasses read on a class @record builds
external_attr, compress_type  # zipfile.ZipInfo's fields, read by zipfile when a bundle is written
_torchdynamo_disable  # read by torch.compile: the drop-in's functions are not traced
# used by name from elsewhere
child_main  # the background PCH child's entry point, called from its `python -c` string
# public records' fields and properties: users read them (jitops.cache, jitops.distributed)
damaged, freed, built_by, builds
forget  # bundles: the test suite's reset of what was discovered in this process
