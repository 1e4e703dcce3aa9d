// Source of the test-only libraries in tests/fakelib. The fake builder does
// not compile this file; it is here because a spec's sources are part of its
// cache key. Editing it changes the key of fakeadd and fakemul.
int jitops_fakelib_marker = 1;
