"""Optional dependencies: an import that fails names the probseq extra that installs the package.

The core install (``pip install probseq``) holds what the models need; data sets, figures and the
pseudo-video models need extras (``pip install "probseq[data]"``, ``"probseq[plots]"``,
``"probseq[video]"``, or ``"probseq[all]"``).
"""

from __future__ import annotations

from types import ModuleType


def missing(package: str, extra: str, what: str) -> ModuleNotFoundError:
    """The error for ``what`` when the optional ``package`` (a distribution name) cannot be imported:
    it names the package and the extra that installs it."""
    return ModuleNotFoundError(
        f"{what} needs the '{package}' package, which a core install of probseq leaves out: "
        f'pip install "probseq[{extra}]" (or pip install {package})',
        name=package,
    )


def require(module: str, extra: str, what: str, package: str | None = None) -> ModuleType:
    """Import and return ``module`` (dotted name); if that fails, raise :func:`missing` naming
    ``package`` (default: the module's top-level name) and ``extra``."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as error:
        raise missing(package or module.split(".")[0], extra, what) from error
