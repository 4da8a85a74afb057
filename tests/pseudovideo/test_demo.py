from experiments.pseudovideo.demo import main


def test_demo_writes_the_videos_and_the_theorem_table(tmp_path, capsys):
    rows = main(["--dataset", "digits", "--out", str(tmp_path)])
    assert (tmp_path / "pseudo_videos.png").stat().st_size > 1000
    first = [gain for method, _, _, _, gain in rows if method == "markov_first"]
    high = [gain for method, _, _, _, gain in rows if method == "markov_high"]
    assert max(abs(g) for g in first) < 1e-9 and high[-1] > high[1] > 0
    assert "Theorem 5.4.1" in capsys.readouterr().out
