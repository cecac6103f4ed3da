"""TRIP data: schema, readers, features, batching, layouts, input pipeline, entity extraction."""
