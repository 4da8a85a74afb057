"""Inducing variables: objects that know their own covariances (see DESIGN.md, "Architecture")."""

from .base import InducingVariables
from .points import InducingPoints

__all__ = ["InducingVariables", "InducingPoints"]
