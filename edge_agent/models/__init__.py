"""The model store: a catalog of known models and a verified on-disk cache."""

from edge_agent.models.catalog import Catalog, CatalogEntry, ModelFile, load_catalog
from edge_agent.models.store import ModelFiles, ModelStore

__all__ = ["Catalog", "CatalogEntry", "ModelFile", "ModelFiles", "ModelStore", "load_catalog"]
