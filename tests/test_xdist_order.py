"""CI's file order under ``--dist loadfile`` (tests/xdist_order.py): the long files go out first."""

from __future__ import annotations

from types import SimpleNamespace

from tests.helpers import REPO
from tests.xdist_order import LONG_FILES, LongFilesFirst


class _Worker:
    """A stand-in for xdist's worker controller: records the test indices it is sent."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_long_files_exist() -> None:
    """A renamed file would silently lose its place at the front."""
    assert [p for p in LONG_FILES if not (REPO / p).is_file()] == []


def test_long_files_go_out_first_in_their_order_and_every_file_runs_whole_once() -> None:
    # Short files with many tests, which xdist alone hands out first (it orders by test count).
    counts = {"tests/test_many.py": 9, "tests/test_more.py": 7, "tests/test_some.py": 5}
    counts |= {path: 1 + i % 2 for i, path in enumerate(LONG_FILES)}
    collection = [f"{path}::test_{i}" for path, n in counts.items() for i in range(n)]
    config = SimpleNamespace(
        getvalue=lambda name: {"tx": ["2*popen"]}[name],
        option=SimpleNamespace(loadscopereorder=True),
    )
    sched = LongFilesFirst(config)  # type: ignore[arg-type]
    workers = [_Worker("gw0"), _Worker("gw1")]
    for w in workers:
        sched.add_node(w)  # type: ignore[arg-type]
        sched.add_node_collection(w, collection)  # type: ignore[arg-type]
    sched.schedule()
    # the first file each worker starts: the two longest
    assert [collection[w.sent[0]].split("::")[0] for w in workers] == list(LONG_FILES[:2])

    done: dict[_Worker, int] = {w: 0 for w in workers}
    while any(done[w] < len(w.sent) for w in workers):  # each worker finishes its tests in turn
        for w in workers:
            if done[w] < len(w.sent):
                sched.mark_test_complete(w, w.sent[done[w]])  # type: ignore[arg-type]
                done[w] += 1
    assert sched.tests_finished
    sent = [i for w in workers for i in w.sent]
    assert sorted(sent) == list(range(len(collection)))  # every test, once
    files = [{collection[i].split("::")[0] for i in w.sent} for w in workers]
    assert files[0].isdisjoint(files[1])  # a file runs whole on one worker
    # the long files come before every short file on whichever worker ran them
    for w in workers:
        order = list(dict.fromkeys(collection[i].split("::")[0] for i in w.sent))
        longs = [p for p in order if p in LONG_FILES]
        assert order[: len(longs)] == longs and longs == sorted(longs, key=LONG_FILES.index)
