"""The service runs over every log store: reuse the log contract's store fixtures."""

from tests.log.conftest import durable_store_factory, store, store_factory

__all__ = ["durable_store_factory", "store", "store_factory"]
