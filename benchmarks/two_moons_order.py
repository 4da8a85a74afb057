"""The random input order on two moons (thesis §4.4, Fig. 4.2, OHSVGP-rand), with the k-max and k-min orders.

The set-up of ``tests/hippo/test_continual.py`` (run R4.1, whose run it reuses): make_moons (noise 0.1) in
3 tasks split by the first coordinate, 240 training and 600 test points, OHSVGP with 20 LegS inducing
variables on the ordered input path (500 random features), Bernoulli likelihood, 200 Adam steps per task,
kernel trained on task 1 only.  Printed: held-out accuracy on each task after task 3, per data seed.

    python benchmarks/two_moons_order.py [--seeds 0,1,2]
"""

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "hippo"))
from test_continual import moons_tasks, run_ohsvgp  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="data seeds (training data; test data seed + 100)")
    parser.add_argument("--criteria", default="random,kernel_max,kernel_min")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| order | data seed | task 1 | task 2 | task 3 |")
    print("| --- | --- | --- | --- | --- |")
    for seed in (int(s) for s in args.seeds.split(",")):
        train, test = moons_tasks(240, seed=seed), moons_tasks(600, seed=seed + 100)
        for criterion in args.criteria.split(","):
            final = run_ohsvgp(criterion, train, test)[-1]
            print(f"| {criterion} | {seed} | " + " | ".join(f"{100 * a:.1f} %" for a in final) + " |", flush=True)


if __name__ == "__main__":
    main()
