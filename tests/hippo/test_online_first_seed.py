"""``--first-seed K`` of the online runner: seeds K..K+N-1, each the same rows as that seed of ``--seeds``."""

import pytest

from experiments.hippo import online


def _without_time(rows, seed):
    return [{k: v for k, v in r.items() if k != "cum_time_s"} for r in rows if r["seed"] == seed]


@pytest.mark.parametrize(
    "dataset, methods, extra",
    [
        ("irradiance", "ohsgpr,osgpr", []),  # collapsed OnlineSGPR path: split_tasks + inducing-point init by seed
        ("diabetes", "ohsvgp-k,osvgp", ["--split", "l2"]),  # OnlineELBO path (multidimensional inputs; scikit-learn data)
    ],
)
def test_first_seed_reproduces_the_rows_of_that_seed_index(tmp_path, dataset, methods, extra):
    common = ["--quick", "--quiet", "--dataset", dataset, "--methods", methods, "--num-inducing", "8", *extra]
    both = online.main(common + ["--seeds", "2", "--out", str(tmp_path / "both")])
    second = online.main(common + ["--first-seed", "1", "--seeds", "1", "--out", str(tmp_path / "second")])
    assert {r["seed"] for r in both} == {0, 1} and {r["seed"] for r in second} == {1}
    assert _without_time(second, 1) == _without_time(both, 1)
    # and seed 1 is not seed 0 (the seed value drives the split and the init)
    assert [r["nlpd"] for r in _without_time(both, 0)] != [r["nlpd"] for r in _without_time(both, 1)]


def test_first_seed_defaults_to_zero_and_refuses_negative(tmp_path):
    rows = online.main(["--quick", "--quiet", "--methods", "ohsgpr", "--num-inducing", "6", "--out", str(tmp_path)])
    assert {r["seed"] for r in rows} == {0}
    with pytest.raises(SystemExit):
        online.main(["--quick", "--quiet", "--first-seed", "-1", "--out", str(tmp_path)])
