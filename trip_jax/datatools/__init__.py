"""Side tools for the TRIP data: download, Table-1 statistics, the TFDS builder, spaCy entity scores."""
