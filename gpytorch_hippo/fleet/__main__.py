"""``python -m gpytorch_hippo.fleet --out DIR``: the fleet demo (:mod:`gpytorch_hippo.fleet.demo`)."""

from .demo import main

if __name__ == "__main__":
    main()
