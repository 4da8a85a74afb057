"""Online-learning baselines of thesis §4.6: how each method places its inducing variables per task.

Every method is the one shared :class:`~gpytorch_hippo.online.OnlineSGPR` (or
:class:`~gpytorch_hippo.online.OnlineELBO`) with a different :class:`InducingSchedule`:

* :class:`RandomPointsSchedule` -- OSGPR (Bui et al. 2017): points re-drawn from the old points
  and the new inputs, then optimised on the online bound (``num_iter > 0``), or kept fixed
  (``osgpr-fixed``);
* :class:`PivotedCholeskySchedule` -- OVC (Maddox et al. 2021): points chosen by greedy pivoted
  Cholesky over the old points and the new inputs, fixed (OVC) or optimised (OVC-optZ);
* :class:`HiPPOSchedule` -- OHSGPR: HiPPO variables advanced to the end of each task;
* :class:`FourierSchedule` -- OVFF: variational Fourier features on one interval for the stream.
"""

from ..inducing.fourier import FourierInducingVariables
from .schedules import (
    FourierSchedule,
    HiPPOSchedule,
    InducingSchedule,
    PivotedCholeskySchedule,
    RandomPointsSchedule,
    learn_task,
)

__all__ = [
    "InducingSchedule",
    "RandomPointsSchedule",
    "PivotedCholeskySchedule",
    "HiPPOSchedule",
    "FourierSchedule",
    "FourierInducingVariables",
    "learn_task",
]
