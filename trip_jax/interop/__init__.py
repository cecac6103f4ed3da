"""What crosses the project's edge: the TRIP authors' saved models (``convert``)."""
