"""TRIP data: readers, features, batching, TFDS builder and entity extraction."""
