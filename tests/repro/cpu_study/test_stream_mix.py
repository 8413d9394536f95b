"""scripts/stream_mix.py: each source's share of the trainer's training stream, window by window."""

import gzip
import json

from repro.cpu_study import stream_mix


def write_mirror(root, docs):
    (root / "en").mkdir(parents=True)
    for split, rows in (("train", docs), ("validation", docs[:1])):
        with gzip.open(root / "en" / f"c4-{split}.00000-of-00001.json.gz", "wt") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


def test_shares_follow_the_stream_order(tmp_path):
    def doc(host, i):
        return {"text": f"{host} document {i} " + "word " * 7, "url": f"https://{host}/{i}.html"}

    # unshuffled (buffer 0): three 10-word documents from a.org, then three from b.org
    write_mirror(
        tmp_path, [doc("a.org", i) for i in range(3)] + [doc("b.org", i) for i in range(3)]
    )
    shares = stream_mix.window_shares(
        tmp_path, seed=0, shuffle_buffer=0, window_words=20, windows=3
    )
    assert shares == [{"a.org": 1.0}, {"a.org": 0.5, "b.org": 0.5}, {"b.org": 1.0}]


def test_prints_a_table_per_window(tmp_path, capsys):
    write_mirror(tmp_path, [{"text": "one two three four", "url": ""}] * 4)
    assert stream_mix.main([str(tmp_path), "--window-words", "8", "--shuffle-buffer", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["window", "unknown"]
    assert [line.split() for line in lines[1:]] == [["0", "1.00"], ["1", "1.00"]]
